//! `trainer --config FILE`: the training loop around the ZeRO engine.
//!
//! Everything the run reads (tokenizer, data, checkpoint) is opened and checked before anything
//! is written, so bad input leaves the run directory as it was.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use data::{Sampler, TokenCorpus, Tokenizer};
use zero::{AdamW, Engine, EngineOptions};

use crate::checkpoint;
use crate::config::RunConfig;
use crate::metrics::{self, EvalLine, MetricsWriter, StepLine};
use crate::schedule::learning_rate;

/// Test hook: after completing (and checkpointing) this step, the process kills itself with
/// SIGKILL, as a crash or a preempted job would. Used by the kill-and-resume tests.
pub const KILL_AT_STEP_ENV: &str = "ZEROPP_KILL_AT_STEP";

/// Training and validation tokens.
struct Corpora {
    train: TokenCorpus,
    valid: Option<TokenCorpus>,
}

fn load_data(config: &RunConfig, vocab_size: usize) -> Result<Corpora> {
    let d = &config.data;
    let is_text = |p: &PathBuf| {
        let s = p.to_string_lossy();
        s.ends_with(".jsonl") || s.ends_with(".jsonl.zst")
    };
    let needs_tokenizer = d.train.iter().chain(&d.valid).any(is_text);
    let tokenizer = if needs_tokenizer {
        Some(Tokenizer::from_dir(&d.tokenizer).context("data.tokenizer")?)
    } else {
        None
    };
    let (train, valid) = if !d.valid.is_empty() {
        let train = TokenCorpus::load(&d.train, tokenizer.as_ref()).context("data.train")?;
        let valid = TokenCorpus::load(&d.valid, tokenizer.as_ref()).context("data.valid")?;
        (train, Some(valid))
    } else if d.valid_fraction > 0.0 {
        let (train, valid) =
            TokenCorpus::load_split(&d.train, tokenizer.as_ref(), d.valid_fraction)
                .context("data.train")?;
        (train, Some(valid))
    } else {
        (
            TokenCorpus::load(&d.train, tokenizer.as_ref()).context("data.train")?,
            None,
        )
    };
    for (what, corpus) in [("data.train", Some(&train)), ("data.valid", valid.as_ref())] {
        if let Some(max) = corpus.and_then(|c| c.tokens.iter().max()) {
            if *max as usize >= vocab_size {
                bail!("{what}: token id {max} does not fit model.vocab_size = {vocab_size}");
            }
        }
    }
    Ok(Corpora { train, valid })
}

/// A checkpoint to resume from, fully read.
struct Resume {
    path: PathBuf,
    manifest: checkpoint::Manifest,
    state: checkpoint::RankState,
}

fn find_resume(config: &RunConfig, model_cfg: &model::GptConfig) -> Result<Option<Resume>> {
    if !config.checkpoint.resume {
        return Ok(None);
    }
    let Some(path) = checkpoint::newest(&config.checkpoint_dir())? else {
        return Ok(None);
    };
    let manifest = checkpoint::read_manifest(&path)?;
    if manifest.model != model_cfg.into() {
        bail!(
            "checkpoint {} is of another model shape: {:?}",
            path.display(),
            manifest.model
        );
    }
    if manifest.world_size != config.dist.world_size {
        bail!(
            "checkpoint {} was written by {} ranks; this run has {}",
            path.display(),
            manifest.world_size,
            config.dist.world_size
        );
    }
    let state = checkpoint::read_rank(&path, &manifest, 0)?;
    Ok(Some(Resume {
        path,
        manifest,
        state,
    }))
}

/// Progress on stderr: a bar on a terminal, plain lines otherwise (slurm logs, CI).
struct Reporter {
    bar: Option<indicatif::ProgressBar>,
}

impl Reporter {
    fn new(enabled: Option<bool>, steps: u64, start: u64) -> Self {
        let enabled = enabled.unwrap_or_else(|| std::io::stderr().is_terminal());
        let bar = enabled.then(|| {
            let bar = indicatif::ProgressBar::new(steps).with_position(start);
            let style = indicatif::ProgressStyle::with_template(
                "{bar:30.cyan/blue} step {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Reporter { bar }
    }

    fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn step(&self, line: &StepLine, steps: u64) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(line.step);
                bar.set_message(format!(
                    "loss {:.4} | {:.0} tok/s",
                    line.loss, line.tokens_per_s
                ));
            }
            None => eprintln!(
                "step {}/{steps} | loss {:.4} | lr {:.3e} | grad_norm {:.3} | {:.0} tok/s",
                line.step, line.loss, line.lr, line.grad_norm, line.tokens_per_s
            ),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

fn human_bytes(b: u64) -> String {
    let b = b as f64;
    match b {
        _ if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        _ if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        _ => format!("{:.1} kB", b / 1e3),
    }
}

/// Trains as `config` says.
pub fn run(config: &RunConfig) -> Result<()> {
    config.check_supported()?;
    let model_cfg = config.model_config()?;
    let t = &config.train;
    let seq_len = model_cfg.seq_len;

    // Read and check every input before writing anything.
    let corpora = load_data(config, model_cfg.vocab_size)?;
    let sampler =
        Sampler::new(corpora.train.tokens.len(), seq_len, t.seed).context("data.train")?;
    Sampler::check_batch(t.global_batch, config.dist.world_size, t.micro_batch)
        .context("train.global_batch")?;
    let resume = find_resume(config, &model_cfg)?;
    let run_dir = &config.log.dir;
    let metrics_path = run_dir.join("metrics.jsonl");
    if resume.is_none() && metrics_path.exists() && !config.checkpoint.resume {
        bail!(
            "{} already holds a run; set checkpoint.resume = true to continue it, or choose another log.dir",
            run_dir.display()
        );
    }

    let world = config.dist.world_size;
    let ranks_per_node = config.dist.gpus_per_node.unwrap_or(world);
    let options = EngineOptions {
        zero: config.zero.clone(),
        seed: t.seed,
        recompute: config.model.recompute,
        optimizer: AdamW {
            beta1: t.beta1,
            beta2: t.beta2,
            eps: t.eps,
            weight_decay: t.weight_decay,
        },
        grad_clip: t.grad_clip,
        device: Device::Cpu,
    };
    let mut engine = Engine::new(model_cfg.clone(), options, Box::new(comm::Solo))?;
    let start = match &resume {
        Some(r) => {
            let tensors = &r.state.tensors;
            engine
                .restore(r.manifest.step, &|name| tensors.get(name).cloned())
                .with_context(|| format!("checkpoint {}", r.path.display()))?;
            r.manifest.step
        }
        None => 0,
    };

    std::fs::create_dir_all(run_dir)
        .with_context(|| format!("cannot create {}", run_dir.display()))?;
    metrics::truncate_after(&metrics_path, start)?;
    std::fs::write(run_dir.join("config.toml"), config.to_toml()?)?;
    let mut metrics = MetricsWriter::append(&metrics_path)?;

    let accumulation = config.accumulation();
    let memory = engine.memory_estimate();
    let reporter = Reporter::new(config.log.progress, t.steps, start);
    reporter.println(&format!(
        "model {} params ({} layers, {} wide, {} heads, seq {}) | world {} ({} nodes x {}) | \
         batch {} = {} micro x {} accum x {} ranks | memory per rank: {} sharded states + {} working set | \
         {} train tokens, {} samples",
        model_cfg.num_params(),
        model_cfg.n_layer,
        model_cfg.n_embd,
        model_cfg.n_head,
        seq_len,
        world,
        world / ranks_per_node,
        ranks_per_node,
        t.global_batch,
        t.micro_batch,
        accumulation,
        world,
        human_bytes(memory.sharded_bytes),
        human_bytes(memory.working_bytes),
        corpora.train.tokens.len(),
        sampler.num_samples(),
    ));
    if let Some(r) = &resume {
        reporter.println(&format!(
            "resumed from {} at step {start}",
            r.path.display()
        ));
    }

    if start == 0 && config.log.eval_samples > 0 {
        if let Some(valid) = &corpora.valid {
            let val_loss = evaluate(&engine, valid, seq_len, config)?;
            metrics.write(&EvalLine {
                step: 0,
                tokens: 0,
                val_loss,
            })?;
            reporter.println(&format!("step 0 | val_loss {val_loss:.4}"));
        }
    }
    let kill_at: Option<u64> = std::env::var(KILL_AT_STEP_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    let tokens_per_step = (t.global_batch * seq_len) as u64;
    let mut since_log = (Instant::now(), engine.comm().counters(), 0u64);
    for step in start + 1..=t.steps {
        let mut loss_sum = 0.0;
        for micro in 0..accumulation {
            let ids =
                sampler.micro_batch_ids(step - 1, t.global_batch, world, 0, micro, t.micro_batch);
            let (inputs, targets) = sampler.gather(&corpora.train.tokens, &ids);
            loss_sum += engine.forward_backward(&inputs, &targets, 1.0 / accumulation as f32)?;
        }
        let loss = engine.mean_over_world(loss_sum / accumulation as f64)?;
        let lr = learning_rate(t, step);
        let stats = engine.step(lr)?;
        since_log.2 += 1;

        let last = step == t.steps;
        if step % config.log.interval == 0 || last {
            let (since, counters, n) = since_log;
            let bytes = engine.comm().counters() - counters;
            let line = StepLine {
                step,
                tokens: step * tokens_per_step,
                loss,
                lr,
                grad_norm: stats.grad_norm,
                tokens_per_s: (n * tokens_per_step) as f64 / since.elapsed().as_secs_f64(),
                comm_intra_bytes: bytes.intra / n,
                comm_inter_bytes: bytes.inter / n,
            };
            metrics.write(&line)?;
            reporter.step(&line, t.steps);
        }
        let eval_due = config.log.eval_interval > 0 && step % config.log.eval_interval == 0;
        if let Some(valid) = corpora
            .valid
            .as_ref()
            .filter(|_| (eval_due || last) && config.log.eval_samples > 0)
        {
            let val_loss = evaluate(&engine, valid, seq_len, config)?;
            metrics.write(&EvalLine {
                step,
                tokens: step * tokens_per_step,
                val_loss,
            })?;
            reporter.println(&format!("step {step} | val_loss {val_loss:.4}"));
        }
        let ckpt_due = config.checkpoint.interval > 0 && step % config.checkpoint.interval == 0;
        if ckpt_due || last {
            save(
                config,
                &engine,
                &model_cfg,
                step,
                step * tokens_per_step,
                ranks_per_node,
            )?;
        }
        if kill_at == Some(step) {
            kill_self();
        }
        if step % config.log.interval == 0 || last {
            since_log = (Instant::now(), engine.comm().counters(), 0);
        }
    }
    reporter.finish();
    if start >= t.steps {
        reporter.println(&format!(
            "already trained to step {start} of {}; nothing to do",
            t.steps
        ));
    }
    Ok(())
}

/// Mean loss over the first `log.eval_samples` validation sequences, in order.
fn evaluate(
    engine: &Engine,
    valid: &TokenCorpus,
    seq_len: usize,
    config: &RunConfig,
) -> Result<f64> {
    let sampler = Sampler::new(valid.tokens.len(), seq_len, 0).context("validation data")?;
    let n = config.log.eval_samples.min(sampler.num_samples());
    let ids: Vec<usize> = (0..n).collect();
    let mut total = 0.0;
    for chunk in ids.chunks(config.train.micro_batch) {
        let (inputs, targets) = sampler.gather(&valid.tokens, chunk);
        total += engine.eval_loss(&inputs, &targets)? * chunk.len() as f64;
    }
    Ok(total / n as f64)
}

fn save(
    config: &RunConfig,
    engine: &Engine,
    model_cfg: &model::GptConfig,
    step: u64,
    tokens: u64,
    ranks_per_node: usize,
) -> Result<()> {
    let dir = config.checkpoint_dir();
    let tmp = checkpoint::begin(&dir, step)?;
    checkpoint::write_rank(&tmp, 0, step, &engine.state())?;
    let topology = comm::Topology::new(config.dist.world_size, ranks_per_node)?;
    checkpoint::commit(
        &dir,
        &tmp,
        &checkpoint::manifest(step, tokens, topology, model_cfg),
    )?;
    Ok(())
}

/// The SIGKILL of [`KILL_AT_STEP_ENV`]: no destructor, no flush beyond what was written.
fn kill_self() -> ! {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    std::process::abort();
}
