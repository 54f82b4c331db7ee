//! `trainer eval --checkpoint DIR [--data PREFIX_OR_FILE...] [--samples N] [--json]`: the
//! held-out loss and perplexity of a checkpoint, without training.
//!
//! The checkpoint's full weights (from however many ranks wrote it) are loaded into an engine
//! of one rank on this process's device, and each dataset is evaluated as training evaluates
//! its validation data ([`crate::train::evaluate`]): its first N sequences of `seq_len` tokens,
//! in order, the loss averaged over the sequences. Without `--data` it is the run's own
//! validation data (`data.valid`, or the `data.valid_fraction` held out of `data.train`) with
//! the run's `log.eval_samples`, so it prints the val_loss training logged at that step. The
//! weights are gathered for compute as the run gathered them: with qwZ, through its INT8
//! blocks, as the logged val_loss was.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::train;
use checkpoint::from_checkpoint;
use hf::export;
use run::config::{DeviceKind, RunConfig};

/// What `trainer eval` was asked.
pub struct EvalArgs<'a> {
    pub checkpoint: &'a Path,
    /// `--config`: the run's config, where it is not the `config.toml` above the checkpoint.
    pub config: Option<&'a Path>,
    pub data: Vec<PathBuf>,
    pub tokenizer: Option<&'a Path>,
    /// Sequences per dataset (0: all it holds); default the run's `log.eval_samples`.
    pub samples: Option<usize>,
    pub device: Option<DeviceKind>,
    pub json: bool,
}

/// One dataset's result.
#[derive(Debug, Serialize)]
struct DatasetLoss {
    data: String,
    sequences: usize,
    tokens: usize,
    loss: f64,
    perplexity: f64,
}

/// `--json`'s object.
#[derive(Debug, Serialize)]
struct Report {
    checkpoint: String,
    step: u64,
    tokens: u64,
    datasets: Vec<DatasetLoss>,
}

pub fn run(args: &EvalArgs<'_>) -> Result<()> {
    let ckpt = from_checkpoint::resolve(args.checkpoint)?;
    let run = from_checkpoint::run_config(&ckpt, args.config)?;
    if args.data.is_empty() && run.is_none() {
        bail!(
            "no --data given, and no config.toml of the run above {} to take its validation \
             data from (name the data with --data, or the run's config with --config)",
            ckpt.display()
        );
    }
    let mut config = run.clone().unwrap_or_default();
    if let Some(device) = args.device {
        config.train.device = device;
        if device == DeviceKind::Cpu {
            config.train.precision = run::config::Precision::Fp32;
        }
    }
    config.check_supported()?;
    let tokenizer = from_checkpoint::tokenizer(run.as_ref(), args.tokenizer)?;
    let (ckpt, (manifest, (model_cfg, units))) =
        from_checkpoint::read_newest(args.checkpoint, |c| {
            Ok((checkpoint::read_manifest(c)?, export::consolidate(c)?))
        })?;
    let datasets = load_datasets(args, &config, &model_cfg, tokenizer.as_ref())?;

    // One rank holds the whole model. The gathers that decide the forward's weights (qwZ) stay
    // the run's; hpZ and qgZ touch only training, and need a world they fit.
    config.zero.hpz_partition_size = 1;
    config.zero.quantized_gradients = false;
    let device = config.device()?;
    let kernels = crate::startup::check_kernels(&config, &model_cfg, &device)?;
    let _kernels = kernels.as_ref().map(model::KernelPlan::enforce);
    let options = run::engine_options(&config, &device);
    let mut engine = zero::Engine::new(model_cfg.clone(), options, Box::new(comm::Solo))?;
    let full: Vec<Vec<f32>> = units.into_iter().map(|(_, data)| data).collect();
    engine
        .load_parameters(&full)
        .with_context(|| format!("checkpoint {}", ckpt.display()))?;

    let samples = args.samples.unwrap_or(config.log.eval_samples);
    let micro = config.train.micro_batch;
    let seq_len = model_cfg.seq_len;
    let mut results = Vec::new();
    for (name, corpus) in datasets {
        let available = data::Sampler::new(corpus.tokens.len(), seq_len, 0)
            .with_context(|| format!("--data {name}"))?
            .num_samples();
        let n = match samples {
            0 => available,
            n => n.min(available),
        };
        let loss =
            train::evaluate(&engine, &corpus, seq_len, n, micro).with_context(|| name.clone())?;
        results.push(DatasetLoss {
            data: name,
            sequences: n,
            tokens: n * seq_len,
            loss,
            perplexity: loss.exp(),
        });
    }
    let report = Report {
        checkpoint: ckpt.display().to_string(),
        step: manifest.step,
        tokens: manifest.tokens,
        datasets: results,
    };
    print_report(&report, args.json)
}

/// The datasets to evaluate, each named as the report shows it: `--data`'s paths, each its own
/// dataset, or the run's validation data.
fn load_datasets(
    args: &EvalArgs<'_>,
    config: &RunConfig,
    model_cfg: &model::ModelConfig,
    tokenizer: Option<&data::Tokenizer>,
) -> Result<Vec<(String, data::TokenCorpus)>> {
    let column = &config.data.text_column;
    let mut out = Vec::new();
    if args.data.is_empty() {
        let corpora = train::load_data(config, model_cfg.vocab_size, tokenizer)?;
        let valid = corpora
            .valid
            .context("the run has no validation data (data.valid, data.valid_fraction): name some with --data")?;
        out.push(("the run's validation data".to_string(), valid));
        return Ok(out);
    }
    for path in &args.data {
        let name = path.display().to_string();
        let tok = match data::is_text_input(path) {
            true => Some(tokenizer.with_context(|| {
                format!(
                    "{name} is text: it needs the run's tokenizer (the run's config.toml, or --tokenizer)"
                )
            })?),
            false => None,
        };
        let corpus = data::TokenCorpus::load(std::slice::from_ref(path), tok, column)
            .with_context(|| format!("--data {name}"))?;
        if let Some(max) = corpus.tokens.iter().max() {
            if *max as usize >= model_cfg.vocab_size {
                bail!(
                    "--data {name}: token id {max} does not fit the model's vocabulary of {}",
                    model_cfg.vocab_size
                );
            }
        }
        out.push((name, corpus));
    }
    Ok(out)
}

fn print_report(report: &Report, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    println!(
        "checkpoint {} (step {}, {} tokens trained)",
        report.checkpoint, report.step, report.tokens
    );
    println!(
        "{:<40} {:>9} {:>11} {:>8} {:>10}",
        "data", "sequences", "tokens", "loss", "perplexity"
    );
    for d in &report.datasets {
        println!(
            "{:<40} {:>9} {:>11} {:>8.4} {:>10.2}",
            d.data, d.sequences, d.tokens, d.loss, d.perplexity
        );
    }
    Ok(())
}
