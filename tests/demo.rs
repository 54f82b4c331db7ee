//! The README demo, whole: `configs/demo.toml` must learn at least 3 nats of validation loss.
//! About two minutes on 2 cores, so it is ignored by `cargo test`; `.ci/run` runs it with
//! `cargo test --release -p trainer --test demo -- --ignored`.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "two minutes: run by .ci/run"]
fn demo_config_learns_three_nats() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .current_dir(&repo)
        .args(["--config", "configs/demo.toml", "--set"])
        .arg(format!("log.dir={:?}", dir.path().to_str().unwrap()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let val: Vec<f64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("val_loss").and_then(|x| x.as_f64()))
        .collect();
    let (first, last) = (val[0], val[val.len() - 1]);
    eprintln!("val_loss {first:.4} -> {last:.4}");
    assert!(
        (first - 10.83).abs() < 0.2,
        "the first evaluation is at initialisation: {first}"
    );
    assert!(
        last <= first - 3.0,
        "val_loss {first} -> {last}: less than 3 nats learned"
    );
}
