//! `model.init_from = "DIR"`: a run's first weights read from a Hugging Face safetensors folder
//! (`config.json` and `model.safetensors`, or shards listed by `model.safetensors.index.json`),
//! the inverse of `trainer export`: each of the model's parameters is found by its Hugging Face
//! name ([`model::Model::hf_tensors`]; a packed projection's from one tensor per block of its
//! columns), turned back to our orientation and checked against our shape. A vocabulary matrix
//! with fewer rows than ours (GPT-2's 50,257 against our 50,304) is padded with zero rows, as
//! Megatron pads. Anything that does not fit is one line naming the tensor or the setting.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, SafeTensors};

/// The full, unpadded parameters of every unit of `cfg`'s model, in unit order, from `dir`.
pub fn read(dir: &Path, cfg: &model::ModelConfig) -> Result<Vec<Vec<f32>>> {
    let at = |what: &str| format!("model.init_from: {}", dir.join(what).display());
    check_config(dir, cfg)?;
    let files = safetensor_files(dir)?;
    let maps = files
        .iter()
        .map(|f| {
            let file = std::fs::File::open(f)
                .with_context(|| format!("model.init_from: cannot open {}", f.display()))?;
            // SAFETY: the file is only read, and not expected to change during the run's start.
            unsafe { memmap2::Mmap::map(&file) }
                .with_context(|| format!("model.init_from: cannot map {}", f.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut tensors = BTreeMap::new();
    for (f, map) in files.iter().zip(&maps) {
        let st = SafeTensors::deserialize(map).with_context(|| {
            format!("model.init_from: {} is not a safetensors file", f.display())
        })?;
        for (name, view) in st.tensors() {
            tensors.insert(name, (f.clone(), view));
        }
    }
    let model = model::Model::new(cfg.clone())?;
    let mut used = BTreeSet::new();
    let mut units = Vec::with_capacity(model.units().len());
    for unit in model.units() {
        let mut values = vec![0f32; unit.numel];
        for p in &unit.params {
            for hf in model.hf_tensors(p) {
                let name = read_part(&tensors, &hf, p, &mut values[p.offset..p.offset + p.numel])
                    .map_err(|e| anyhow::anyhow!("{}: {e:#}", at("")))?;
                used.insert(name);
            }
        }
        units.push(values);
    }
    for name in tensors.keys() {
        if !used.contains(name) && !cfg.family().hf_buffer(name, cfg) {
            bail!(
                "{}: {name} has no place in this model (model.tie_embeddings = {}?)",
                at(""),
                cfg.tie_embeddings
            );
        }
    }
    Ok(units)
}

/// Reads the Hugging Face tensor `hf` (by its name or alias) into its columns of `ours`,
/// parameter `p`'s values: transposed where HF's orientation is not ours, a vocabulary of fewer
/// rows into the first rows. Returns the name it was found by; an error names the tensor.
fn read_part(
    tensors: &BTreeMap<String, (PathBuf, safetensors::tensor::TensorView<'_>)>,
    hf: &model::HfTensor,
    p: &model::ParamSpec,
    ours: &mut [f32],
) -> Result<String> {
    let Some((name, (file, view))) = [Some(hf.name.clone()), hf.alias.clone()]
        .into_iter()
        .flatten()
        .find_map(|n| tensors.get(&n).map(|t| (n, t)))
    else {
        bail!("no tensor {}", hf.name);
    };
    let got = read_f32(view.dtype(), view.data())
        .with_context(|| format!("{name} in {}", file.display()))?;
    // A NaN or inf would surface only as a NaN loss at step 0, naming nothing.
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        bail!(
            "{name} in {} holds {} at element {i}",
            file.display(),
            got[i]
        );
    }
    // Ours as (rows, cols), HF's part of it as `width` of those columns.
    let cols = p.shape.last().copied().unwrap_or(1);
    let rows = p.numel / cols.max(1);
    let (c0, width) = (hf.columns.start, hf.columns.len());
    let whole = width == cols;
    let expected = hf.shape(p);
    let theirs = view.shape();
    match (hf.transpose, theirs == expected.as_slice()) {
        (true, true) => {
            for r in 0..rows {
                for c in 0..width {
                    ours[r * cols + c0 + c] = got[c * rows + r];
                }
            }
        }
        (false, true) if whole => ours.copy_from_slice(&got),
        (false, true) => {
            for r in 0..rows {
                ours[r * cols + c0..r * cols + c0 + width]
                    .copy_from_slice(&got[r * width..(r + 1) * width]);
            }
        }
        // A vocabulary of fewer rows: the rest stay zero.
        (false, false)
            if hf.vocab_rows
                && whole
                && matches!((p.shape.as_slice(), theirs), (&[v, c], &[hv, hc]) if hc == c && hv < v) =>
        {
            ours[..got.len()].copy_from_slice(&got);
        }
        _ => bail!(
            "{name} is {theirs:?} in {}, this model's is {expected:?}",
            file.display()
        ),
    }
    Ok(name)
}

/// `config.json`'s architecture and the settings that shapes do not show, against `cfg`.
fn check_config(dir: &Path, cfg: &model::ModelConfig) -> Result<()> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("model.init_from: cannot read {}", path.display()))?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("model.init_from: {} is not JSON", path.display()))?;
    let at = path.display();
    let model_type = j["model_type"].as_str().unwrap_or("(none)");
    if model_type != cfg.arch.name() {
        bail!(
            "model.init_from: {at} holds a {model_type:?} model; this run's model.arch is {:?}",
            cfg.arch.name()
        );
    }
    cfg.family()
        .check_hf_config(&j, cfg)
        .map_err(|e| anyhow::anyhow!("model.init_from: {at} {e}"))?;
    Ok(())
}

/// The folder's safetensors files: `model.safetensors`, or the shards its index names.
fn safetensor_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).with_context(|| {
        format!(
            "model.init_from: {} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )
    })?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("model.init_from: {} is not JSON", index.display()))?;
    let files: BTreeSet<&str> = j["weight_map"]
        .as_object()
        .with_context(|| format!("model.init_from: {} has no weight_map", index.display()))?
        .values()
        .filter_map(|v| v.as_str())
        .collect();
    let files: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
    // Name the shard the index lists, not the folder, when one is missing.
    if let Some(missing) = files.iter().find(|f| !f.is_file()) {
        bail!(
            "model.init_from: {} lists {}, which is missing",
            index.display(),
            missing.display()
        );
    }
    Ok(files)
}

/// A tensor's little-endian bytes as f32.
fn read_f32(dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        d => bail!("dtype {d:?} (F32, BF16 or F16 are read)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixtures' small tied Llama (hidden 64, 4 heads of 16, 2 key/value heads, MLP 192,
    /// vocabulary 1024) with their rope theta (500000) and norm eps (1e-5), its initial weights
    /// exported into `dir`.
    fn exported(dir: &Path) -> (model::ModelConfig, Vec<Vec<f32>>) {
        let mut cfg = model::ModelConfig::llama(2, 64, 4, 2, 192, 8, 1024, true);
        cfg.rope_theta = 500_000.0;
        cfg.norm_eps = 1e-5;
        let units = units(&cfg);
        let layouts = model::Model::new(cfg.clone()).unwrap().units().to_vec();
        let pairs: crate::export::UnitParameters = layouts.into_iter().zip(units.clone()).collect();
        crate::export::write_hf(&cfg, &pairs, &dir.join("model.safetensors"), Some(0)).unwrap();
        (cfg, units)
    }

    fn units(cfg: &model::ModelConfig) -> Vec<Vec<f32>> {
        let model = model::Model::new(cfg.clone()).unwrap();
        model
            .units()
            .iter()
            .map(|u| {
                let mut v = vec![0f32; u.numel];
                model::init_unit_range(cfg, u, 9, 0, &mut v);
                v
            })
            .collect()
    }

    /// `tests/fixtures/hf-config/VERSION/NAME.json`, written by transformers itself
    /// (scripts/hf-config-fixtures.py), as `dir`'s config.json.
    fn use_fixture(dir: &Path, version: &str, name: &str) {
        let fixture = Path::new("../../tests/fixtures/hf-config")
            .join(version)
            .join(format!("{name}.json"));
        std::fs::copy(&fixture, dir.join("config.json")).unwrap();
    }

    fn error(dir: &Path, cfg: &model::ModelConfig) -> String {
        let e = format!("{:#}", read(dir, cfg).unwrap_err());
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    /// transformers 4 writes `rope_theta` and `rope_scaling` at the top level, transformers 5
    /// one `rope_parameters` object and no top-level key: both are read, the theta and Llama
    /// 3's scaling compared with the run's under the key they were read from, and every other
    /// scaled rope refused by name.
    #[test]
    fn the_rope_is_read_as_transformers_4_and_5_write_it() {
        for (version, key) in [("v4", "rope_theta"), ("v5", "rope_parameters.rope_theta")] {
            let dir = tempfile::tempdir().unwrap();
            let (cfg, units) = exported(dir.path());
            use_fixture(dir.path(), version, "llama-default");
            assert_eq!(read(dir.path(), &cfg).unwrap(), units, "{version}");

            // A run at another theta is told the checkpoint's, under the key that holds it.
            let other = model::ModelConfig {
                rope_theta: 10_000.0,
                ..cfg.clone()
            };
            let e = error(dir.path(), &other);
            assert!(
                e.contains(&format!("has {key} = 500000,")),
                "{version}: {e}"
            );
            assert!(
                e.contains("set model.rope_theta = 500000"),
                "{version}: {e}"
            );
            use_fixture(dir.path(), version, "llama-theta10k");
            let e = error(dir.path(), &cfg);
            assert!(e.contains(&format!("has {key} = 10000,")), "{version}: {e}");
            assert_eq!(read(dir.path(), &other).unwrap(), units, "{version}");

            // Llama 3.2's scaling is read in either spelling: a run with it reads the weights,
            // a run without is told the setting.
            let scaling_key = match version {
                "v4" => "rope_scaling",
                _ => "rope_parameters",
            };
            use_fixture(dir.path(), version, "llama-llama3");
            let e = error(dir.path(), &cfg);
            assert!(
                e.contains(&format!(
                    "has {scaling_key} = {{ rope_type = \"llama3\", factor = 32.0"
                )) && e.contains("this run model.rope_scaling = { rope_type = \"default\" }")
                    && e.contains("set model.rope_scaling = { rope_type = \"llama3\""),
                "{version}: {e}"
            );
            let scaled = model::ModelConfig {
                rope_scaling: model::LLAMA3_2_SCALING,
                ..cfg.clone()
            };
            assert_eq!(read(dir.path(), &scaled).unwrap(), units, "{version}");

            for (fixture, rope_type) in [("llama-yarn", "\"yarn\""), ("llama-linear", "\"linear\"")]
            {
                use_fixture(dir.path(), version, fixture);
                let e = error(dir.path(), &cfg);
                assert!(
                    e.contains(rope_type) && e.contains("does not implement"),
                    "{version} {fixture}: {e}"
                );
            }
            use_fixture(dir.path(), version, "gpt2");
            let e = error(dir.path(), &cfg);
            assert!(e.contains("\"gpt2\" model"), "{version}: {e}");
        }
    }

    /// A tensor holding NaN or inf is named with its file when it is read, not found as a NaN
    /// loss at step 0.
    #[test]
    fn a_weight_that_is_not_finite_is_named() {
        for bad in [f32::NAN, f32::INFINITY] {
            let dir = tempfile::tempdir().unwrap();
            let (cfg, mut units) = exported(dir.path());
            let layouts = model::Model::new(cfg.clone()).unwrap().units().to_vec();
            // Row 0, column 5 of q|k|v: q_proj's.
            let q = layouts[1].param("self_attn.qkv_proj.weight");
            units[1][q.offset + 5] = bad;
            let pairs: crate::export::UnitParameters = layouts.into_iter().zip(units).collect();
            let out = dir.path().join("model.safetensors");
            crate::export::write_hf(&cfg, &pairs, &out, Some(0)).unwrap();
            let e = error(dir.path(), &cfg);
            assert!(
                e.contains("model.layers.0.self_attn.q_proj.weight")
                    && e.contains("model.safetensors")
                    && e.contains(&bad.to_string()),
                "{e}"
            );
        }
    }

    /// A shard that `model.safetensors.index.json` lists and the folder lacks is named.
    #[test]
    fn a_missing_shard_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, units) = exported(dir.path());
        let first = "model-00001-of-00002.safetensors";
        std::fs::rename(dir.path().join("model.safetensors"), dir.path().join(first)).unwrap();
        let bytes = std::fs::read(dir.path().join(first)).unwrap();
        let names: Vec<String> = SafeTensors::deserialize(&bytes)
            .unwrap()
            .names()
            .into_iter()
            .map(String::from)
            .collect();
        let index = |second: &str| {
            let map: serde_json::Map<String, serde_json::Value> = names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), (if i == 0 { second } else { first }).into()))
                .collect();
            let j = serde_json::json!({"metadata": {}, "weight_map": map});
            std::fs::write(
                dir.path().join("model.safetensors.index.json"),
                j.to_string(),
            )
            .unwrap();
        };
        index(first);
        assert_eq!(
            read(dir.path(), &cfg).unwrap(),
            units,
            "a sharded folder is read"
        );
        index("model-00002-of-00002.safetensors");
        let e = error(dir.path(), &cfg);
        assert!(
            e.contains("model-00002-of-00002.safetensors") && e.contains("missing"),
            "{e}"
        );
    }
}
