//! `trainer generate --checkpoint DIR [--prompt TEXT] [--max-new-tokens N] [--temperature T]
//! [--top-k K] [--seed S]`: text from a checkpoint, on the CPU or the GPU, with a KV cache
//! ([`model::decode`]); and the samples a run writes as it trains (`[log] sample_interval`).
//!
//! The model runs in f32 whatever the device (one sequence is far from any GEMM's speed limit,
//! and f32 gives the tokens transformers gives on the export). Greedy at temperature 0.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use model::decode::{Decoder, Sampling};
use serde::Serialize;

use checkpoint::from_checkpoint;
use hf::export;
use run::config::DeviceKind;

/// What `trainer generate` was asked.
pub struct GenerateArgs<'a> {
    pub checkpoint: &'a Path,
    pub config: Option<&'a Path>,
    pub tokenizer: Option<&'a Path>,
    /// Empty: start a new document (the end-of-document token alone).
    pub prompt: String,
    pub sampling: Sampling,
    /// End at the tokenizer's end-of-document token.
    pub stop_at_eod: bool,
    pub device: Option<DeviceKind>,
    /// One JSON object (token ids and text) instead of the streamed text.
    pub json: bool,
}

/// `--json`'s object.
#[derive(Serialize)]
struct Generated {
    checkpoint: String,
    prompt: String,
    prompt_ids: Vec<u32>,
    ids: Vec<u32>,
    text: String,
}

/// The prompt's tokens: the tokenizer's, or the end-of-document token alone for an empty one.
pub fn prompt_ids(tokenizer: &data::Tokenizer, prompt: &str) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        return Ok(vec![tokenizer.eod_id()]);
    }
    let ids = tokenizer.encode(prompt)?;
    anyhow::ensure!(!ids.is_empty(), "the prompt {prompt:?} has no tokens");
    Ok(ids)
}

/// A decoder over `units` (each unit's full parameters, in model order) on `device`, in f32.
pub fn decoder(cfg: &model::ModelConfig, units: Vec<Vec<f32>>, device: &Device) -> Result<Decoder> {
    let tensors = units
        .into_iter()
        .map(|u| {
            let n = u.len();
            Tensor::from_vec(u, n, device)?.to_dtype(DType::F32)
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok(Decoder::new(cfg.clone(), tensors)?)
}

pub fn run(args: &GenerateArgs<'_>) -> Result<()> {
    let ckpt = from_checkpoint::resolve(args.checkpoint)?;
    let run = from_checkpoint::run_config(&ckpt, args.config)?;
    let tokenizer = from_checkpoint::tokenizer(run.as_ref(), args.tokenizer)?;
    let tokenizer = tokenizer.with_context(|| {
        format!(
            "no tokenizer: the run's config.toml above {} names none that reads; pass \
             --tokenizer",
            ckpt.display()
        )
    })?;
    let (ckpt, (cfg, units)) = from_checkpoint::read_newest(args.checkpoint, export::consolidate)?;
    let kind = args
        .device
        .or(run.as_ref().map(|r| r.train.device))
        .unwrap_or(DeviceKind::Cpu);
    let mut config = run.unwrap_or_default();
    config.train.device = kind;
    config.check_supported()?;
    let device = config.device()?;
    let decoder = decoder(&cfg, units.into_iter().map(|(_, u)| u).collect(), &device)?;
    let prompt = prompt_ids(&tokenizer, &args.prompt)?;

    let mut ids = Vec::new();
    let mut shown = 0;
    let mut out = std::io::stdout().lock();
    if !args.json {
        write!(out, "{}", args.prompt)?;
        out.flush()?;
    }
    let sampling = Sampling {
        stop: args.stop_at_eod.then(|| tokenizer.eod_id()),
        ..args.sampling.clone()
    };
    let generated = decoder.generate(&prompt, &sampling, |id| {
        ids.push(id);
        if !args.json {
            // Byte-level tokens may end inside a character: show text once it is whole.
            if let Ok(text) = tokenizer.decode(&ids) {
                if let Some(new) = text.get(shown..).filter(|t| !t.ends_with('\u{FFFD}')) {
                    let _ = write!(out, "{new}");
                    let _ = out.flush();
                    shown = text.len();
                }
            }
        }
        true
    })?;
    let text = tokenizer.decode(&generated)?;
    if args.json {
        let g = Generated {
            checkpoint: ckpt.display().to_string(),
            prompt: args.prompt.clone(),
            prompt_ids: prompt,
            ids: generated,
            text,
        };
        writeln!(out, "{}", serde_json::to_string(&g)?)?;
    } else {
        write!(out, "{}", text.get(shown..).unwrap_or_default())?;
        writeln!(out)?;
    }
    Ok(())
}
