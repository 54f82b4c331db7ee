//! The README demos, whole: `configs/demo.toml` (GPT-2) must learn at least 3 nats of
//! validation loss, `configs/llama-demo.toml` (the small Llama) at least 2. About two minutes
//! each on 2 cores, so they are ignored by `cargo test`; `.ci/run` runs them with
//! `cargo test --release -p trainer --test demo -- --ignored`.

use std::path::Path;
use std::process::Command;

/// The validation losses of `config`'s whole run.
fn val_losses(config: &str) -> Vec<f64> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .current_dir(&repo)
        .args(["--config", config, "--set"])
        .arg(format!("log.dir={:?}", dir.path().to_str().unwrap()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("val_loss").and_then(|x| x.as_f64()))
        .collect()
}

/// `config`'s whole run starts at initialisation (val_loss near ln 50,304 = 10.83, GPT-2's
/// tokenizer padded) and learns at least `nats`.
fn learns(config: &str, nats: f64) {
    let val = val_losses(config);
    let (first, last) = (val[0], val[val.len() - 1]);
    eprintln!("val_loss {first:.4} -> {last:.4}");
    assert!(
        (first - 10.83).abs() < 0.2,
        "the first evaluation is at initialisation: {first}"
    );
    assert!(
        last <= first - nats,
        "val_loss {first} -> {last}: less than {nats} nats learned"
    );
}

#[test]
#[ignore = "two minutes: run by .ci/run"]
fn demo_config_learns_three_nats() {
    learns("configs/demo.toml", 3.0);
}

#[test]
#[ignore = "two minutes: run by .ci/run"]
fn llama_demo_config_learns_two_nats() {
    learns("configs/llama-demo.toml", 2.0);
}
