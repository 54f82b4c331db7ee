//! `mpirun -np 4 trainer` with the MPI backend (4 CPU processes as 2 nodes x 2) against the
//! `local` backend's threads, and a dead or hung process ending the job. Needs OpenMPI's
//! `mpirun` and the `mpi` feature: `cargo test --release -p trainer --features mpi --test mpi`.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::repo;

/// A small model on the bundled corpus, 4 ranks as 2 nodes x 2, logging every step.
fn sets(dir: &Path, zeropp: bool) -> Vec<String> {
    let mut s: Vec<String> = [
        "model.n_layer=2",
        "model.n_embd=32",
        "model.n_head=2",
        "model.seq_len=32",
        "train.micro_batch=2",
        "train.global_batch=8",
        "train.steps=8",
        "train.warmup_steps=2",
        "dist.world_size=4",
        "dist.gpus_per_node=2",
        "log.interval=1",
        "log.eval_interval=0",
        "log.eval_samples=0",
        "log.progress=false",
        "checkpoint.interval=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    s.push(format!("log.dir={:?}", dir.to_str().unwrap()));
    if zeropp {
        s.extend(
            [
                "zero.quantized_weights=true",
                "zero.hpz_partition_size=2",
                "zero.quantized_gradients=true",
                "zero.weight_quant_block=64",
                "zero.grad_quant_block=32",
            ]
            .map(String::from),
        );
    }
    s
}

fn trainer_args(sets: &[String]) -> Vec<String> {
    let mut a = vec!["--config".to_string(), "configs/tiny.toml".to_string()];
    for s in sets {
        a.push("--set".into());
        a.push(s.clone());
    }
    a
}

fn local(sets: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainer"))
        .current_dir(repo())
        .args(trainer_args(sets))
        .output()
        .unwrap()
}

/// `mpirun -np 4 trainer ...` with the MPI backend; `env` is passed to every rank.
fn mpirun(sets: &[String], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new("mpirun");
    c.current_dir(repo())
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"]);
    for (k, v) in env {
        c.env(k, v).args(["-x", k]);
    }
    c.arg(env!("CARGO_BIN_EXE_trainer"))
        .args(trainer_args(sets))
        .args(["--set", "dist.backend=\"mpi\""]);
    c.output().expect("mpirun (OpenMPI) on the PATH")
}

fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The loss of every training line of the run in `dir`, in order.
fn losses(dir: &Path) -> Vec<f64> {
    common::losses(dir).into_iter().map(|(_, l)| l).collect()
}

fn same_curve(zeropp: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("local"), tmp.path().join("mpi"));
    assert_ok(&local(&sets(&a, zeropp)), "local backend");
    assert_ok(&mpirun(&sets(&b, zeropp), &[]), "mpirun");
    let (la, lb) = (losses(&a), losses(&b));
    assert_eq!(la.len(), 8);
    assert_eq!(la.len(), lb.len());
    for (step, (x, y)) in la.iter().zip(&lb).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs(),
            "step {}: local {x} mpi {y}",
            step + 1
        );
    }
}

#[test]
fn mpirun_reproduces_the_local_zero3_curve() {
    same_curve(false);
}

#[test]
fn mpirun_reproduces_the_local_zeropp_curve() {
    same_curve(true);
}

/// One of the 4 processes is killed (SIGKILL) or hangs at step 3: the job ends non-zero within
/// `dist.timeout_s` (10 s here), with a line saying what happened.
#[test]
fn a_dead_or_hung_process_ends_the_job() {
    for hook in ["ZEROPP_KILL_RANK", "ZEROPP_HANG_RANK"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = sets(&tmp.path().join("run"), false);
        s.push("dist.timeout_s=10".into());
        let start = Instant::now();
        let out = mpirun(&s, &[(hook, "2@3")]);
        let took = start.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{hook}: the job must fail");
        assert!(took < Duration::from_secs(40), "{hook}: took {took:?}");
        match hook {
            "ZEROPP_HANG_RANK" => assert!(
                stderr.contains("waited") && stderr.contains("aborting"),
                "{hook}: {stderr}"
            ),
            _ => assert!(
                stderr.contains("signal") || stderr.contains("exited") || stderr.contains("killed"),
                "{hook}: {stderr}"
            ),
        }
    }
}

/// SIGUSR1 to mpirun (slurm's `--signal=USR1@120` reaches every task the same way): OpenMPI
/// forwards it to the 4 processes, which agree on a step, write its checkpoint and exit 75;
/// `mpirun` again resumes, and the curve is the local backend's.
#[test]
fn sigusr1_stops_every_process_after_one_step_and_the_resume_is_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let (straight, run) = (tmp.path().join("local"), tmp.path().join("mpi"));
    let mut s = sets(&run, false);
    s.push("train.steps=12".into());
    s.push("checkpoint.resume=true".into());
    let mut local_sets = sets(&straight, false);
    local_sets.push("train.steps=12".into());
    assert_ok(&local(&local_sets), "local backend");

    let mut c = Command::new("mpirun");
    c.current_dir(repo())
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .env("ZEROPP_STEP_DELAY_MS", "200")
        .args(["-x", "ZEROPP_STEP_DELAY_MS"])
        .arg(env!("CARGO_BIN_EXE_trainer"))
        .args(trainer_args(&s))
        .args(["--set", "dist.backend=\"mpi\""])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("mpirun (OpenMPI) on the PATH");
    let start = Instant::now();
    while losses_if_any(&run).len() < 3 {
        assert!(child.try_wait().unwrap().is_none(), "mpirun ended early");
        assert!(start.elapsed() < Duration::from_secs(120), "no step 3");
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = Command::new("kill")
        .args(["-USR1", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(stderr.contains("stopped by SIGUSR1 after step"), "{stderr}");
    let stopped_at = losses(&run).len();
    assert!((3..12).contains(&stopped_at), "{stderr}");

    assert_ok(&mpirun(&s, &[]), "mpirun resume");
    let (la, lb) = (losses(&straight), losses(&run));
    assert_eq!(la.len(), lb.len());
    for (step, (x, y)) in la.iter().zip(&lb).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs(),
            "step {}: local {x} mpi {y}",
            step + 1
        );
    }
}

/// The losses logged so far (none while the file does not exist yet).
fn losses_if_any(dir: &Path) -> Vec<f64> {
    match dir.join("metrics.jsonl").exists() {
        true => losses(dir),
        false => Vec::new(),
    }
}
