//! Checkpoints written by transformers itself, in its 4.x and 5.x config styles, single-file
//! fp32 and sharded bf16, of every family (`scripts/hf-checkpoint.py`): the family and shape
//! come from config.json alone, `init_from` reads the weights, and our loss on the same tokens
//! equals transformers' within 1e-5 relative. The weights are drawn far from the
//! initialisation, so a tensor in the wrong place or orientation moves the loss by far more.
//!
//! `ZEROPP_HF_PYTHON` names a python with torch and transformers 5; `ZEROPP_HF4_PATH` a folder
//! holding transformers 4 (`pip install --target DIR 'transformers<5'`), put first on that
//! python's path for the 4.x checkpoints. `.ci/run` makes both.

use std::path::Path;
use std::process::Command;

use candle_core::{Device, Tensor};

const FAMILIES: [&str; 5] = ["llama", "qwen2", "qwen3", "mistral", "gpt2"];

/// Two rows of 16 tokens below 97 and their targets, from a fixed xorshift.
fn tokens() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 97) as u32
    };
    let mut rows = || (0..2).map(|_| (0..16).map(|_| next()).collect()).collect();
    (rows(), rows())
}

fn tensor(rows: &[Vec<u32>]) -> Tensor {
    let flat: Vec<u32> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (rows.len(), rows[0].len()), &Device::Cpu).unwrap()
}

/// Runs scripts/hf-checkpoint.py into `out`; transformers' loss.
fn write(python: &str, path: Option<&str>, out: &Path, family: &str, bf16_sharded: bool) -> f64 {
    let (inputs, targets) = tokens();
    let file = out.with_extension("tokens.json");
    let j = serde_json::json!({ "inputs": inputs, "targets": targets });
    std::fs::write(&file, j.to_string()).unwrap();
    let mut cmd = Command::new(python);
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/hf-checkpoint.py"
    ))
    .arg(out)
    .args(["--family", family, "--tokens"])
    .arg(&file);
    if bf16_sharded {
        cmd.args(["--dtype", "bfloat16", "--shard"]);
    }
    if let Some(p) = path {
        cmd.env("PYTHONPATH", p);
    }
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "hf-checkpoint.py {family}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = String::from_utf8_lossy(&o.stdout);
    let got: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    got["loss"].as_f64().unwrap()
}

#[test]
#[ignore = "needs torch and transformers 4 and 5: .ci/run sets ZEROPP_HF_PYTHON and ZEROPP_HF4_PATH"]
fn transformers_checkpoints_of_every_family_start_a_run_at_their_loss() {
    let python = std::env::var("ZEROPP_HF_PYTHON").expect("ZEROPP_HF_PYTHON");
    let hf4 = std::env::var("ZEROPP_HF4_PATH").expect("ZEROPP_HF4_PATH");
    let dir = tempfile::tempdir().unwrap();
    for (version, path) in [("5", None), ("4", Some(hf4.as_str()))] {
        for family in FAMILIES {
            for bf16_sharded in [false, true] {
                let what = format!(
                    "transformers {version} {family} {}",
                    if bf16_sharded { "bf16 sharded" } else { "fp32" }
                );
                let out = dir
                    .path()
                    .join(format!("{version}-{family}-{bf16_sharded}"));
                let theirs = write(&python, path, &out, family, bf16_sharded);
                let text = std::fs::read_to_string(out.join("config.json")).unwrap();
                let j: serde_json::Value = serde_json::from_str(&text).unwrap();
                // The config style is the version's: 5 nests the rope, 4 does not.
                if family != "gpt2" {
                    assert_eq!(
                        j["rope_parameters"].is_object(),
                        version == "5",
                        "{what}: {text}"
                    );
                }
                assert_eq!(
                    out.join("model.safetensors.index.json").exists(),
                    bf16_sharded,
                    "{what}"
                );
                let cfg = model::from_hf_config(&j).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(cfg.arch.name(), family, "{what}");
                if family == "qwen3" {
                    assert_eq!((cfg.head_dim, cfg.qk_norm), (16, true), "{what}");
                }
                if family == "qwen2" {
                    assert!(cfg.qkv_bias, "{what}");
                }
                if family == "llama" {
                    assert_eq!(
                        cfg.rope_scaling.to_string(),
                        "{ rope_type = \"llama3\", factor = 4.0, low_freq_factor = 1.0, \
                         high_freq_factor = 4.0, original_max_position_embeddings = 4 }",
                        "{what}"
                    );
                }
                let units =
                    hf::init_from::read(&out, &cfg).unwrap_or_else(|e| panic!("{what}: {e:#}"));
                let model = model::Model::new(cfg.clone()).unwrap();
                let params: Vec<Tensor> = units
                    .iter()
                    .map(|v| Tensor::from_vec(v.clone(), v.len(), &Device::Cpu).unwrap())
                    .collect();
                let (inputs, targets) = tokens();
                let ours = model
                    .loss(&params, &tensor(&inputs), &tensor(&targets))
                    .unwrap();
                eprintln!("{what}: ours {ours:.6}, transformers {theirs:.6}");
                assert!(
                    (ours - theirs).abs() <= 1e-5 * theirs,
                    "{what}: ours {ours} vs transformers {theirs}"
                );
            }
        }
    }
}
