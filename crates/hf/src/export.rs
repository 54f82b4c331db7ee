//! `trainer export`: one consolidated safetensors file from a sharded checkpoint, with the
//! tensor names and shapes of Hugging Face's class for the architecture (`GPT2LMHeadModel`:
//! `transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight`, ...; `LlamaForCausalLM`:
//! `model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`, ..., `lm_head.weight`
//! when untied; a packed projection split into its Hugging Face tensors by columns), as the
//! model names them ([`model::Model::hf_tensors`]), plus the `config.json` that transformers'
//! `from_pretrained` reads from the same folder. A tied LM head is not written twice, as
//! `save_pretrained` does not.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, TensorView};

use checkpoint::from_checkpoint;

/// Every unit's layout with its full, unpadded fp32 parameters, in model order.
pub type UnitParameters = Vec<(model::UnitLayout, Vec<f32>)>;

/// The full fp32 parameters of every unit, gathered from all ranks' shards. The manifest and
/// each rank file are checked as a resume checks them ([`checkpoint::read_manifest`],
/// [`checkpoint::read_rank`]): a folder whose manifest disagrees with its name or its files is
/// refused, not exported with shards in the wrong places.
pub fn consolidate(ckpt: &Path) -> Result<(model::ModelConfig, UnitParameters)> {
    let manifest = checkpoint::read_manifest(ckpt)?;
    let cfg = manifest
        .model
        .config()
        .with_context(|| format!("checkpoint {}", ckpt.display()))?;
    let layout = model::ModelLayout::new(&cfg);
    let mut full: Vec<Vec<f32>> = vec![Vec::new(); layout.units.len()];
    for rank in 0..manifest.world_size {
        let state = checkpoint::read_rank(ckpt, &manifest, rank)?;
        for (u, unit) in layout.units.iter().enumerate() {
            let name = format!("{}.master", unit.name);
            let shard = state.tensors.get(&name).with_context(|| {
                format!("checkpoint {}: rank {rank} has no {name}", ckpt.display())
            })?;
            full[u].extend_from_slice(shard);
        }
    }
    let mut out = Vec::with_capacity(full.len());
    for (unit, mut data) in layout.units.into_iter().zip(full) {
        if data.len() < unit.numel {
            bail!(
                "checkpoint {}: {} holds {} elements, the model needs {}",
                ckpt.display(),
                unit.name,
                data.len(),
                unit.numel
            );
        }
        data.truncate(unit.numel);
        // Written before q|k|v and gate|up were packed: their columns side by side now.
        if manifest.model.legacy_layout() {
            cfg.family().repack_legacy(&cfg, &unit, &mut data);
        }
        out.push((unit, data));
    }
    Ok((cfg, out))
}

/// Writes `units` (full, unpadded) to `output` with Hugging Face names, and `config.json`
/// beside it, both or neither ([`write_all`]): the export of parameters made in memory (the
/// tests' own).
pub fn write_hf(
    cfg: &model::ModelConfig,
    units: &[(model::UnitLayout, Vec<f32>)],
    output: &Path,
    eod: Option<u32>,
) -> Result<()> {
    write_all(hf_files(cfg, units, output, eod)?)
}

/// The files [`write_hf`] writes: the safetensors file at `output`, `config.json` beside it.
fn hf_files(
    cfg: &model::ModelConfig,
    units: &[(model::UnitLayout, Vec<f32>)],
    output: &Path,
    eod: Option<u32>,
) -> Result<Vec<ExportFile<'static>>> {
    let model = model::Model::new(cfg.clone())?;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (unit, data) in units {
        for p in &unit.params {
            let values = &data[p.offset..p.offset + p.numel];
            let cols = p.shape.last().copied().unwrap_or(1);
            let rows = p.numel / cols.max(1);
            for hf in model.hf_tensors(p) {
                // This tensor's columns of ours, `(rows, width)` row-major.
                let width = hf.columns.len();
                let part: std::borrow::Cow<[f32]> = match width == cols {
                    true => values.into(),
                    false => (0..rows)
                        .flat_map(|r| {
                            &values[r * cols + hf.columns.start..r * cols + hf.columns.end]
                        })
                        .copied()
                        .collect(),
                };
                let bytes = match hf.transpose {
                    true => transposed_bytes(&part, rows, width),
                    false => part.iter().flat_map(|v| v.to_le_bytes()).collect(),
                };
                tensors.push((hf.name.clone(), hf.shape(p), bytes));
            }
        }
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let write_weights = move |at: &Path| -> Result<()> {
        let mut views = Vec::with_capacity(tensors.len());
        for (name, shape, bytes) in &tensors {
            views.push((name, TensorView::new(Dtype::F32, shape.clone(), bytes)?));
        }
        // Streamed to the file: a large model's bytes are not held twice.
        Ok(safetensors::serialize_to_file(views, Some(meta), at)?)
    };
    let config = serde_json::to_string_pretty(&cfg.family().hf_config(cfg, eod))?;
    Ok(vec![
        (output.to_path_buf(), Box::new(write_weights)),
        (
            output.with_file_name("config.json"),
            bytes(config.into_bytes()),
        ),
    ])
}

/// One file of an export: where it goes, and what writes it to a given path.
type ExportFile<'a> = (PathBuf, Box<dyn FnOnce(&Path) -> Result<()> + 'a>);

/// An [`ExportFile`] writer of `data`.
fn bytes<'a>(data: Vec<u8>) -> Box<dyn FnOnce(&Path) -> Result<()> + 'a> {
    Box::new(move |at: &Path| Ok(std::fs::write(at, data)?))
}

/// Writes every file under a temporary name beside it and renames them into place only when
/// all are written, so that a failed write (a full disk, a `config.json` that cannot be
/// replaced) leaves no half export: the files that were there stay as they were.
fn write_all(files: Vec<ExportFile>) -> Result<()> {
    let tmp = |p: &Path| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        p.with_file_name(format!(".{name}.tmp"))
    };
    let paths: Vec<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
    // A rename cannot replace a folder: found now, before any file is replaced.
    if let Some(folder) = paths.iter().find(|p| p.is_dir()) {
        bail!("cannot write {}: it is a folder", folder.display());
    }
    let clean = |from: usize| {
        for path in &paths[from..] {
            let _ = std::fs::remove_file(tmp(path));
        }
    };
    for (path, write) in files {
        if let Err(e) = write(&tmp(&path)) {
            clean(0);
            return Err(e).with_context(|| format!("cannot write {}", path.display()));
        }
    }
    for (i, path) in paths.iter().enumerate() {
        if let Err(e) = std::fs::rename(tmp(path), path) {
            clean(i);
            return Err(e).with_context(|| format!("cannot write {}", path.display()));
        }
    }
    Ok(())
}

/// Refuses an `--output` inside the checkpoint folder that holds `ckpt` (the folder of its
/// `step_<N>` siblings; `ckpt` itself when it is a copy named otherwise), or inside any
/// checkpoint (a folder with a `manifest.json`): an export there would overwrite the files it
/// reads, or leave files that a resume or retention then trips over.
fn check_output_outside(ckpt: &Path, output: &Path) -> Result<()> {
    // The output's folder may not exist yet: resolve its nearest existing ancestor.
    let resolved = |p: &Path| -> Option<PathBuf> {
        let mut rest = Vec::new();
        let mut at = p;
        loop {
            if let Ok(real) = at.canonicalize() {
                return Some(rest.iter().rev().fold(real, |acc, n| acc.join(n)));
            }
            rest.push(at.file_name()?.to_os_string());
            at = at
                .parent()
                .filter(|a| !a.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
        }
    };
    let in_folder = ckpt
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("step_"));
    let folder = match in_folder {
        true => ckpt.parent(),
        false => Some(ckpt),
    };
    let (Some(out_dir), Some(folder)) = (
        resolved(
            output
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        ),
        folder.and_then(resolved),
    ) else {
        return Ok(());
    };
    if out_dir.starts_with(&folder) {
        bail!(
            "--output {} is inside the checkpoint folder {}: export outside it",
            output.display(),
            folder.display()
        );
    }
    if let Some(step) = out_dir
        .ancestors()
        .find(|d| d.join("manifest.json").is_file())
    {
        bail!(
            "--output {} is inside the checkpoint {}: export outside it",
            output.display(),
            step.display()
        );
    }
    Ok(())
}

/// `values`, a row-major `rows x cols` matrix, as the little-endian bytes of its transpose.
fn transposed_bytes(values: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 * values.len());
    for c in 0..cols {
        for r in 0..rows {
            out.extend_from_slice(&values[r * cols + c].to_le_bytes());
        }
    }
    out
}

/// `trainer export --checkpoint DIR --output FILE [--tokenizer T]`: DIR is a `step_<N>`
/// folder, or a checkpoint folder whose newest step is taken. The tokenizer (`T`, else the
/// run's) is written beside the weights as `tokenizer.json`, its end-of-document token as the
/// config's BOS and EOS.
pub fn export(checkpoint_dir: &Path, output: &Path, tokenizer: Option<&Path>) -> Result<()> {
    check_output_outside(&from_checkpoint::resolve(checkpoint_dir)?, output)?;
    let (ckpt, (cfg, units)) = from_checkpoint::read_newest(checkpoint_dir, consolidate)?;
    // The run's config may be gone or unreadable: the export needs only its tokenizer.
    let run = from_checkpoint::run_config(&ckpt, None).unwrap_or(None);
    let tokenizer = from_checkpoint::tokenizer(run.as_ref(), tokenizer)?;
    let mut files = hf_files(&cfg, &units, output, tokenizer.as_ref().map(|t| t.eod_id()))?;
    match &tokenizer {
        Some(t) => files.push((output.with_file_name("tokenizer.json"), bytes(t.to_json()?))),
        None => eprintln!(
            "no tokenizer.json written: the run's tokenizer was not found (pass --tokenizer)"
        ),
    }
    write_all(files)?;
    eprintln!(
        "exported {} ({} parameters) to {}",
        ckpt.display(),
        cfg.num_params(),
        output.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use comm::Communicator;
    use zero::{Engine, EngineOptions};

    /// A W = 4 (2 x 2) engine trained two steps, checkpointed and exported: the file's tensors
    /// equal the parameters the engine gathers, under Hugging Face's names and shapes.
    #[test]
    fn export_equals_the_gathered_parameters() {
        let cfg = model::ModelConfig::gpt2(2, 16, 2, 8, 37);
        let dir = tempfile::tempdir().unwrap();
        let ckpt_dir = dir.path().join("ckpt");
        let topology = comm::Topology::new(4, 2).unwrap();
        let gathered = comm::run_local(topology, |c| -> anyhow::Result<UnitParameters> {
            let rank = c.rank();
            let opts = EngineOptions {
                total_steps: 100,
                seed: 3,
                ..Default::default()
            };
            let mut e = Engine::new(cfg.clone(), opts, Box::new(c))?;
            let tokens: Vec<u32> = (0..16).map(|i| (i * 7 + rank as u32) % 37).collect();
            for _ in 0..2 {
                e.forward_backward(&tokens, &tokens, 1.0)?;
                e.step(1e-2)?;
            }
            if rank == 0 {
                checkpoint::begin(&ckpt_dir, 2, "export-test")?;
            }
            e.comm().barrier(comm::Group::World).wait()?;
            let crc =
                checkpoint::write_rank(&checkpoint::tmp_dir(&ckpt_dir, 2), rank, 2, &e.state()?)?;
            let checksums = checkpoint::exchange_checksums(e.comm(), crc)?;
            if rank == 0 {
                checkpoint::commit(
                    &ckpt_dir,
                    &checkpoint::tmp_dir(&ckpt_dir, 2),
                    &checkpoint::manifest(
                        2,
                        0,
                        topology,
                        &cfg,
                        1,
                        &Default::default(),
                        &checksums,
                        "export-test",
                    ),
                )?;
            }
            Ok(e.gathered_parameters()?)
        })
        .unwrap();
        let (_, consolidated) = consolidate(&checkpoint::step_dir(&ckpt_dir, 2)).unwrap();
        assert_eq!(
            consolidated.iter().map(|(_, p)| p).collect::<Vec<_>>(),
            gathered[0].iter().map(|(_, p)| p).collect::<Vec<_>>()
        );

        let out = dir.path().join("hf/model.safetensors");
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        export(&ckpt_dir, &out, Some(Path::new("../../data/gpt2"))).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let c_attn = st.tensor("transformer.h.1.attn.c_attn.weight").unwrap();
        assert_eq!(c_attn.shape(), &[16, 48]);
        assert_eq!(
            st.tensor("transformer.wte.weight").unwrap().shape(),
            &[37, 16]
        );
        assert_eq!(st.names().len(), 2 + 12 * 2 + 2);
        let (unit, params) = &gathered[0][2];
        let spec = unit.param("attn.c_attn.weight");
        let expected: Vec<u8> = params[spec.offset..spec.offset + spec.numel]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(c_attn.data(), &expected[..]);
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.with_file_name("config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(config["n_layer"], 2);
        assert_eq!(config["eos_token_id"], 50256);
        assert!(out.with_file_name("tokenizer.json").is_file());
        // model.init_from reads the export back as it was.
        let back = crate::init_from::read(out.parent().unwrap(), &cfg).unwrap();
        assert_eq!(
            back.iter().collect::<Vec<_>>(),
            consolidated.iter().map(|(_, p)| p).collect::<Vec<_>>()
        );
    }

    /// A Llama export, tied and untied: HF's names, linear weights transposed to `(out, in)`,
    /// the `LlamaForCausalLM` config, and `model.init_from` reading back what was written.
    #[test]
    fn a_llama_export_is_read_back_by_init_from() {
        for tied in [true, false] {
            let cfg = model::ModelConfig::llama(2, 16, 4, 2, 24, 8, 37, tied);
            let model = model::Model::new(cfg.clone()).unwrap();
            let units: UnitParameters = model
                .units()
                .iter()
                .map(|u| {
                    let mut v = vec![0f32; u.numel];
                    model::init_unit_range(&cfg, u, 9, 0, &mut v);
                    (u.clone(), v)
                })
                .collect();
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("model.safetensors");
            write_hf(&cfg, &units, &out, Some(0)).unwrap();
            let bytes = std::fs::read(&out).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            // k_proj is the packed q|k|v's columns 16..24 (q 4 x 4 wide, k and v 2 x 4), as
            // `(out, in)`; up_proj gate|up's second half, the same way.
            let block = &units[2];
            for (name, packed, cols, width) in [
                (
                    "self_attn.k_proj.weight",
                    "self_attn.qkv_proj.weight",
                    16..24,
                    32,
                ),
                ("mlp.up_proj.weight", "mlp.gate_up_proj.weight", 24..48, 48),
            ] {
                let t = st.tensor(&format!("model.layers.1.{name}")).unwrap();
                assert_eq!(t.shape(), &[cols.len(), 16], "{name}: (out, in)");
                let p = block.0.param(packed);
                let ours = &block.1[p.offset..p.offset + p.numel];
                let expected: Vec<u8> = cols
                    .clone()
                    .flat_map(|c| (0..16).map(move |r| ours[r * width + c]))
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                assert_eq!(t.data(), &expected[..], "{name}");
            }
            let head = st.tensor("lm_head.weight").is_ok();
            assert_eq!(head, !tied);
            let config: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.path().join("config.json")).unwrap(),
            )
            .unwrap();
            assert_eq!(config["model_type"], "llama");
            assert_eq!(config["num_key_value_heads"], 2);
            assert_eq!(config["tie_word_embeddings"], tied);
            let back = crate::init_from::read(dir.path(), &cfg).unwrap();
            assert_eq!(
                back.iter().collect::<Vec<_>>(),
                units.iter().map(|(_, p)| p).collect::<Vec<_>>()
            );
            // Another shape is refused in one line naming the tensor.
            let other = model::ModelConfig::llama(2, 16, 4, 4, 24, 8, 37, tied);
            let e = format!(
                "{:#}",
                crate::init_from::read(dir.path(), &other).unwrap_err()
            );
            assert!(e.contains("k_proj") && !e.contains('\n'), "{e}");
            let gpt = model::ModelConfig::gpt2(2, 16, 4, 8, 37);
            let e = format!(
                "{:#}",
                crate::init_from::read(dir.path(), &gpt).unwrap_err()
            );
            assert!(e.contains("\"llama\" model"), "{e}");
        }
    }

    /// The sizes of the tests' small model of every family (2 x 16, 4 heads, 2 of keys and
    /// values, F = 24, vocabulary 37).
    fn tiny_sizes() -> model::Sizes {
        model::Sizes {
            n_layer: 2,
            n_embd: 16,
            n_head: 4,
            seq_len: 8,
            vocab_size: 37,
            n_kv_head: Some(2),
            head_dim: None,
            ffn_hidden: Some(24),
            tie_embeddings: None,
        }
    }

    /// A checkpoint of every Llama-style family written before q|k|v and gate|up were packed
    /// (its manifest's record without `packed`; in each block q, k and v, their biases, gate
    /// and up a matrix after another) is consolidated as the packed parameters it holds: the
    /// same model, exported as it was trained.
    #[test]
    fn a_checkpoint_of_unpacked_projections_is_consolidated_packed() {
        let sizes = tiny_sizes();
        // `packed (R, sum w)`'s column blocks as the matrices `(R, w_i)` one after another.
        let unpacked = |packed: &[f32], widths: &[usize]| -> Vec<f32> {
            let total: usize = widths.iter().sum();
            let mut out = Vec::with_capacity(packed.len());
            let mut col = 0;
            for w in widths {
                for row in packed.chunks(total) {
                    out.extend_from_slice(&row[col..col + w]);
                }
                col += w;
            }
            out
        };
        let shapes = model::every_family(&sizes);
        for (name, cfg) in shapes.into_iter().filter(|(_, c)| c.arch.name() != "gpt2") {
            let model = model::Model::new(cfg.clone()).unwrap();
            let (q, kv, f) = (16, 8, 24);
            let mut packed = Vec::new();
            let mut shards = Vec::new();
            for (u, unit) in model.units().iter().enumerate() {
                let mut v = vec![0f32; unit.numel];
                model::init_unit_range(&cfg, unit, 9, 0, &mut v);
                let mut legacy = v.clone();
                for p in &unit.params {
                    let widths = match p.name.rsplit('.').nth(1) {
                        Some("qkv_proj") => vec![q, kv, kv],
                        Some("gate_up_proj") => vec![f, f],
                        _ => continue,
                    };
                    let range = p.offset..p.offset + p.numel;
                    legacy[range.clone()].copy_from_slice(&unpacked(&v[range], &widths));
                }
                assert_eq!(legacy != v, u > 0 && u <= 2, "{name}: only blocks change");
                shards.push(zero::NamedShard {
                    name: format!("{}.master", unit.name),
                    data: legacy,
                });
                packed.push(v);
            }
            let dir = tempfile::tempdir().unwrap();
            let tmp = checkpoint::begin(dir.path(), 1, "legacy").unwrap();
            let crc = checkpoint::write_rank(&tmp, 0, 1, &shards).unwrap();
            let topology = comm::Topology::new(1, 1).unwrap();
            let m = checkpoint::manifest(
                1,
                0,
                topology,
                &cfg,
                1,
                &Default::default(),
                &[crc],
                "legacy",
            );
            assert!(!m.model.legacy_layout(), "{name}: this trainer's manifest");
            let ckpt = checkpoint::commit(dir.path(), &tmp, &m).unwrap();
            let path = ckpt.join("manifest.json");
            let mut json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let record = json["model"][cfg.arch.name()].as_object_mut().unwrap();
            assert_eq!(record.remove("packed"), Some(true.into()), "{name}");
            std::fs::write(&path, json.to_string()).unwrap();
            assert!(checkpoint::read_manifest(&ckpt)
                .unwrap()
                .model
                .legacy_layout());
            let (_, consolidated) = consolidate(&ckpt).unwrap();
            assert_eq!(
                consolidated.into_iter().map(|(_, p)| p).collect::<Vec<_>>(),
                packed,
                "{name}"
            );
        }
    }

    /// Every family, tied and untied where it has both: what an export writes, `init_from`
    /// reads back as it was, and the config.json names the family and its class.
    #[test]
    fn every_family_is_read_back_by_init_from() {
        let shapes = model::every_family(&tiny_sizes());
        for (name, cfg) in shapes {
            let model = model::Model::new(cfg.clone()).unwrap();
            let units: UnitParameters = model
                .units()
                .iter()
                .map(|u| {
                    let mut v = vec![0f32; u.numel];
                    model::init_unit_range(&cfg, u, 9, 0, &mut v);
                    (u.clone(), v)
                })
                .collect();
            let dir = tempfile::tempdir().unwrap();
            write_hf(&cfg, &units, &dir.path().join("model.safetensors"), Some(0)).unwrap();
            let config: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.path().join("config.json")).unwrap(),
            )
            .unwrap();
            assert_eq!(config["model_type"], cfg.arch.name(), "{name}");
            assert_eq!(
                config["architectures"][0],
                cfg.family().hf_class(),
                "{name}"
            );
            let back = crate::init_from::read(dir.path(), &cfg).unwrap();
            assert_eq!(
                back.iter().collect::<Vec<_>>(),
                units.iter().map(|(_, p)| p).collect::<Vec<_>>(),
                "{name}"
            );
        }
    }

    /// transformers loads an export (`AutoModelForCausalLM`: `GPT2LMHeadModel`, and each
    /// family of Llama's block, tied and untied) and its loss on the same tokens equals ours within
    /// 1e-5 relative. The weights are drawn far from the initialisation (uniform, large), so
    /// that a tensor in the wrong place or orientation moves the loss by far more than that.
    /// `ZEROPP_HF_PYTHON` names a python with torch and transformers (`.ci/run` makes one).
    #[test]
    #[ignore = "needs torch and transformers: .ci/run sets ZEROPP_HF_PYTHON"]
    fn transformers_loads_the_export_with_our_loss() {
        use candle_core::{Device, Tensor};
        let python = std::env::var("ZEROPP_HF_PYTHON")
            .expect("ZEROPP_HF_PYTHON: a python with torch and transformers");
        // Every family, tied and untied where it has both ([`model::every_family`]); and a
        // Llama with Llama 3's rope scaling from a context of 4, so that it turns the angles
        // of these 16 positions.
        let mut configs = model::every_family(&model::Sizes {
            n_layer: 2,
            n_embd: 32,
            n_head: 4,
            seq_len: 16,
            vocab_size: 97,
            n_kv_head: Some(2),
            head_dim: None,
            ffn_hidden: Some(48),
            tie_embeddings: None,
        });
        let mut scaled = model::ModelConfig::llama(2, 32, 4, 2, 48, 16, 97, false);
        scaled.rope_scaling = model::RopeScaling::Llama3 {
            factor: 4.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 4,
        };
        configs.push(("llama scaled".into(), scaled));
        // Qwen3's heads wider than n_embd / n_head (16 against 8), and a Mistral whose window
        // covers the whole context (kept, exported, and a full causal mask in transformers).
        let wide = model::qwen3::QWEN3.shape(2, 32, 4, 2, 16, 48, 16, 97, false);
        configs.push(("qwen3 head_dim 16".into(), wide));
        let mut window = model::mistral::MISTRAL.shape(2, 32, 4, 2, 8, 48, 16, 97, false);
        window.sliding_window = Some(16);
        configs.push(("mistral window 16".into(), window));
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        for (name, cfg) in configs {
            let model = model::Model::new(cfg.clone()).unwrap();
            let units: UnitParameters = model
                .units()
                .iter()
                .map(|u| {
                    let mut v = vec![0f32; u.numel];
                    for p in &u.params {
                        for x in &mut v[p.offset..p.offset + p.numel] {
                            let r = uniform();
                            *x = match p.init {
                                model::ParamInit::Ones => (1.0 + 0.5 * r) as f32,
                                model::ParamInit::Zeros => (0.1 * r) as f32,
                                model::ParamInit::Normal { .. } => (0.3 * r) as f32,
                            };
                        }
                    }
                    (u.clone(), v)
                })
                .collect();
            let (b, t) = (2, cfg.seq_len);
            let seq: Vec<u32> = (0..b * (t + 1))
                .map(|_| ((uniform() + 1.0) / 2.0 * cfg.vocab_size as f64) as u32 % 97)
                .collect();
            let rows = |off: usize| -> Vec<Vec<u32>> {
                (0..b)
                    .map(|i| seq[i * (t + 1) + off..i * (t + 1) + off + t].to_vec())
                    .collect()
            };
            let (inputs, targets) = (rows(0), rows(1));
            let tensor = |r: &Vec<Vec<u32>>| {
                let flat: Vec<u32> = r.iter().flatten().copied().collect();
                Tensor::from_vec(flat, (b, t), &Device::Cpu).unwrap()
            };
            let params: Vec<Tensor> = units
                .iter()
                .map(|(_, v)| Tensor::from_vec(v.clone(), v.len(), &Device::Cpu).unwrap())
                .collect();
            let ours = model
                .loss(&params, &tensor(&inputs), &tensor(&targets))
                .unwrap();
            let dir = tempfile::tempdir().unwrap();
            write_hf(&cfg, &units, &dir.path().join("model.safetensors"), Some(0)).unwrap();
            let tokens = dir.path().join("tokens.json");
            let j = serde_json::json!({ "inputs": inputs, "targets": targets });
            std::fs::write(&tokens, j.to_string()).unwrap();
            let out = std::process::Command::new(&python)
                .arg("../../scripts/hf-check.py")
                .arg(dir.path())
                .arg("--tokens")
                .arg(&tokens)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "hf-check.py: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8_lossy(&out.stdout);
            let got: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
            let theirs = got["loss"].as_f64().unwrap();
            eprintln!(
                "{name} {}: ours {ours:.6}, transformers {theirs:.6}",
                got["class"]
            );
            assert!(
                (theirs - ours).abs() <= 1e-5 * ours,
                "{name}: transformers {theirs} vs ours {ours}"
            );
        }
    }
}
