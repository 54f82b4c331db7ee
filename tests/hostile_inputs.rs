//! What the second hostile-input probe found (issue 37), each case as a user meets it on the
//! command line: an export aimed into a checkpoint, a setting that would fail only after
//! training (the samples' prompt), a resume of another model shape, sizes that would abort on
//! allocation, and the one-line checks of rates and shapes. The init_from, data and
//! checkpoint-file cases are unit tests beside their code (init_from.rs, from_checkpoint.rs,
//! checkpoint/tests.rs, crates/data/tests/formats.rs).

use std::path::{Path, PathBuf};

mod common;
use common::{assert_ok, error_line, run_with, s, small_corpus, small_model_run, stderr, trainer};

/// A small model on one rank trained `steps` steps on `train` into `run`, a checkpoint every
/// second step.
fn small_run(run: &Path, train: &Path, steps: u64) -> Vec<String> {
    let mut sets = small_model_run(run, train);
    sets.extend([
        "train.micro_batch=4".into(),
        "train.global_batch=8".into(),
        "dist.world_size=1".into(),
        "dist.gpus_per_node=1".into(),
        format!("train.steps={steps}"),
        "train.decay_steps=8".into(),
        "log.eval_samples=8".into(),
        "checkpoint.interval=2".into(),
        "checkpoint.resume=true".into(),
    ]);
    sets
}

/// Every file under `dir`, with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        match path.is_dir() {
            true => out.extend(files(&path)),
            false => out.push((path.clone(), std::fs::read(&path).unwrap())),
        }
    }
    out.sort();
    out
}

/// `trainer export` refuses an output inside the checkpoint folder (the rank file it reads,
/// or any folder beside the checkpoints) and leaves every checkpoint byte as it was; a
/// `config.json` it cannot write leaves no export behind. The checkpoint then still evaluates,
/// and generates with any `--max-new-tokens`.
#[test]
fn export_never_writes_into_a_checkpoint_nor_half_an_export() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    assert_ok(&run_with(&small_run(&run, &corpus, 2), &[]));
    let checkpoints = run.join("checkpoints");
    let before = files(&checkpoints);
    let step = checkpoints.join("step_00000002");
    for output in [
        step.join("rank_00000.safetensors"),
        checkpoints.join("hf/model.safetensors"),
    ] {
        for from in [&checkpoints, &step] {
            let out = trainer()
                .args(["export", "--checkpoint", s(from), "--output", s(&output)])
                .output()
                .unwrap();
            let e = error_line(&out);
            assert!(e.contains("inside the checkpoint folder"), "{e}");
        }
    }
    assert_eq!(files(&checkpoints), before, "the checkpoint is as it was");

    // config.json cannot be written (a folder of that name): nothing is left of the export.
    let hf = dir.path().join("hf");
    std::fs::create_dir_all(hf.join("config.json")).unwrap();
    let out = trainer()
        .args(["export", "--checkpoint", s(&checkpoints)])
        .args(["--output", s(&hf.join("model.safetensors"))])
        .output()
        .unwrap();
    assert!(error_line(&out).contains("config.json"));
    let left: Vec<_> = std::fs::read_dir(&hf)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["config.json"], "no half export");

    let eval = trainer()
        .args(["eval", "--checkpoint", s(&checkpoints), "--json"])
        .output()
        .unwrap();
    assert_ok(&eval);
    // The most new tokens a user can type: as many as the context holds, no overflow.
    let out = trainer()
        .args([
            "generate",
            "--checkpoint",
            s(&checkpoints),
            "--json",
            "--prompt",
            "The",
        ])
        .args(["--max-new-tokens", &u64::MAX.to_string()])
        .output()
        .unwrap();
    assert_ok(&out);
    let g: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let (prompt, ids) = (
        g["prompt_ids"].as_array().unwrap(),
        g["ids"].as_array().unwrap(),
    );
    assert_eq!(
        prompt.len() + ids.len(),
        32 + 1,
        "the context full, and one token after it"
    );
}

/// A samples' prompt longer than the context is refused before the first step, in one line
/// naming the key: no step is trained and then lost.
#[test]
fn a_sample_prompt_longer_than_the_context_is_refused_before_the_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    let prompt = "word ".repeat(100);
    let out = run_with(
        &small_run(&run, &corpus, 2),
        &[
            "log.sample_interval=1",
            &format!("log.sample_prompt={prompt:?}"),
        ],
    );
    let e = error_line(&out);
    assert!(
        e.contains("log.sample_prompt is 101 tokens") && e.contains("model.seq_len = 32"),
        "{e}"
    );
    assert!(!run.join("metrics.jsonl").exists(), "no step trained");
}

/// A resume whose model differs from the checkpoint's names each key that differs, with both
/// values, and the tokenizer where the vocabulary came from it.
#[test]
fn a_resume_of_another_shape_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    let sets = small_run(&run, &corpus, 2);
    assert_ok(&run_with(&sets, &[]));
    let more = |extra: &[&str]| {
        let mut all = vec!["train.steps=4"];
        all.extend(extra);
        error_line(&run_with(&sets, &all))
    };
    let e = more(&["model.vocab_size=50432"]);
    assert!(e.contains("model.vocab_size: 50304 -> 50432"), "{e}");
    let e = more(&["model.n_layer=3", "model.seq_len=16"]);
    assert!(
        e.contains("model.n_layer: 2 -> 3, model.seq_len: 32 -> 16"),
        "{e}"
    );

    // Another tokenizer over the same .jsonl: the vocabulary it gives, and the tokenizer.
    let tok = dir.path().join("tok.json");
    let out = trainer()
        .args([
            "tokenizer",
            "--quiet",
            "--input",
            s(&corpus),
            "--vocab-size",
            "300",
        ])
        .args(["--output", s(&tok)])
        .output()
        .unwrap();
    assert_ok(&out);
    let e = more(&[&format!("data.tokenizer={:?}", s(&tok))]);
    assert!(
        e.contains("model.vocab_size: 50304 -> 384 (the vocabulary of data.tokenizer = ")
            && e.contains("tok.json"),
        "{e}"
    );
}

/// Sizes that allocated what they asked for and aborted (exit 134, a backtrace) are one line.
#[test]
fn sizes_that_would_abort_on_allocation_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 1);
    for vocab in ["2000000000", "4294967296"] {
        let out = trainer()
            .args(["tokenizer", "--input", s(&corpus), "--vocab-size", vocab])
            .args(["--output", s(&dir.path().join("t.json"))])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let e = error_line(&out);
        assert!(
            e.contains(&format!("vocab size {vocab} is too large")),
            "{e}"
        );
    }
    let out = trainer()
        .args(["--config", "configs/tiny.toml", "--print-config"])
        .args(["--set", "model.n_layer=100000000"])
        .output()
        .unwrap();
    let e = error_line(&out);
    assert!(
        e.contains("--set model.n_layer=100000000") && e.contains("65536"),
        "{e}"
    );
}

/// Rates that are not finite, or not positive, are refused naming the key; a Llama shape whose
/// heads cannot rotate blames the `--set` that made it.
#[test]
fn rates_and_shapes_are_checked_by_key() {
    let check = |config: &str, set: &str, needle: &str| {
        let out = trainer()
            .args(["--config", config, "--print-config", "--set", set])
            .output()
            .unwrap();
        let e = error_line(&out);
        assert!(
            e.contains(&format!("--set {set}")) && e.contains(needle),
            "{e}"
        );
    };
    check("configs/tiny.toml", "train.lr=inf", "train.lr = inf");
    check("configs/tiny.toml", "train.lr=nan", "train.lr = NaN");
    check("configs/tiny.toml", "train.lr=-1.0", "train.lr = -1");
    check(
        "configs/tiny.toml",
        "train.min_lr=inf",
        "train.min_lr = inf",
    );
    check("configs/tiny.toml", "train.eps=inf", "train.eps = inf");
    check(
        "configs/tiny.toml",
        "train.grad_clip=inf",
        "train.grad_clip = inf",
    );
    check(
        "configs/llama-demo.toml",
        "model.n_embd=60",
        "model.head_dim = 15 (model.n_embd / model.n_head unless set)",
    );
    check(
        "configs/llama-demo.toml",
        "model.n_head=64",
        "model.head_dim = 1 (model.n_embd / model.n_head unless set)",
    );
}
