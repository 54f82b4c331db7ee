//! `mpirun -np 4 trainer` with the MPI backend (4 CPU processes as 2 nodes x 2) against the
//! `local` backend's threads, and a dead or hung process ending the job. Needs OpenMPI's
//! `mpirun` and the `mpi` feature: `cargo test --release -p trainer --features mpi --test mpi`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

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

fn losses(dir: &Path) -> Vec<f64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
        .collect()
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
