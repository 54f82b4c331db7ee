//! `model.init_from = "DIR"`: a run's first weights read from a Hugging Face safetensors folder
//! (`config.json` and `model.safetensors`, or shards listed by `model.safetensors.index.json`),
//! the inverse of `trainer export`: each of the model's parameters is found by its Hugging Face
//! name ([`model::Model::hf_tensor`]), turned back to our orientation and checked against our
//! shape. A vocabulary matrix with fewer rows than ours (GPT-2's 50,257 against our 50,304) is
//! padded with zero rows, as Megatron pads. Anything that does not fit is one line naming the
//! tensor or the setting.

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
            let file =
                std::fs::File::open(f).with_context(|| format!("{}: cannot open", at("")))?;
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
            let hf = model.hf_tensor(p);
            // HF GPT-2 checkpoints on the hub often name tensors without `transformer.`.
            let short = hf.name.strip_prefix("transformer.").map(str::to_string);
            let Some((name, (file, view))) = [Some(hf.name.clone()), short]
                .into_iter()
                .flatten()
                .find_map(|n| tensors.get(&n).map(|t| (n, t)))
            else {
                bail!("{}: no tensor {}", at(""), hf.name);
            };
            used.insert(name.clone());
            let got = read_f32(view.dtype(), view.data())
                .with_context(|| format!("model.init_from: {name} in {}", file.display()))?;
            let ours = &mut values[p.offset..p.offset + p.numel];
            match (hf.transpose, p.shape.as_slice(), view.shape()) {
                (true, &[rows, cols], &[hc, hr]) if hc == cols && hr == rows => {
                    for r in 0..rows {
                        for c in 0..cols {
                            ours[r * cols + c] = got[c * rows + r];
                        }
                    }
                }
                (false, shape, theirs) if shape == theirs => ours.copy_from_slice(&got),
                // A vocabulary of fewer rows: the rest stay zero.
                (false, &[v, c], &[hv, hc]) if hc == c && hv < v && is_vocab(&p.name) => {
                    ours[..hv * c].copy_from_slice(&got);
                }
                (_, _, theirs) => bail!(
                    "model.init_from: {name} is {theirs:?} in {}, this model's is {:?}",
                    file.display(),
                    match hf.transpose {
                        true => p.shape.iter().rev().copied().collect::<Vec<_>>(),
                        false => p.shape.clone(),
                    }
                ),
            }
        }
        units.push(values);
    }
    for name in tensors.keys() {
        let buffer = name.ends_with(".attn.bias")
            || name.ends_with(".attn.masked_bias")
            || name.ends_with("rotary_emb.inv_freq");
        // A tied head saved anyway (some exports write it): it is the embedding.
        let tied_head = name == "lm_head.weight" && cfg.tie_embeddings;
        if !used.contains(name) && !buffer && !tied_head {
            bail!(
                "{}: {name} has no place in this model (model.tie_embeddings = {}?)",
                at(""),
                cfg.tie_embeddings
            );
        }
    }
    Ok(units)
}

/// The token embedding's or LM head's matrix, whose rows are the vocabulary.
fn is_vocab(name: &str) -> bool {
    ["wte.weight", "embed_tokens.weight", "lm_head.weight"].contains(&name)
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
    if cfg.arch == model::Arch::Llama {
        if !j["rope_scaling"].is_null() {
            bail!("model.init_from: {at} sets rope_scaling, which zeropp's Llama does not take");
        }
        let close = |key: &str, ours: f64, default: f64| -> Result<()> {
            let theirs = j[key].as_f64().unwrap_or(default);
            if (theirs - ours).abs() > 1e-9 * ours.abs().max(1.0) {
                bail!("model.init_from: {at} has {key} = {theirs}, this run {ours}: set it in [model]");
            }
            Ok(())
        };
        close("rope_theta", cfg.rope_theta, 10_000.0)?;
        close("rms_norm_eps", cfg.norm_eps, 1e-6)?;
        let tied = j["tie_word_embeddings"].as_bool().unwrap_or(false);
        if tied != cfg.tie_embeddings {
            bail!(
                "model.init_from: {at} has tie_word_embeddings = {tied}, this run model.tie_embeddings = {}",
                cfg.tie_embeddings
            );
        }
    }
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
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
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
