//! What users reach for every day, through the CLI: checkpoints written in the background
//! (`checkpoint.async`), TensorBoard events, samples while training, `trainer eval` and
//! `trainer generate` on a checkpoint.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{
    assert_ok, command, curve, error_line, run_with, small_corpus, small_model_run, stderr,
    step_names, subcommand,
};

/// A small GPT-2 run (about 1 MB of checkpoint) in `run`: `world` ranks as 2 nodes when even,
/// validation every 4 steps, a checkpoint every 4.
fn small_run(run: &Path, train: &Path, steps: u64, world: usize) -> Vec<String> {
    let per_node = if world.is_multiple_of(2) {
        world / 2
    } else {
        world
    };
    let mut sets = small_model_run(run, train);
    sets.extend([
        "train.micro_batch=2".into(),
        "train.global_batch=8".into(),
        format!("dist.world_size={world}"),
        format!("dist.gpus_per_node={per_node}"),
        format!("train.steps={steps}"),
        "train.decay_steps=12".into(),
        "train.lr=1e-3".into(),
        "train.warmup_steps=2".into(),
        "log.eval_interval=4".into(),
        "log.eval_samples=8".into(),
        "checkpoint.interval=4".into(),
        "checkpoint.keep_last=0".into(),
        "checkpoint.resume=true".into(),
    ]);
    sets
}

/// ZeRO++ (qwZ, hpZ, qgZ) on top of [`small_run`].
const ZEROPP: [&str; 3] = [
    "zero.quantized_weights=true",
    "zero.quantized_gradients=true",
    "zero.hpz_partition_size=2",
];

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn background_checkpoints_give_the_same_run_and_a_crash_during_a_write_keeps_the_previous() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    let straight = dir.path().join("straight");
    assert_ok(&run_with(
        &small_run(&straight, &corpus, 12, 2),
        &["checkpoint.async=false"],
    ));

    // In the background: the same curve bit for bit, every checkpoint committed, each said.
    let background = dir.path().join("background");
    let out = run_with(
        &small_run(&background, &corpus, 12, 2),
        &["checkpoint.async=true"],
    );
    assert_ok(&out);
    assert_eq!(curve(&background), curve(&straight));
    assert_eq!(
        step_names(&background.join("checkpoints")),
        ["step_00000004", "step_00000008", "step_00000012"]
    );
    let said = stderr(&out);
    assert_eq!(said.matches("training waited").count(), 3, "{said}");

    // The write of step 8 still in flight when the process dies at step 10: step 4 stays the
    // newest, the half-written step 8 is no checkpoint, and the resume from 4 is exact.
    let crashed = dir.path().join("crashed");
    let sets = small_run(&crashed, &corpus, 12, 2);
    let out = command(&sets, &["checkpoint.async=true"])
        .env("ZEROPP_CHECKPOINT_DELAY", "8@60000")
        .env("ZEROPP_KILL_RANK", "0@10")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the run should have died");
    let left = step_names(&crashed.join("checkpoints"));
    assert!(left.contains(&"step_00000004".to_string()), "{left:?}");
    assert!(!left.contains(&"step_00000008".to_string()), "{left:?}");
    let out = run_with(&sets, &["checkpoint.async=true"]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("step_00000004 at step 4"),
        "{}",
        stderr(&out)
    );
    assert_eq!(curve(&crashed), curve(&straight));
}

#[test]
fn a_stop_signal_waits_for_the_background_write() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    let run = dir.path().join("run");
    let sets = small_run(&run, &corpus, 40, 1);
    // Step 4's write takes 3 s; the signal comes during it.
    let child = command(&sets, &["checkpoint.async=true"])
        .env("ZEROPP_CHECKPOINT_DELAY", "4@3000")
        .env("ZEROPP_STEP_DELAY_MS", "100")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = run.join("metrics.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !std::fs::read_to_string(&metrics)
        .map(|t| t.contains("\"step\":6,"))
        .unwrap_or(false)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never reached step 6"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = common::stop_with_sigterm(child);
    let err = stderr(&out);
    // Both checkpoints committed: step 4's (waited for) and the stop's own.
    let stop_line = err
        .lines()
        .find(|l| l.starts_with("stopped by SIGTERM"))
        .unwrap();
    let step: u64 = stop_line
        .split_whitespace()
        .nth(5)
        .unwrap()
        .parse()
        .unwrap();
    let names = step_names(&run.join("checkpoints"));
    assert!(names.contains(&"step_00000004".to_string()), "{names:?}");
    assert!(
        names.contains(&format!("step_{step:08}")),
        "{names:?} {stop_line}"
    );
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
}

#[test]
fn eval_prints_the_val_loss_training_logged_and_generate_is_greedy_and_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    let run = dir.path().join("run");
    // ZeRO++ over 2 x 2, with a sample every 4 steps.
    let mut sets = small_run(&run, &corpus, 8, 4);
    sets.extend(ZEROPP.iter().map(|s| s.to_string()));
    sets.push("log.sample_interval=4".into());
    sets.push("log.sample_tokens=8".into());
    let out = run_with(&sets, &[]);
    assert_ok(&out);
    assert_eq!(
        stderr(&out).matches("| sample: ").count(),
        2,
        "{}",
        stderr(&out)
    );
    let samples = std::fs::read_to_string(run.join("samples.jsonl")).unwrap();
    assert_eq!(samples.lines().count(), 2, "{samples}");

    // The val_loss logged at step 4, from step 4's checkpoint on one rank.
    let logged: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v.get("val_loss").is_some() && v["step"] == 4)
        .collect();
    let logged = logged[0]["val_loss"].as_f64().unwrap();
    let ckpt = run.join("checkpoints/step_00000004");
    let out = subcommand(&["eval", "--checkpoint", ckpt.to_str().unwrap(), "--json"]);
    assert_ok(&out);
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["step"], 4);
    let evaluated = report["datasets"][0]["loss"].as_f64().unwrap();
    assert!(
        (evaluated - logged).abs() < 1e-4,
        "eval {evaluated} against the logged {logged}"
    );
    assert_eq!(report["datasets"][0]["sequences"], 8);

    // A dataset named on the command line, all of it, in the table.
    let out = subcommand(&[
        "eval",
        "--checkpoint",
        run.join("checkpoints").to_str().unwrap(),
        "--data",
        corpus.to_str().unwrap(),
        "--samples",
        "0",
    ]);
    assert_ok(&out);
    let table = stdout(&out);
    assert!(table.contains("step 8"), "{table}");
    assert!(table.contains("small.jsonl"), "{table}");

    // Greedy: the same tokens every time; sampling: the same tokens for the same seed.
    let generate = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "generate",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--prompt",
            "The Congress",
            "--max-new-tokens",
            "6",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = subcommand(&args);
        assert_ok(&out);
        serde_json::from_str(stdout(&out).trim()).unwrap()
    };
    let greedy = generate(&["--temperature", "0"]);
    assert_eq!(greedy["ids"].as_array().unwrap().len(), 6);
    assert_eq!(greedy, generate(&["--temperature", "0", "--seed", "7"]));
    assert_eq!(
        greedy["ids"],
        generate(&["--top-k", "1", "--seed", "3"])["ids"]
    );
    let seeded = generate(&["--temperature", "1", "--seed", "5", "--top-k", "0"]);
    assert_eq!(
        seeded,
        generate(&["--temperature", "1", "--seed", "5", "--top-k", "0"])
    );

    // Bad input: one line.
    let out = subcommand(&[
        "eval",
        "--checkpoint",
        dir.path().join("none").to_str().unwrap(),
    ]);
    assert!(
        error_line(&out).contains("no such folder"),
        "{}",
        stderr(&out)
    );
}

/// The TensorBoard events of a run interrupted and resumed, read by TensorBoard's own reader
/// (`scripts/tensorboard-check.py`, with the python of `ZEROPP_TB_PYTHON` holding the
/// `tensorboard` package; `.ci/run` makes one).
#[test]
#[ignore = "needs a python with the tensorboard package (ZEROPP_TB_PYTHON); .ci/run runs it"]
fn tensorboard_reads_the_curves_of_metrics_jsonl_across_a_resume() {
    let python = std::env::var("ZEROPP_TB_PYTHON").expect("ZEROPP_TB_PYTHON");
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    let run = dir.path().join("run");
    let mut sets = small_run(&run, &corpus, 12, 2);
    sets.push("log.tensorboard=true".into());
    // Killed after step 10, whose lines and events are then dropped: the resume from step 8
    // writes steps 9 and 10 again.
    let out = command(&sets, &[])
        .env("ZEROPP_KILL_AT_STEP", "10")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_ok(&run_with(&sets, &[]));
    check_tensorboard(&python, &run);
}

fn check_tensorboard(python: &str, run: &Path) {
    let script: PathBuf = common::repo().join("scripts/tensorboard-check.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(run)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout(&out).contains("12 train/loss"), "{}", stdout(&out));
}

/// `trainer generate --temperature 0` on a checkpoint of every family gives the tokens
/// transformers' greedy `generate` gives on their exports (`scripts/generate-check.py`, with the
/// python of `ZEROPP_HF_PYTHON`; `.ci/run` makes one).
#[test]
#[ignore = "needs a python with torch and transformers (ZEROPP_HF_PYTHON); .ci/run runs it"]
fn transformers_generates_our_greedy_tokens() {
    let python = std::env::var("ZEROPP_HF_PYTHON").expect("ZEROPP_HF_PYTHON");
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    for (name, arch) in [
        ("gpt", vec!["model.n_layer=2"]),
        (
            "llama",
            vec![
                "model.preset=\"llama-tiny\"",
                "model.n_kv_head=1",
                "model.tie_embeddings=false",
            ],
        ),
        // Each family's block additions: Qwen2's q/k/v biases, Qwen3's q/k norms and heads
        // wider than n_embd / n_head, Mistral's name.
        ("qwen2", vec!["model.preset=\"qwen2-tiny\""]),
        ("qwen3", vec!["model.preset=\"qwen3-tiny\""]),
        ("mistral", vec!["model.preset=\"mistral-tiny\""]),
    ] {
        let run = dir.path().join(name);
        let mut sets = small_run(&run, &corpus, 8, 1);
        sets.extend(arch.iter().map(|s| s.to_string()));
        assert_ok(&run_with(&sets, &[]));
        let ckpt = run.join("checkpoints");
        let hf = run.join("hf");
        assert_ok(&subcommand(&[
            "export",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--output",
            hf.join("model.safetensors").to_str().unwrap(),
        ]));
        let ours = subcommand(&[
            "generate",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--prompt",
            "Fellow citizens of the Senate",
            "--max-new-tokens",
            "20",
            "--temperature",
            "0",
            "--json",
        ]);
        assert_ok(&ours);
        let ours: serde_json::Value = serde_json::from_str(stdout(&ours).trim()).unwrap();
        let prompt: Vec<String> = ours["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.to_string())
            .collect();
        let theirs = std::process::Command::new(&python)
            .arg(common::repo().join("scripts/generate-check.py"))
            .arg(&hf)
            .args(["--prompt-ids", &prompt.join(","), "--max-new-tokens", "20"])
            .output()
            .unwrap();
        assert!(
            theirs.status.success(),
            "{}",
            String::from_utf8_lossy(&theirs.stderr)
        );
        let theirs: serde_json::Value = serde_json::from_str(stdout(&theirs).trim()).unwrap();
        assert_eq!(
            ours["ids"], theirs["ids"],
            "{name}: ours {ours} transformers {theirs}"
        );
        eprintln!("{name}: {}", ours["text"]);
    }
}
