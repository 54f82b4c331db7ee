//! `trainer --config FILE`: the training loop around the ZeRO engine.
//!
//! Everything the run reads (tokenizer, data, checkpoint) is opened and checked before anything
//! is written, so bad input leaves the run directory as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use data::{Sampler, Tokenizer};
use zero::Engine;

use crate::divergence::{self, SkipCounter};
use crate::hooks::TestHooks;
use crate::resume::{self, DataSize, Resume};
use crate::schedule::learning_rate;
use crate::world::World;
use crate::{startup, stop};
use checkpoint;
use checkpoint::reshard;
use checkpoint::run_lock::RunLock;
use hf::init_from;
use report::metrics::{EvalLine, StepLine};
use report::progress::Reporter;
use report::readable;
use run::config::RunConfig;
use run::Run;

mod corpora;
mod evaluate;
mod outputs;
mod sample;
mod save;
use corpora::open_tokenizer;
pub(crate) use corpora::{load_data, Corpora};
pub(crate) use evaluate::evaluate;
use outputs::Outputs;

/// What every rank reads and nobody changes.
struct Shared<'a> {
    config: &'a RunConfig,
    /// The run's model, resolved once ([`Run`]).
    model_cfg: &'a model::ModelConfig,
    /// What the layers run on the GPU, resolved once ([`startup::check_kernels`]); `None` on
    /// the CPU.
    kernels: Option<model::KernelPlan>,
    topology: comm::Topology,
    corpora: Corpora,
    sampler: Sampler,
    /// The settings that fix the trajectory, recorded in every checkpoint.
    settings: BTreeMap<String, String>,
    resume: Option<Resume>,
    /// `model.init_from`'s weights, each unit's in full, when the run starts afresh from them.
    initial: Option<Vec<Vec<f32>>>,
    /// The locks of the run directory and the checkpoint folder ([`take_locks`]), held by the
    /// process of rank 0 (empty on the others).
    locks: Vec<RunLock>,
    /// The id of the training run this launch continues or starts, recorded in each manifest
    /// ([`checkpoint::Manifest::run_id`]): the resumed checkpoint's, or a new one. Only rank 0's
    /// is used (it alone writes manifests and prunes).
    run_id: String,
    hooks: TestHooks,
    /// The run's tokenizer, where it has one: the samples' text.
    tokenizer: Option<&'a Tokenizer>,
    /// Set once a rank of this process has failed: a hung rank ([`HANG_RANK_ENV`]) of the
    /// local backend then returns, so that the process can end.
    ///
    /// [`HANG_RANK_ENV`]: crate::hooks::HANG_RANK_ENV
    given_up: AtomicBool,
}

/// How a run ended, when it did not fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Trained to `train.steps` (or had nothing left to do).
    Finished,
    /// Stopped by a signal after a step and its checkpoint; the same command resumes it.
    Stopped,
}

/// Trains as `config` says: with the `local` backend one thread per simulated rank; with
/// `nccl` or `mpi` this process is one rank of the world its launcher started.
pub fn run(config: RunConfig) -> Result<Outcome> {
    config.check_supported()?;
    let hooks = TestHooks::from_env()?;
    stop::install()?;
    // The tokenizer gives the vocabulary where model.vocab_size is unset.
    let tokenizer = open_tokenizer(&config)?;
    let run = Run::resolve(config, tokenizer.as_ref().map(Tokenizer::vocab_size))?;
    let world = World::join(&run.config)?;
    let shared = prepare(&run, &world, hooks, tokenizer.as_ref()).map_err(|e| world.abort(e))?;
    let device = world.device().clone();
    let topology = world.topology();
    let outcomes = world
        .run(&run.config, |comm, device| {
            let result = rank_main(&shared, comm, device);
            if result.is_err() {
                shared.given_up.store(true, Ordering::SeqCst);
            }
            result
        })
        .map_err(|e| crate::out_of_memory::explain(e, &run, topology, &device))?;
    // The ranks agree on when to stop, so rank 0's outcome is everyone's.
    Ok(outcomes.first().copied().unwrap_or(Outcome::Finished))
}

/// The locks the process of rank 0 holds for the whole run: `log.dir`'s, then
/// `checkpoint.dir`'s, so that a second run is refused whether it shares the first's run
/// directory or only its checkpoint folder (whose checkpoints it would replace and prune). The
/// default checkpoint folder, `<log.dir>/checkpoints`, is locked too: another run may name it
/// as its `checkpoint.dir`. A `checkpoint.dir` that is `log.dir` itself is locked once (a
/// process cannot `flock` one file through two handles).
fn take_locks(config: &RunConfig) -> Result<Vec<RunLock>> {
    let run = RunLock::acquire(&config.log.dir, "log.dir")?;
    let dir = config.checkpoint_dir();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("checkpoint.dir: cannot create {}", dir.display()))?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(&dir, &config.log.dir) {
        return Ok(vec![run]);
    }
    Ok(vec![run, RunLock::acquire(&dir, "checkpoint.dir")?])
}

/// Reads and checks every input (data, batch shape, checkpoint to resume) before anything is
/// written, once the process of rank 0 has taken the run's locks.
fn prepare<'a>(
    run: &'a Run,
    world: &World,
    hooks: TestHooks,
    tokenizer: Option<&'a Tokenizer>,
) -> Result<Shared<'a>> {
    let (config, model_cfg) = (&run.config, &run.model);
    let (topology, lead) = (world.topology(), world.lead());
    // First, so that a second launch into this run directory or checkpoint folder reads
    // nothing of the first's.
    let locks = match lead {
        true => take_locks(config)?,
        false => Vec::new(),
    };
    let t = &config.train;
    hooks.check_world(topology.world())?;
    startup::check_sample(run, tokenizer)?;
    let corpora = load_data(config, model_cfg.vocab_size, tokenizer)?;
    startup::check_data(
        run,
        topology.world(),
        corpora.train.tokens.len(),
        corpora.valid.as_ref().map(|v| v.tokens.len()),
    )?;
    let sampler = Sampler::new(corpora.train.tokens.len(), model_cfg.seq_len, t.seed)
        .context("data.train")?;
    let data_size = DataSize {
        train: resume::Tokens::of(&corpora.train),
        valid: corpora.valid.as_ref().map(resume::Tokens::of),
        tokenizer: corpora.tokenizer,
    };
    let settings = resume::trajectory(run, data_size);
    let resume = resume::find(run, &settings)?;
    let run_id = resume
        .as_ref()
        .and_then(|r| r.manifest.run_id.clone())
        .unwrap_or_else(checkpoint::new_run_id);
    let metrics_path = config.log.dir.join("metrics.jsonl");
    if resume.is_none() && metrics_path.exists() && !config.checkpoint.resume {
        bail!(
            "{} already holds a run; set checkpoint.resume = true to continue it, or choose another log.dir",
            config.log.dir.display()
        );
    }
    let kernels = startup::check_kernels(config, model_cfg, world.device())?;
    startup::check_memory(run, topology, world.ranks_here(), world.device())?;
    startup::check_writable(config, lead)?;
    // A resumed run continues from its checkpoint, whatever it started from.
    let initial = match (&config.model.init_from, &resume) {
        (Some(dir), None) => Some(init_from::read(dir, model_cfg)?),
        _ => None,
    };
    Ok(Shared {
        config,
        kernels,
        initial,
        model_cfg,
        topology,
        corpora,
        sampler,
        settings,
        resume,
        locks,
        run_id,
        hooks,
        tokenizer,
        given_up: AtomicBool::new(false),
    })
}

/// One rank's training loop. Rank 0 alone writes metrics, the config copy and the manifest;
/// every rank writes its own checkpoint file.
fn rank_main(
    shared: &Shared<'_>,
    comm: Box<dyn comm::Communicator>,
    device: candle_core::Device,
) -> Result<Outcome> {
    // This rank's steps run on this thread under the kernel plan.
    let _kernels = shared.kernels.as_ref().map(model::KernelPlan::enforce);
    let mut run = RankRun::start(shared, comm, device)?;
    let steps = shared.config.train.steps;
    if run.start >= steps {
        // Nothing to do: nothing is written, not even the config copy.
        run.say(&format!(
            "already trained to step {} of {steps}; nothing to do",
            run.start
        ));
        return Ok(Outcome::Finished);
    }
    run.open_run_dir()?;
    run.announce();
    if let Some(k) = &shared.kernels {
        run.say(&k.to_string());
    }
    if run.start == 0 {
        run.evaluate(0)?;
    }
    let loop_started = Instant::now();
    let mut trained = std::time::Duration::ZERO;
    for step in run.start + 1..=steps {
        shared.hooks.before_step(run.rank, step, &shared.given_up)?;
        run.train_step(step)?;
        let last = step == steps;
        let eval_interval = shared.config.log.eval_interval;
        if last || (eval_interval > 0 && step % eval_interval == 0) {
            run.evaluate(step)?;
        }
        run.sample_if_due(step)?;
        if last {
            trained = loop_started.elapsed();
        }
        let ckpt_interval = shared.config.checkpoint.interval;
        let due = last || (ckpt_interval > 0 && step % ckpt_interval == 0);
        if due {
            run.save_if_good(step)?;
        } else {
            run.poll_checkpoint()?;
        }
        if shared.hooks.kills_after(step) {
            run.finish_checkpoint()?;
        }
        shared.hooks.after_step(step, run.lead);
        // Every rank asks every step, so all agree on the step to stop after.
        let signal = stop::requested();
        if !last && run.engine.any_over_world(signal.is_some())? {
            if !due {
                run.save_if_good(step)?;
            }
            run.finish_checkpoint()?;
            // This step's checkpoint, or the last good one if this step's was withheld (its
            // line said so); with none at all, the folder a resume would look in.
            let checkpoint = run
                .last_checkpoint
                .clone()
                .unwrap_or_else(|| shared.config.checkpoint_dir());
            run.stopped(step, signal, &checkpoint)?;
            return Ok(Outcome::Stopped);
        }
    }
    run.finish_checkpoint()?;
    run.finish(trained);
    Ok(Outcome::Finished)
}

/// What the training steps since the last metrics line add up to.
#[derive(Default)]
struct SinceLog {
    /// Seconds in training steps (not evaluation or checkpoints).
    seconds: f64,
    /// Bytes those steps sent.
    bytes: comm::ByteCounters,
    steps: u64,
}

/// One rank's run in progress: its engine, where it started, and (rank 0) its outputs.
struct RankRun<'a> {
    shared: &'a Shared<'a>,
    engine: Engine,
    /// The device this rank computes on.
    device: candle_core::Device,
    rank: usize,
    /// Rank 0: writes the metrics and the progress.
    lead: bool,
    /// The step the run resumed after (0: a new run).
    start: u64,
    /// Tokens trained on up to `start` (the batch may have changed since, if allowed).
    start_tokens: u64,
    /// The allowed setting changes of this resume, for the first metrics line.
    unlogged_changes: Vec<String>,
    /// Rank 0's files in the run directory (nothing on the other ranks).
    outputs: Outputs,
    /// The checkpoint being written, not yet committed ([`save`]).
    pending: Option<save::Pending>,
    /// With `checkpoint.async`: the host copy of the last checkpoint's state, which the next
    /// one copies into ([`Engine::state_into`]) rather than faulting in fresh pages.
    host_state: Vec<zero::NamedShard>,
    reporter: Reporter,
    since_log: SinceLog,
    /// Steps skipped in a row for a non-finite gradient norm.
    skips: SkipCounter,
    /// Whether the last step's loss and gradient norm were finite (true before the first): a
    /// checkpoint is written only then ([`RankRun::save_if_good`]).
    last_finite: bool,
    /// The run's last good checkpoint: the newest it wrote, or the one it resumed from. The
    /// divergence stop lines name it, and retention never deletes it (it is the newest).
    last_checkpoint: Option<PathBuf>,
    /// Rank 0: the folders of `checkpoint.dir` that retention left alone and has reported, each
    /// reported once.
    reported: BTreeSet<PathBuf>,
}

impl<'a> RankRun<'a> {
    /// Builds the engine and restores this rank's checkpoint, if the run resumes.
    fn start(
        shared: &'a Shared<'a>,
        comm: Box<dyn comm::Communicator>,
        device: candle_core::Device,
    ) -> Result<Self> {
        let config = shared.config;
        let rank = comm.rank();
        let options = run::engine_options(config, &device);
        let rank_device = device.clone();
        let mut engine = Engine::new(shared.model_cfg.clone(), options, comm)
            .context("building the engine's shards")?;
        let (start, start_tokens) = match &shared.resume {
            Some(r) => {
                let state = reshard::load(&r.path, &r.manifest, &engine)?;
                engine
                    .restore(r.manifest.step, &|name| state.get(name).cloned())
                    .with_context(|| format!("checkpoint {} rank {rank}", r.path.display()))?;
                (r.manifest.step, r.manifest.tokens)
            }
            None => {
                if let Some(units) = &shared.initial {
                    engine.load_parameters(units).context("model.init_from")?;
                }
                (0, 0)
            }
        };
        let lead = rank == 0;
        let progress = if lead {
            config.log.progress
        } else {
            Some(false)
        };
        Ok(RankRun {
            shared,
            engine,
            device: rank_device,
            rank,
            lead,
            start,
            start_tokens,
            unlogged_changes: shared
                .resume
                .as_ref()
                .map(|r| r.changes.clone())
                .unwrap_or_default(),
            outputs: Outputs::default(),
            pending: None,
            host_state: Vec::new(),
            reporter: Reporter::new(progress, config.train.steps, start),
            since_log: SinceLog::default(),
            skips: SkipCounter::new(config.train.max_skipped_steps),
            last_finite: true,
            last_checkpoint: shared.resume.as_ref().map(|r| r.path.clone()),
            reported: BTreeSet::new(),
        })
    }

    /// Once every rank has read its checkpoint file, rank 0 writes: the run folder, the config
    /// copy, and the metrics file (cut after the step resumed from).
    fn open_run_dir(&mut self) -> Result<()> {
        self.engine.comm().barrier(comm::Group::World).wait()?;
        if !self.lead {
            return Ok(());
        }
        let config = self.shared.config;
        let (outputs, damaged) = Outputs::open(config, self.start, self.start_tokens)?;
        self.outputs = outputs;
        if let Some(damaged) = damaged {
            let metrics = config.log.dir.join("metrics.jsonl");
            self.say(&format!("{}: {damaged}", metrics.display()));
        }
        Ok(())
    }

    /// Rank 0's progress line (nothing on the other ranks).
    fn say(&self, line: &str) {
        if self.lead {
            self.reporter.println(line)
        }
    }

    /// The run's first lines: the model, the world, the batch and the memory per rank.
    fn announce(&self) {
        let shared = self.shared;
        let (config, model_cfg, topology) = (shared.config, shared.model_cfg, &shared.topology);
        let t = &config.train;
        let world = topology.world();
        let memory = self.engine.memory_estimate(config.accumulation());
        self.say(&format!(
            "model {} params ({} layers, {} wide, {} heads, seq {}) | world {} ({} nodes x {}) | \
             batch {} = {} micro x {} accum x {} ranks | memory per rank: {} sharded states + {} working set + {} hpZ secondary | \
             {} train tokens, {} samples",
            model_cfg.num_params(),
            model_cfg.n_layer,
            model_cfg.n_embd,
            model_cfg.n_head,
            model_cfg.seq_len,
            world,
            topology.nodes,
            topology.ranks_per_node,
            t.global_batch,
            t.micro_batch,
            config.accumulation(),
            world,
            readable::bytes(memory.sharded_bytes()),
            readable::bytes(memory.working_bytes()),
            readable::bytes(memory.hpz_secondary),
            shared.corpora.train.tokens.len(),
            shared.sampler.num_samples(),
        ));
        if config.linears() == model::LinearFormat::Fp8 {
            self.say(&format!(
                "precision fp8: the blocks' linear layers multiply in {}{}",
                model::LinearFormat::Fp8.name(),
                match t.device {
                    run::config::DeviceKind::Cpu => ", emulated on the CPU (the rest in f32)",
                    run::config::DeviceKind::Cuda => "",
                }
            ));
        }
        if self.engine.plan().qgz.is_some() && topology.nodes == 1 {
            self.say("note: qgZ on one node runs its intra-node hop only (the inter-node hop has one member)");
        }
        for lock in &shared.locks {
            if let Some(stale) = &lock.stale {
                self.say(&format!(
                    "took over {} from a run that ended without releasing it ({stale})",
                    lock.path.display()
                ));
            }
        }
        if let Some(r) = &shared.resume {
            let saved_world = r.manifest.world_size;
            let resliced = match saved_world == world {
                true => String::new(),
                false => format!(", its {saved_world} ranks' shards re-sliced for {world}"),
            };
            self.say(&format!(
                "resumed from {} at step {}{resliced}",
                r.path.display(),
                self.start
            ));
            for change in &r.changes {
                self.say(&format!(
                    "allowed change (checkpoint.allow_changes): {change}"
                ));
            }
        }
    }

    /// Tokens of one optimizer step over all ranks.
    fn tokens_per_step(&self) -> u64 {
        let t = &self.shared.config.train;
        (t.global_batch * self.shared.model_cfg.seq_len) as u64
    }

    /// Rank 0's model FLOPs utilisation at `tokens_per_s` over the world (GPU runs): the
    /// FLOPs per token `trainer bench` counts, over the GPU's peak.
    fn mfu(&self, tokens_per_s: f64) -> Option<f64> {
        if !self.device.is_cuda() {
            return None;
        }
        let seq = self.shared.model_cfg.seq_len;
        let per_gpu = tokens_per_s / self.shared.topology.world() as f64;
        let tflops = per_gpu * self.engine.model().flops_per_token(seq) / 1e12;
        Some(tflops / crate::mfu::PEAK_TFLOPS)
    }

    /// Tokens trained on after `step`.
    fn tokens_at(&self, step: u64) -> u64 {
        self.start_tokens + (step - self.start) * self.tokens_per_step()
    }

    /// After the checkpoint of `step`, when a signal asked the run to stop: flushes the
    /// metrics and says where the run stopped and how to go on.
    fn stopped(
        &mut self,
        step: u64,
        signal: Option<i32>,
        checkpoint: &std::path::Path,
    ) -> Result<()> {
        self.outputs.sync()?;
        let steps = self.shared.config.train.steps;
        // Read again: with the local backend, another rank of this process may have seen the
        // signal at its poll, after this rank's poll of the same step.
        let by = match signal.or_else(stop::requested) {
            Some(s) => stop::name(s),
            None => "a signal to another rank",
        };
        self.reporter.stop();
        self.say(&format!(
            "stopped by {by} after step {step} of {steps}: checkpoint {}; run the same command \
             to resume",
            checkpoint.display()
        ));
        Ok(())
    }

    /// One optimizer step over this rank's micro-batches, and its metrics line when one is due.
    fn train_step(&mut self, step: u64) -> Result<()> {
        let shared = self.shared;
        let (config, sampler) = (shared.config, &shared.sampler);
        let t = &config.train;
        let accumulation = config.accumulation();
        let counters_before = self.engine.comm().counters();
        let techniques = self.engine.techniques(step);
        let step_start = Instant::now();
        let mut loss_sum = 0.0;
        for micro in 0..accumulation {
            let ids = sampler.micro_batch_ids(
                step - 1,
                t.global_batch,
                shared.topology.world(),
                self.rank,
                micro,
                t.micro_batch,
            )?;
            let (inputs, targets) = sampler.gather(&shared.corpora.train.tokens, &ids)?;
            loss_sum += self
                .engine
                .forward_backward(&inputs, &targets, 1.0 / accumulation as f32)
                .with_context(|| {
                    format!(
                        "step {step}, the forward and backward of micro-batch {}",
                        micro + 1
                    )
                })?;
        }
        let loss = self
            .engine
            .mean_over_world(loss_sum / accumulation as f64)?;
        let lr = learning_rate(t, step);
        let stats = self
            .engine
            .step(lr)
            .with_context(|| format!("step {step}, the optimizer"))?;
        self.last_finite = !stats.skipped && loss.is_finite() && stats.grad_norm.is_finite();
        let skip_note = self.skips.record(step, stats.skipped, stats.grad_norm);
        let since = &mut self.since_log;
        since.seconds += step_start.elapsed().as_secs_f64();
        since.bytes = since.bytes + (self.engine.comm().counters() - counters_before);
        since.steps += 1;

        // A skipped step always gets its line.
        if !stats.skipped && !step.is_multiple_of(config.log.interval) && step != t.steps {
            return Ok(());
        }
        let since = std::mem::take(&mut self.since_log);
        let tokens_per_step = self.tokens_per_step();
        let tokens_per_s = (since.steps * tokens_per_step) as f64 / since.seconds;
        let line = StepLine {
            step,
            tokens: self.tokens_at(step),
            loss,
            lr,
            grad_norm: stats.grad_norm,
            tokens_per_s,
            comm_intra_bytes: since.bytes.intra / since.steps,
            comm_inter_bytes: since.bytes.inter / since.steps,
            qwz: techniques.qwz,
            hpz: techniques.hpz,
            qgz: techniques.qgz,
            changed: std::mem::take(&mut self.unlogged_changes),
            skipped: stats.skipped,
            mfu: self.mfu(tokens_per_s),
            peak_memory_bytes: run::device_memory::peak_bytes(&self.device),
        };
        run::device_memory::reset_peak(&self.device);
        self.outputs.step(&line)?;
        if self.lead {
            self.reporter.step(&line, t.steps);
        }
        if let Some(note) = skip_note {
            self.say(&note);
            let last = self.last_checkpoint.as_deref();
            if let Err(stop) = self.skips.check(step, last, &config.checkpoint_dir()) {
                // Every rank stops at this step (the norm is global). Wait until all are here,
                // so that no rank's stop aborts rank 0 before its line is written.
                self.engine.comm().barrier(comm::Group::World).wait()?;
                return Err(stop);
            }
        }
        Ok(())
    }

    /// The validation loss after `step` (0: before the first), when there is validation data.
    fn evaluate(&mut self, step: u64) -> Result<()> {
        let config = self.shared.config;
        let Some(valid) = self.shared.corpora.valid.as_ref() else {
            return Ok(());
        };
        if config.log.eval_samples == 0 {
            return Ok(());
        }
        let seq_len = self.shared.model_cfg.seq_len;
        let (samples, micro) = (config.log.eval_samples, config.train.micro_batch);
        let val_loss = evaluate(&self.engine, valid, seq_len, samples, micro)?;
        divergence::check_val_loss(step, val_loss, &config.checkpoint_dir())?;
        let tokens = self.tokens_at(step);
        self.outputs.eval(&EvalLine {
            step,
            tokens,
            val_loss,
        })?;
        self.say(&format!("step {step} | val_loss {val_loss:.4}"));
        Ok(())
    }

    /// Ends the progress display and says how long the steps of this process took (`trained`:
    /// from its first step to the end of the last, evaluations and checkpoints between them
    /// included, the last checkpoint not) and where the run's outputs are.
    fn finish(&self, trained: std::time::Duration) {
        if !self.lead {
            return;
        }
        self.reporter.finish();
        let config = self.shared.config;
        let dir = config.log.dir.display();
        let checkpoint = match &self.last_checkpoint {
            Some(c) => format!("the last checkpoint is {}", c.display()),
            None => "no checkpoint was written".to_string(),
        };
        let steps = config.train.steps - self.start;
        let seconds = trained.as_secs_f64();
        self.say(&format!(
            "trained {steps} steps in {seconds:.1} s, {:.0} tokens/s with its evaluations and \
             checkpoints",
            (steps * self.tokens_per_step()) as f64 / seconds
        ));
        self.say(&format!(
            "finished {} steps: metrics in {dir}/metrics.jsonl, {checkpoint}; draw the curves \
             with `trainer plot {dir} --output {dir}/loss.png`",
            config.train.steps
        ));
    }
}
