//! End-to-end tests of the `trainer` binary: training, kill and resume, bad input, data
//! preparation and plots, on a small slice of the bundled corpus with a small model.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{assert_ok, losses, run_with, small_corpus, small_model_run, trainer};

/// A small model and batch, with every path inside `dir`.
fn small_run(dir: &Path, train: &Path, steps: u64) -> Vec<String> {
    let mut sets = small_model_run(&dir.join("run"), train);
    sets.extend([
        "train.micro_batch=4".into(),
        "train.global_batch=8".into(),
        "dist.world_size=1".into(),
        "dist.gpus_per_node=1".into(),
        format!("train.steps={steps}"),
        "train.lr=1e-3".into(),
        "train.warmup_steps=5".into(),
        "log.eval_interval=10".into(),
        "log.eval_samples=8".into(),
    ]);
    sets
}

/// `trainer prepare-data --quiet --output OUTPUT --input INPUT` and `extra` arguments.
fn prepare_data(output: &Path, input: &Path, extra: &[&str]) -> Output {
    trainer()
        .args(["prepare-data", "--quiet"])
        .args(extra)
        .arg("--output")
        .arg(output)
        .arg("--input")
        .arg(input)
        .output()
        .unwrap()
}

/// `trainer plot INPUT --output PNG`.
fn plot(input: &Path, png: &Path) -> Output {
    trainer()
        .arg("plot")
        .arg(input)
        .arg("--output")
        .arg(png)
        .output()
        .unwrap()
}

#[test]
fn killed_and_resumed_run_repeats_the_straight_curve_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);

    let straight = dir.path().join("straight");
    std::fs::create_dir(&straight).unwrap();
    assert_ok(&run_with(
        &small_run(&straight, &corpus, 40),
        &["checkpoint.interval=10"],
    ));

    let resumed = dir.path().join("resumed");
    std::fs::create_dir(&resumed).unwrap();
    let sets = small_run(&resumed, &corpus, 40);
    let mut first = trainer();
    first
        .args(["--config", "configs/tiny.toml"])
        .env("ZEROPP_KILL_AT_STEP", "20");
    for s in sets.iter().chain(&["checkpoint.interval=20".to_string()]) {
        first.args(["--set", s]);
    }
    let out = first.output().unwrap();
    assert!(
        !out.status.success(),
        "the run should have been killed at step 20"
    );
    assert_eq!(losses(&resumed.join("run")).len(), 20);
    assert_ok(&run_with(&sets, &["checkpoint.interval=20"]));

    let a = losses(&straight.join("run"));
    let b = losses(&resumed.join("run"));
    assert_eq!(a.len(), 40);
    assert_eq!(
        a, b,
        "the resumed curve must equal the straight one bitwise"
    );
    assert!(
        a[39].1 < a[0].1 - 0.5,
        "the small model should learn: {} -> {}",
        a[0].1,
        a[39].1
    );
}

/// Runs `sets` expecting a one-line error mentioning `needle`, and checks that `keep` is unchanged.
fn assert_refused(sets: &[String], needle: &str, keep: &[PathBuf]) {
    let before: Vec<Option<Vec<u8>>> = keep.iter().map(|p| std::fs::read(p).ok()).collect();
    let out = run_with(sets, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail with {needle}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    assert!(
        lines[0].contains(needle),
        "error should name {needle}: {err}"
    );
    let after: Vec<Option<Vec<u8>>> = keep.iter().map(|p| std::fs::read(p).ok()).collect();
    assert!(before == after, "a refused run must not change {keep:?}");
}

#[test]
fn bad_input_is_refused_with_one_line_and_nothing_lost() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    let sets = small_run(dir.path(), &corpus, 4);
    assert_ok(&run_with(&sets, &["checkpoint.resume=true"]));
    let run = dir.path().join("run");
    let ckpt = run.join("checkpoints/step_00000004/rank_00000.safetensors");
    let keep = vec![run.join("metrics.jsonl"), ckpt.clone()];
    assert!(ckpt.exists());

    let with = |extra: &str| -> Vec<String> {
        let mut s = sets.clone();
        s.push(extra.to_string());
        s
    };
    assert_refused(&with("train.stepz=3"), "train.stepz", &keep);
    assert_refused(&with("train.lr=\"fast\""), "train.lr", &keep);
    assert_refused(
        &with("data.train=[\"no/such/file.jsonl\"]"),
        "no/such/file.jsonl",
        &keep,
    );
    assert_refused(
        &with("data.tokenizer=\"no/such/tokenizer\""),
        "no/such/tokenizer",
        &keep,
    );
    assert_refused(&with("train.global_batch=6"), "global_batch", &keep);
    // Launched backends: the wrong device, a missing build feature, a bad timeout.
    assert_refused(&with("dist.backend=\"nccl\""), "train.device", &keep);
    if !cfg!(feature = "mpi") {
        assert_refused(&with("dist.backend=\"mpi\""), "--features mpi", &keep);
    }
    assert_refused(&with("dist.timeout_s=0"), "dist.timeout_s", &keep);
    // FP8 on the GPU wants GEMM sides that are multiples of 16 (4 x 31 tokens are not); on
    // the CPU it is another trajectory than this run's fp32.
    let mut fp8_gpu = with("train.precision=\"fp8\"");
    fp8_gpu.push("train.device=\"cuda\"".into());
    fp8_gpu.push("model.seq_len=31".into());
    assert_refused(&fp8_gpu, "model.seq_len a multiple of 16", &keep);
    fp8_gpu.pop();
    // A shape that fits then runs on the GPU, plain or with FP8 qwZ (a CPU build lacks the GPU).
    if !cfg!(feature = "cuda") {
        assert_refused(&fp8_gpu, "--features cuda", &keep);
        fp8_gpu.push("zero.quantized_weights=true".into());
        assert_refused(&fp8_gpu, "--features cuda", &keep);
        fp8_gpu.pop();
    }
    let mut fp8 = with("train.precision=\"fp8\"");
    fp8.push("checkpoint.resume=true".into());
    assert_refused(&fp8, "train.precision", &keep);
    // The run exists: starting it again without resume must not overwrite it.
    assert_refused(
        &with("checkpoint.resume=false"),
        "already holds a run",
        &keep,
    );

    // A truncated checkpoint is refused on resume, and the metrics stay as they were.
    let bytes = std::fs::read(&ckpt).unwrap();
    std::fs::write(&ckpt, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused(&with("checkpoint.resume=true"), "truncated", &keep);
}

#[test]
fn prepared_indexed_data_trains_and_corrupt_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 5);
    let prefix = dir.path().join("sotu");
    let out = prepare_data(&prefix, &corpus, &["--valid-fraction", "0.2"]);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("iB/s"));
    let idx = prefix.with_extension("idx");
    assert!(idx.exists() && prefix.with_extension("bin").exists());

    let mut sets = small_run(dir.path(), &prefix, 3);
    sets.retain(|s| !s.starts_with("data.valid_fraction"));
    sets.push(format!(
        "data.valid=[{:?}]",
        dir.path().join("sotu_valid").to_str().unwrap()
    ));
    assert_ok(&run_with(&sets, &[]));
    assert_eq!(losses(&dir.path().join("run")).len(), 3);

    let bytes = std::fs::read(&idx).unwrap();
    std::fs::write(&idx, &bytes[..bytes.len() - 7]).unwrap();
    let mut again = small_run(&dir.path().join("other"), &prefix, 3);
    again.retain(|s| !s.starts_with("data.valid_fraction"));
    again.push("log.eval_samples=0".into());
    let out = run_with(&again, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sotu.idx"),
        "the error should name the index: {err}"
    );
}

#[test]
fn plot_writes_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let lines = [
        r#"{"step":1,"tokens":256,"loss":10.9,"lr":0.001,"grad_norm":1.0,"tokens_per_s":1.0,"comm_intra_bytes":0,"comm_inter_bytes":0}"#,
        r#"{"step":2,"tokens":512,"loss":9.5,"lr":0.001,"grad_norm":1.0,"tokens_per_s":1.0,"comm_intra_bytes":0,"comm_inter_bytes":0}"#,
        r#"{"step":2,"tokens":512,"val_loss":9.7}"#,
    ];
    std::fs::write(&metrics, lines.join("\n")).unwrap();
    let png = dir.path().join("loss.png");
    assert_ok(&plot(&metrics, &png));
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
}

/// The newcomer's paths from the README, on a fresh folder: `prepare-data`, `export` and `plot`
/// create the folders their output goes in, and an error names its io cause once.
#[test]
fn outputs_in_new_folders_are_created_and_io_causes_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);

    let prefix = dir.path().join("data/pile/pile_train");
    assert_ok(&prepare_data(&prefix, &corpus, &[]));
    assert!(prefix.with_extension("bin").exists() && prefix.with_extension("idx").exists());

    let sets = small_run(dir.path(), &corpus, 2);
    assert_ok(&run_with(&sets, &[]));
    let model = dir.path().join("hf/gpt/model.safetensors");
    let out = trainer()
        .args(["export", "--checkpoint"])
        .arg(dir.path().join("run/checkpoints"))
        .arg("--output")
        .arg(&model)
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(model.exists() && model.with_file_name("config.json").exists());

    let png = dir.path().join("plots/new/loss.png");
    assert_ok(&plot(&dir.path().join("run"), &png));
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");

    // A missing input: one error line, which names the file and says the cause once.
    let out = prepare_data(
        &dir.path().join("again/pile_train"),
        &dir.path().join("missing.jsonl"),
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("missing.jsonl"), "{err}");
    let cause = "No such file or directory";
    assert_eq!(lines[0].matches(cause).count(), 1, "{err}");
}

/// The plot's token axis and its summary line count tokens as 20K, 1.5M, 2.1B.
#[test]
fn plot_counts_tokens_in_thousands_millions_and_billions() {
    let dir = tempfile::tempdir().unwrap();
    for (tokens, label) in [
        (20_000u64, "20K"),
        (1_500_000, "1.5M"),
        (2_100_000_000, "2.1B"),
    ] {
        let metrics = dir.path().join(format!("{label}.jsonl"));
        let lines = [
            format!(r#"{{"step":1,"tokens":{},"loss":10.9}}"#, tokens / 2),
            format!(r#"{{"step":2,"tokens":{tokens},"loss":9.5}}"#),
        ];
        std::fs::write(&metrics, lines.join("\n")).unwrap();
        let out = plot(&metrics, &dir.path().join(format!("{label}.png")));
        assert_ok(&out);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("over {label} tokens")), "{err}");
    }
}

/// With the local backend, a rank that hangs makes its peers give up after `dist.timeout_s`
/// (not the 600 s default): the run fails within seconds, naming the wait.
#[test]
fn dist_timeout_s_bounds_the_local_backends_wait() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    let mut sets = small_run(dir.path(), &corpus, 4);
    sets.retain(|s| !s.starts_with("dist."));
    sets.extend(
        [
            "dist.world_size=2",
            "dist.gpus_per_node=2",
            "dist.timeout_s=2",
        ]
        .map(String::from),
    );
    let mut c = trainer();
    c.args(["--config", "configs/tiny.toml"])
        .env("ZEROPP_HANG_RANK", "1@2");
    for s in &sets {
        c.args(["--set", s]);
    }
    let start = std::time::Instant::now();
    let out = c.output().unwrap();
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run must fail: {err}");
    assert!(
        took < std::time::Duration::from_secs(60),
        "took {took:?}: {err}"
    );
    assert!(err.contains("waited 2 s for its peers"), "{err}");
}

#[test]
fn print_config_resolves_overrides() {
    let out = trainer()
        .args([
            "--config",
            "configs/gpt350m.toml",
            "--print-config",
            "--set",
            "train.steps=7",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("steps = 7") && text.contains("preset = \"gpt350m\""),
        "{text}"
    );
}

/// `trainer bench --json` of a config at W = 4 (2 x 2), plain and with ZeRO++.
fn bench_json(extra: &[&str]) -> serde_json::Value {
    let mut c = trainer();
    c.args([
        "bench",
        "--config",
        "configs/tiny.toml",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--json",
    ]);
    for s in [
        "model.n_layer=1",
        "model.n_embd=64",
        "model.seq_len=32",
        "train.micro_batch=2",
        "train.global_batch=8",
    ]
    .iter()
    .chain(extra)
    {
        c.args(["--set", s]);
    }
    let out = c.output().unwrap();
    assert_ok(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_reports_throughput_flops_and_communication() {
    let plain = bench_json(&[]);
    assert_eq!(plain["world"], 4);
    assert_eq!(plain["tokens_per_step"], 8 * 32);
    assert!(plain["tokens_per_s"].as_f64().unwrap() > 0.0);
    let params = plain["params"].as_f64().unwrap();
    assert_eq!(
        plain["flop_per_token"].as_f64().unwrap(),
        6.0 * params + 6.0 * 64.0 * 32.0
    );
    assert!(plain["mfu"].is_null(), "no MFU on the CPU");
    // Random tokens: the loss stays near ln(vocab) = ln(50304) = 10.83.
    for key in ["loss_first", "loss_last"] {
        let loss = plain[key].as_f64().unwrap();
        assert!((loss - 50304f64.ln()).abs() < 0.5, "{key} {loss}");
    }
    let zeropp = bench_json(&[
        "zero.quantized_weights=true",
        "zero.hpz_partition_size=2",
        "zero.quantized_gradients=true",
    ]);
    let inter = |v: &serde_json::Value| v["comm_inter_bytes"].as_f64().unwrap();
    assert!(inter(&zeropp) < 0.3 * inter(&plain), "{zeropp} vs {plain}");
}

#[test]
fn bench_kernels_needs_the_cuda_build() {
    let out = trainer().args(["bench", "--kernels"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--features cuda"), "{err}");
}

/// `trainer bench --profile` on a CPU config is refused with one line naming the setting.
#[test]
fn bench_profile_needs_the_gpu() {
    let out = trainer()
        .args([
            "bench",
            "--config",
            "configs/tiny.toml",
            "--steps",
            "1",
            "--profile",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--profile") && err.contains("train.device"),
        "{err}"
    );
}
