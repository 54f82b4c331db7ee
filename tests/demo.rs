//! The README demos, whole: `configs/demo.toml` (GPT-2) must learn at least 3 nats of
//! validation loss, `configs/llama-demo.toml` (the small Llama) at least 2. About two minutes
//! each on 2 cores, so they are ignored by `cargo test`; `.ci/run` runs them with
//! `cargo test --release -p trainer --test demo -- --ignored`.

mod common;
use common::{assert_ok, s, trainer, val_losses};

/// The validation losses of `config`'s whole run.
fn demo_val_losses(config: &str) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let out = trainer()
        .args(["--config", config, "--set"])
        .arg(format!("log.dir={:?}", s(dir.path())))
        .output()
        .unwrap();
    assert_ok(&out);
    val_losses(dir.path()).into_iter().map(|(_, l)| l).collect()
}

/// `config`'s whole run starts at initialisation (val_loss near ln 50,304 = 10.83, GPT-2's
/// tokenizer padded) and learns at least `nats`.
fn learns(config: &str, nats: f64) {
    let val = demo_val_losses(config);
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
