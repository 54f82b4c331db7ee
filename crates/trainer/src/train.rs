//! `trainer --config FILE`: the training loop around the ZeRO engine.
//!
//! Everything the run reads (tokenizer, data, checkpoint) is opened and checked before anything
//! is written, so bad input leaves the run directory as it was.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use data::{Sampler, TokenCorpus, Tokenizer};
use zero::{AdamW, Engine, EngineOptions};

use crate::checkpoint;
use crate::config::{Backend, RunConfig};
use crate::launch;
use crate::metrics::{self, EvalLine, MetricsWriter, StepLine};
use crate::schedule::learning_rate;
use crate::units;

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

/// A checkpoint to resume from: its manifest, checked against this run; each rank reads its
/// own file.
struct Resume {
    path: PathBuf,
    manifest: checkpoint::Manifest,
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
    Ok(Some(Resume { path, manifest }))
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

/// What every rank reads and nobody changes.
struct Shared<'a> {
    config: &'a RunConfig,
    model_cfg: model::GptConfig,
    topology: comm::Topology,
    corpora: Corpora,
    sampler: Sampler,
    resume: Option<Resume>,
    /// One device for every rank: the local backend's ranks share it (and its stream), so their
    /// collectives are device-to-device copies.
    device: candle_core::Device,
}

/// Trains as `config` says: with the `local` backend one thread per simulated rank; with
/// `nccl` or `mpi` this process is one rank of the world its launcher started.
pub fn run(config: &RunConfig) -> Result<()> {
    config.check_supported()?;
    if config.dist.backend == Backend::Local {
        let world = config.dist.world_size;
        let topology = comm::Topology::new(world, config.dist.gpus_per_node.unwrap_or(world))?;
        let shared = prepare(config, topology, config.device()?)?;
        if world == 1 {
            return rank_main(&shared, Box::new(comm::Solo));
        }
        comm::run_local(topology, |c| {
            rank_main(&shared, Box::new(c)).map_err(into_boxed)
        })?;
        return Ok(());
    }
    let rank = launch::join(config)?;
    let comm = rank.comm.clone();
    let result = prepare(config, comm.topology(), rank.device)
        .and_then(|shared| rank_main(&shared, Box::new(rank.comm)));
    if let Err(e) = &result {
        // Peers blocked in a collective would wait for this rank until their timeout.
        comm.abort(format!("{e:#}"));
    }
    result
}

/// Reads and checks every input (data, batch shape, checkpoint to resume) before anything is
/// written.
fn prepare(
    config: &RunConfig,
    topology: comm::Topology,
    device: candle_core::Device,
) -> Result<Shared<'_>> {
    let model_cfg = config.model_config()?;
    let t = &config.train;
    let world = topology.world();
    let corpora = load_data(config, model_cfg.vocab_size)?;
    let sampler = Sampler::new(corpora.train.tokens.len(), model_cfg.seq_len, t.seed)
        .context("data.train")?;
    Sampler::check_batch(t.global_batch, world, t.micro_batch).context("train.global_batch")?;
    if let Some(valid) = &corpora.valid {
        let n = Sampler::new(valid.tokens.len(), model_cfg.seq_len, 0)
            .context("validation data")?
            .num_samples();
        if config.log.eval_samples > 0 && n.min(config.log.eval_samples) < world {
            bail!(
                "validation data holds {n} sequences of {} tokens: fewer than the {world} ranks",
                model_cfg.seq_len
            );
        }
    }
    let resume = find_resume(config, &model_cfg)?;
    let metrics_path = config.log.dir.join("metrics.jsonl");
    if resume.is_none() && metrics_path.exists() && !config.checkpoint.resume {
        bail!(
            "{} already holds a run; set checkpoint.resume = true to continue it, or choose another log.dir",
            config.log.dir.display()
        );
    }
    Ok(Shared {
        config,
        model_cfg,
        topology,
        corpora,
        sampler,
        resume,
        device,
    })
}

/// Rank 0 holds the metrics writer; the other ranks write nothing.
fn log_line<T: serde::Serialize>(metrics: &mut Option<MetricsWriter>, line: &T) -> Result<()> {
    match metrics.as_mut() {
        Some(m) => m.write(line),
        None => Ok(()),
    }
}

fn into_boxed(e: anyhow::Error) -> Box<dyn std::error::Error + Send + Sync> {
    format!("{e:#}").into()
}

/// Test hook: `ZEROPP_FAIL_RANK=R@S` makes rank R fail with an error at step S, to check that
/// one rank's failure ends the whole run promptly with that rank's error.
pub const FAIL_RANK_ENV: &str = "ZEROPP_FAIL_RANK";

/// Test hook: `ZEROPP_KILL_RANK=R@S` makes rank R's process SIGKILL itself at the start of step
/// S, as a crashed node would (multi-process backends).
pub const KILL_RANK_ENV: &str = "ZEROPP_KILL_RANK";

/// Test hook: `ZEROPP_HANG_RANK=R@S` makes rank R stop at the start of step S and never come
/// back, as a hung process would: its peers must give up after `dist.timeout_s`.
pub const HANG_RANK_ENV: &str = "ZEROPP_HANG_RANK";

/// The step at which the hook `var` (`R@S`) acts on `rank`, if it names this rank.
fn injected_at(var: &str, rank: usize) -> Option<u64> {
    let v = std::env::var(var).ok()?;
    let (r, s) = v.split_once('@')?;
    (r.parse::<usize>().ok()? == rank).then_some(())?;
    s.parse().ok()
}

/// The engine options a run config asks for, on `device`.
pub fn engine_options(config: &RunConfig, device: &candle_core::Device) -> EngineOptions {
    let t = &config.train;
    EngineOptions {
        zero: config.zero.clone(),
        total_steps: t.steps,
        seed: t.seed,
        recompute: config.model.recompute,
        optimizer: AdamW {
            beta1: t.beta1,
            beta2: t.beta2,
            eps: t.eps,
            weight_decay: t.weight_decay,
        },
        grad_clip: t.grad_clip,
        device: device.clone(),
        compute_dtype: config.compute_dtype(),
    }
}

/// One rank's training loop. Rank 0 alone writes metrics, the config copy and the manifest;
/// every rank writes its own checkpoint file.
fn rank_main(shared: &Shared<'_>, comm: Box<dyn comm::Communicator>) -> Result<()> {
    let Shared {
        config,
        model_cfg,
        topology,
        corpora,
        sampler,
        resume,
        device,
    } = shared;
    let t = &config.train;
    let seq_len = model_cfg.seq_len;
    let rank = comm.rank();
    let world = topology.world();
    let lead = rank == 0;
    let options = engine_options(config, device);
    let mut engine = Engine::new(model_cfg.clone(), options, comm)?;
    let start = match resume {
        Some(r) => {
            let state = checkpoint::read_rank(&r.path, &r.manifest, rank)?;
            engine
                .restore(r.manifest.step, &|name| state.tensors.get(name).cloned())
                .with_context(|| format!("checkpoint {} rank {rank}", r.path.display()))?;
            r.manifest.step
        }
        None => 0,
    };
    // Every rank has read its checkpoint file: only now is anything written.
    engine.comm().barrier(comm::Group::World).wait()?;

    let run_dir = &config.log.dir;
    let mut metrics = None;
    if lead {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        let metrics_path = run_dir.join("metrics.jsonl");
        metrics::truncate_after(&metrics_path, start)?;
        std::fs::write(run_dir.join("config.toml"), config.to_toml()?)?;
        metrics = Some(MetricsWriter::append(&metrics_path)?);
    }

    let accumulation = config.accumulation();
    let memory = engine.memory_estimate();
    let reporter = Reporter::new(
        if lead {
            config.log.progress
        } else {
            Some(false)
        },
        t.steps,
        start,
    );
    let say = |line: &str| {
        if lead {
            reporter.println(line)
        }
    };
    say(&format!(
        "model {} params ({} layers, {} wide, {} heads, seq {}) | world {} ({} nodes x {}) | \
         batch {} = {} micro x {} accum x {} ranks | memory per rank: {} sharded states + {} working set + {} hpZ secondary | \
         {} train tokens, {} samples",
        model_cfg.num_params(),
        model_cfg.n_layer,
        model_cfg.n_embd,
        model_cfg.n_head,
        seq_len,
        world,
        topology.nodes,
        topology.ranks_per_node,
        t.global_batch,
        t.micro_batch,
        accumulation,
        world,
        units::bytes(memory.sharded_bytes()),
        units::bytes(memory.working_bytes()),
        units::bytes(memory.hpz_secondary),
        corpora.train.tokens.len(),
        sampler.num_samples(),
    ));
    if engine.plan().qgz.is_some() && topology.nodes == 1 {
        say("note: qgZ on one node runs its intra-node hop only (the inter-node hop has one member)");
    }
    if let Some(r) = resume {
        say(&format!(
            "resumed from {} at step {start}",
            r.path.display()
        ));
    }
    if start == 0 && config.log.eval_samples > 0 {
        if let Some(valid) = &corpora.valid {
            let val_loss = evaluate(&engine, valid, seq_len, config)?;
            log_line(
                &mut metrics,
                &EvalLine {
                    step: 0,
                    tokens: 0,
                    val_loss,
                },
            )?;
            say(&format!("step 0 | val_loss {val_loss:.4}"));
        }
    }

    let kill_at: Option<u64> = std::env::var(KILL_AT_STEP_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    let fail_at = injected_at(FAIL_RANK_ENV, rank);
    let kill_rank_at = injected_at(KILL_RANK_ENV, rank);
    let hang_at = injected_at(HANG_RANK_ENV, rank);
    let tokens_per_step = (t.global_batch * seq_len) as u64;
    // Since the last metrics line: seconds in training steps (not evaluation or checkpoints),
    // comm bytes of those steps, and their number.
    let mut since_log = (0.0f64, comm::ByteCounters::default(), 0u64);
    for step in start + 1..=t.steps {
        if fail_at == Some(step) {
            bail!("injected failure at step {step} ({FAIL_RANK_ENV})");
        }
        if kill_rank_at == Some(step) {
            kill_self();
        }
        if hang_at == Some(step) {
            loop {
                std::thread::park();
            }
        }
        let counters_before = engine.comm().counters();
        let techniques = engine.techniques(step);
        let step_start = Instant::now();
        let mut loss_sum = 0.0;
        for micro in 0..accumulation {
            let ids = sampler.micro_batch_ids(
                step - 1,
                t.global_batch,
                world,
                rank,
                micro,
                t.micro_batch,
            );
            let (inputs, targets) = sampler.gather(&corpora.train.tokens, &ids);
            loss_sum += engine.forward_backward(&inputs, &targets, 1.0 / accumulation as f32)?;
        }
        let loss = engine.mean_over_world(loss_sum / accumulation as f64)?;
        let lr = learning_rate(t, step);
        let stats = engine.step(lr)?;
        since_log.0 += step_start.elapsed().as_secs_f64();
        since_log.1 = since_log.1 + (engine.comm().counters() - counters_before);
        since_log.2 += 1;

        let last = step == t.steps;
        let log_due = step % config.log.interval == 0 || last;
        if log_due {
            let (seconds, bytes, n) = since_log;
            let line = StepLine {
                step,
                tokens: step * tokens_per_step,
                loss,
                lr,
                grad_norm: stats.grad_norm,
                tokens_per_s: (n * tokens_per_step) as f64 / seconds,
                comm_intra_bytes: bytes.intra / n,
                comm_inter_bytes: bytes.inter / n,
                qwz: techniques.qwz,
                hpz: techniques.hpz,
                qgz: techniques.qgz,
            };
            log_line(&mut metrics, &line)?;
            if lead {
                reporter.step(&line, t.steps);
            }
        }
        let eval_due = config.log.eval_interval > 0 && step % config.log.eval_interval == 0;
        if let Some(valid) = corpora
            .valid
            .as_ref()
            .filter(|_| (eval_due || last) && config.log.eval_samples > 0)
        {
            let val_loss = evaluate(&engine, valid, seq_len, config)?;
            log_line(
                &mut metrics,
                &EvalLine {
                    step,
                    tokens: step * tokens_per_step,
                    val_loss,
                },
            )?;
            say(&format!("step {step} | val_loss {val_loss:.4}"));
        }
        let ckpt_due = config.checkpoint.interval > 0 && step % config.checkpoint.interval == 0;
        if ckpt_due || last {
            save(
                config,
                &engine,
                model_cfg,
                *topology,
                step,
                step * tokens_per_step,
            )?;
        }
        if lead && kill_at == Some(step) {
            kill_self();
        }
        if log_due {
            since_log = (0.0, comm::ByteCounters::default(), 0);
        }
    }
    if lead {
        reporter.finish();
        if start >= t.steps {
            reporter.println(&format!(
                "already trained to step {start} of {}; nothing to do",
                t.steps
            ));
        }
    }
    Ok(())
}

/// Mean loss over the first `log.eval_samples` validation sequences, in order, rounded down
/// to a multiple of the world size so every rank evaluates as many (and makes the same
/// collectives).
fn evaluate(
    engine: &Engine,
    valid: &TokenCorpus,
    seq_len: usize,
    config: &RunConfig,
) -> Result<f64> {
    let world = engine.comm().topology().world();
    let rank = engine.comm().rank();
    let sampler = Sampler::new(valid.tokens.len(), seq_len, 0).context("validation data")?;
    let per_rank = config.log.eval_samples.min(sampler.num_samples()) / world;
    let ids: Vec<usize> = (rank * per_rank..(rank + 1) * per_rank).collect();
    let mut total = 0.0;
    for chunk in ids.chunks(config.train.micro_batch) {
        let (inputs, targets) = sampler.gather(&valid.tokens, chunk);
        total += engine.eval_loss(&inputs, &targets)? * chunk.len() as f64;
    }
    let mean = engine.mean_over_world(total / per_rank as f64)?;
    Ok(mean)
}

/// All ranks write their files into the temporary folder rank 0 made; rank 0 then commits it.
fn save(
    config: &RunConfig,
    engine: &Engine,
    model_cfg: &model::GptConfig,
    topology: comm::Topology,
    step: u64,
    tokens: u64,
) -> Result<()> {
    let dir = config.checkpoint_dir();
    let lead = engine.comm().rank() == 0;
    let world = comm::Group::World;
    if lead {
        checkpoint::begin(&dir, step)?;
    }
    engine.comm().barrier(world).wait()?;
    let tmp = checkpoint::tmp_dir(&dir, step);
    checkpoint::write_rank(&tmp, engine.comm().rank(), step, &engine.state()?)?;
    engine.comm().barrier(world).wait()?;
    if lead {
        checkpoint::commit(
            &dir,
            &tmp,
            &checkpoint::manifest(step, tokens, topology, model_cfg),
        )?;
    }
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
