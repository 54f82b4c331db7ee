//! What a run checks before its first step (issue 24): any world size with the default
//! evaluation, writable outputs, memory at hand, and errors that name the key or the `--set`
//! that caused them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{
    assert_ok, command, error_line, run_with, small_corpus, small_model_run, stderr, trainer,
    val_losses,
};

/// A small model over `world` ranks (one node), every output in `run`; `eval_samples`
/// validation sequences.
fn small_run(run: &Path, train: &Path, world: usize, eval_samples: usize) -> Vec<String> {
    let mut sets = small_model_run(run, train);
    sets.extend([
        "train.micro_batch=1".into(),
        format!("train.global_batch={}", 12),
        format!("dist.world_size={world}"),
        format!("dist.gpus_per_node={world}"),
        "train.steps=2".into(),
        format!("log.eval_samples={eval_samples}"),
    ]);
    sets
}

/// The command: 128 ranks on 8 nodes with tiny.toml's 64 evaluation samples (fewer than
/// the ranks) trains its step and evaluates the same 64 sequences as 4 ranks do.
#[test]
fn a_world_of_128_ranks_trains_with_the_default_evaluation() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("w128");
    let out = trainer()
        .args(["--config", "configs/tiny.toml"])
        .args([
            "--set",
            "dist.world_size=128",
            "--set",
            "dist.gpus_per_node=16",
        ])
        .args([
            "--set",
            "train.global_batch=128",
            "--set",
            "train.micro_batch=1",
        ])
        .args(["--set", "train.steps=1", "--set", "log.progress=false"])
        .args(["--set", &format!("log.dir={:?}", big.to_str().unwrap())])
        .output()
        .unwrap();
    assert_ok(&out);
    let evals = val_losses(&big);
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 1]);
    // Step 0's weights are the same for every world: 4 ranks see the same validation loss.
    let small = dir.path().join("w4");
    let out = trainer()
        .args(["--config", "configs/tiny.toml", "--set", "train.steps=1"])
        .args(["--set", "log.progress=false"])
        .args(["--set", &format!("log.dir={:?}", small.to_str().unwrap())])
        .output()
        .unwrap();
    assert_ok(&out);
    let (w128, w4) = (evals[0].1, val_losses(&small)[0].1);
    assert!((w128 - w4).abs() < 1e-4 * w4, "{w128} vs {w4}");
}

/// With fewer validation sequences than a multiple of the ranks, every sequence counts once:
/// 3 ranks and 1 rank give the same validation loss over 5 sequences (the mean is over the
/// sequences, not over the ranks, and the padding passes of the ranks short of one count
/// nothing).
#[test]
fn evaluation_counts_every_sequence_once_whatever_the_world() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let mut losses = Vec::new();
    for world in [1, 3, 6] {
        let run = dir.path().join(format!("w{world}"));
        assert_ok(&run_with(&small_run(&run, &corpus, world, 5), &[]));
        losses.push(val_losses(&run)[0].1);
    }
    for l in &losses[1..] {
        assert!((l - losses[0]).abs() < 1e-5 * losses[0], "{losses:?}");
    }
    // 5 sequences rather than 3 (what rounding down to the world of 3 evaluated): another mean.
    let run = dir.path().join("three");
    assert_ok(&run_with(&small_run(&run, &corpus, 1, 3), &[]));
    assert!(
        (val_losses(&run)[0].1 - losses[0]).abs() > 1e-6,
        "{losses:?}"
    );
}

/// A mount of a read-only tmpfs at `dir`, unmounted when dropped; `None` where mounting is not
/// allowed (then the test uses a folder without write permission, which binds a non-root user).
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn mount(dir: &Path) -> Option<ReadOnly> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| ReadOnly(dir.to_path_buf()))
    }
}

impl ReadOnly {
    /// Binds `file` read-only over itself.
    fn bind(file: &Path) -> Option<ReadOnly> {
        let mount = |args: &[&str]| {
            Command::new("mount")
                .args(args)
                .arg(file)
                .arg(file)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !mount(&["--bind"]) {
            return None;
        }
        let bound = ReadOnly(file.to_path_buf());
        mount(&["-o", "remount,bind,ro"]).then_some(bound)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Makes `dir` unwritable: a read-only mount as root, else no write permission.
fn make_read_only(dir: &Path) -> Option<ReadOnly> {
    std::fs::create_dir_all(dir).unwrap();
    let mounted = ReadOnly::mount(dir);
    if mounted.is_none() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    }
    mounted
}

/// A read-only `checkpoint.dir` (or one under a file) is refused before the first step, naming
/// the key; nothing of the run is written.
#[test]
fn an_unwritable_checkpoint_dir_is_refused_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let ro = dir.path().join("read-only");
    let _mounted = make_read_only(&ro);
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    for (name, checkpoints) in [
        ("ro", ro.join("ckpt")),
        ("ro-top", ro.clone()),
        ("file", file.join("ckpt")),
    ] {
        let run = dir.path().join(name);
        let ckpt = format!("checkpoint.dir={:?}", checkpoints.to_str().unwrap());
        let out = run_with(&small_run(&run, &corpus, 2, 4), &[&ckpt]);
        let e = error_line(&out);
        assert!(
            e.starts_with("error: checkpoint.dir: cannot ")
                && e.contains(checkpoints.to_str().unwrap()),
            "{name}: {e}"
        );
        assert!(
            !run.join("metrics.jsonl").exists(),
            "{name}: trained before refusing"
        );
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("step 1"),
            "{name}"
        );
    }
}

/// A metrics file that cannot be appended to is refused before the first step, and is left as
/// it was.
#[test]
fn an_unwritable_metrics_file_is_refused_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    let sets = small_run(&run, &corpus, 2, 4);
    let first = ["train.steps=1", "train.decay_steps=3"];
    assert_ok(&run_with(&sets, &first));
    let metrics = run.join("metrics.jsonl");
    let before = std::fs::read(&metrics).unwrap();
    // Unwritable even for root: the file bound read-only over itself; else no write permission.
    let _bound = ReadOnly::bind(&metrics);
    if _bound.is_none() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&metrics, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    // Resuming from the last step's checkpoint would append to the metrics at step 2.
    let again = [
        "checkpoint.resume=true",
        "train.steps=3",
        "train.decay_steps=3",
    ];
    let out = run_with(&sets, &again);
    let e = error_line(&out);
    assert!(
        e.starts_with("error: log.dir: cannot write ") && e.contains("metrics.jsonl"),
        "{e}"
    );
    assert_eq!(std::fs::read(&metrics).unwrap(), before);
}

/// `[model]` and `[zero]` values given with `--set` are blamed on the `--set`, not the file.
#[test]
fn errors_in_model_and_zero_values_name_the_set() {
    let dir = tempfile::tempdir().unwrap();
    for (set, want) in [
        (
            "model.seq_len=0",
            "error: --set model.seq_len=0: model.seq_len must be positive",
        ),
        (
            "model.n_embd=30",
            "error: --set model.n_embd=30: model.n_embd = 30 is not a multiple of model.n_head = 4",
        ),
        (
            "zero.grad_quant_block=0",
            "error: --set zero.grad_quant_block=0: zero.grad_quant_block: must be positive",
        ),
    ] {
        let out = trainer()
            .args(["--config", "configs/tiny.toml", "--set", set])
            .args([
                "--set",
                &format!("log.dir={:?}", dir.path().join("run").to_str().unwrap()),
            ])
            .output()
            .unwrap();
        assert_eq!(error_line(&out), want);
    }
}

/// A working set larger than the memory at hand is refused before anything is allocated, in
/// one line naming the estimate and what lowers it (today: an allocation failure, exit 134).
#[test]
fn a_run_too_large_for_memory_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // 16384 tokens of context: the CPU attention's scores alone are 16 GiB a rank.
    let out = trainer()
        .args([
            "--config",
            "configs/tiny.toml",
            "--set",
            "model.seq_len=16384",
        ])
        .args(["--set", "train.micro_batch=4"])
        .args(["--set", &format!("log.dir={:?}", run.to_str().unwrap())])
        .output()
        .unwrap();
    let e = error_line(&out);
    assert!(
        e.starts_with("error: the plan estimates ")
            && e.contains("for the 4 ranks of this process")
            && e.contains("of memory available")
            && e.contains("a smaller train.micro_batch")
            && e.contains("model.recompute = true"),
        "{e}"
    );
    assert!(!run.join("metrics.jsonl").exists());
}

/// `trainer plan` with a world whose batch overflows 64 bits says so in one line (today: a
/// divide by zero after the product wrapped).
#[test]
fn plan_with_an_overflowing_world_is_one_line() {
    let out = trainer()
        .args(["plan", "--config", "configs/tiny.toml"])
        .args(["--world-size", "4611686018427387904"])
        .output()
        .unwrap();
    assert_eq!(
        error_line(&out),
        "error: a world of 4611686018427387904 ranks x train.micro_batch = 4 sequences does not fit in 64 bits"
    );
}

/// A fault hook aimed at a rank outside the world is an error, so a fault test using it
/// cannot pass without its fault.
#[test]
fn a_fault_hook_outside_the_world_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    for hook in ["ZEROPP_FAIL_RANK", "ZEROPP_KILL_RANK", "ZEROPP_HANG_RANK"] {
        let out = command(&small_run(&run, &corpus, 4, 4), &[])
            .env(hook, "9@3")
            .output()
            .unwrap();
        assert_eq!(
            error_line(&out),
            format!("error: {hook}=9@3: rank 9 is outside the world of 4 (ranks 0 to 3)")
        );
        assert!(!run.join("metrics.jsonl").exists());
    }
}

/// SIGTERM to a run of 8 ranks in one process is reported as SIGTERM, wherever it falls
/// between the ranks' polls of the stop flag (a rank that polled before the signal used to
/// report "a signal to another rank"). The race is timing-dependent; several signals at
/// different points of a step make a wrong report likely if the stop line does not re-read
/// the flag.
#[test]
fn sigterm_to_a_local_run_is_reported_as_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    for attempt in 0..4u64 {
        let run = dir.path().join(format!("run{attempt}"));
        let mut sets = small_run(&run, &corpus, 8, 8);
        sets.push("train.global_batch=8".into());
        sets.push("train.steps=10000".into());
        let mut child = command(&sets, &[])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !std::fs::read_to_string(run.join("metrics.jsonl"))
            .is_ok_and(|t| t.contains("\"step\":2,\"tokens\""))
        {
            assert!(child.try_wait().unwrap().is_none(), "the run ended early");
            assert!(start.elapsed() < Duration::from_secs(120), "no step 2");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(7 * attempt));
        let out = common::stop_with_sigterm(child);
        let err = stderr(&out);
        assert!(
            err.lines()
                .any(|l| l.starts_with("stopped by SIGTERM after step ")),
            "attempt {attempt}: {err}"
        );
    }
}
