//! What a run checks before its first step, so that a run which cannot finish fails at once, in
//! one line naming the key to change, rather than after hours of training:
//!
//! - [`check_data`]: the data holds a sample, the batch fits the world, and the evaluation has
//!   a sequence to evaluate (from the token counts alone, so `configs/paper/` can be checked at
//!   384 ranks without their data or their model);
//! - [`check_memory`]: the plan's estimate of this process's memory against the memory at hand;
//! - [`check_kernels`]: the model and the compute dtype against what the GPU kernels take
//!   (`model::KernelPlan`), resolved once here rather than found per call in a step;
//! - [`check_sample`]: the samples' prompt fits the model's context and vocabulary;
//! - [`check_writable`]: the run folder, the metrics file and the checkpoint folder accept
//!   writes (a read-only `checkpoint.dir` is otherwise found only at the first checkpoint).

use std::fs::OpenOptions;
use std::path::Path;

use anyhow::{bail, Context, Result};
use data::Sampler;

use report::readable;
use run::config::{DeviceKind, RunConfig};
use run::Run;

/// The GPU kernel plan of `model_cfg` in the run's compute dtype on `device` (`None` on the
/// CPU), or the one line naming the setting the GPU kernels cannot take. The step runs under it
/// ([`model::KernelPlan::enforce`]): a layer's kernel that declines a tensor there is an error.
pub fn check_kernels(
    config: &RunConfig,
    model_cfg: &model::ModelConfig,
    device: &candle_core::Device,
) -> Result<Option<model::KernelPlan>> {
    Ok(model::KernelPlan::resolve(
        model_cfg,
        config.compute_dtype(),
        device,
    )?)
}

/// The key a user sets to change the validation data: `data.valid`, or `data.valid_fraction`
/// when the validation documents are held out of `data.train`.
fn valid_key(config: &RunConfig) -> &'static str {
    match config.data.valid.is_empty() {
        true => "data.valid_fraction",
        false => "data.valid",
    }
}

/// Checks the data and the batch of `run` on a world of `world` ranks, from the number of
/// training and validation tokens (`None`: no validation data).
///
/// Evaluation needs no rank to hold a validation sequence ([`crate::train`] evaluates the first
/// `log.eval_samples` sequences spread over the ranks, some ranks evaluating none), so any world
/// size runs with the default `log.eval_samples`.
pub fn check_data(
    run: &Run,
    world: usize,
    train_tokens: usize,
    valid_tokens: Option<usize>,
) -> Result<()> {
    let (config, seq_len) = (&run.config, run.model.seq_len);
    Sampler::new(train_tokens, seq_len, config.train.seed).context("data.train")?;
    let t = &config.train;
    Sampler::check_batch(t.global_batch, world, t.micro_batch).context("train.global_batch")?;
    if let (Some(tokens), true) = (valid_tokens, config.log.eval_samples > 0) {
        Sampler::new(tokens, seq_len, 0).with_context(|| {
            format!(
                "{}: the validation data has no sequence to evaluate (or set log.eval_samples = 0)",
                valid_key(config)
            )
        })?;
    }
    Ok(())
}

/// Checks `[log] sample_*` against the model, so that a prompt the model cannot take stops the
/// run before its first step, not at its first sample with the steps before it unsaved.
pub fn check_sample(run: &Run, tokenizer: Option<&data::Tokenizer>) -> Result<()> {
    let log = &run.config.log;
    if log.sample_interval == 0 {
        return Ok(());
    }
    let Some(tokenizer) = tokenizer else {
        bail!(
            "log.sample_interval: the samples need the run's tokenizer, and data.tokenizer = {} \
             does not read",
            run.config.data.tokenizer.display()
        );
    };
    let ids =
        crate::generate::prompt_ids(tokenizer, &log.sample_prompt).context("log.sample_prompt")?;
    let (seq_len, vocab) = (run.model.seq_len, run.model.vocab_size);
    if ids.len() > seq_len {
        bail!(
            "log.sample_prompt is {} tokens, more than model.seq_len = {seq_len}",
            ids.len()
        );
    }
    if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("log.sample_prompt: token id {id} does not fit model.vocab_size = {vocab}");
    }
    Ok(())
}

/// Refuses to start when the plan's estimate of the memory this process needs (`ranks_here`
/// ranks of `topology`: the whole world with the `local` backend, one rank when launched)
/// exceeds the memory at hand, so that a run too large ends in one line instead of an
/// allocation failure and a backtrace.
///
/// On the CPU the estimate is `trainer plan`'s total (docs/plan.md): states, gathered units,
/// gradients in reduction and activations, whose attention scores the CPU attention does
/// materialise. On a GPU only the states and working buffers count: the activations' formula
/// counts an attention matrix that the fused cuDNN attention never stores, so it would refuse
/// runs that fit. The memory at hand is, on the CPU, `MemAvailable` lowered to what the
/// process's cgroup (a slurm job, a container) has left; on a GPU, its free memory. Where
/// neither can be read, nothing is checked.
pub fn check_memory(
    run: &Run,
    topology: comm::Topology,
    ranks_here: usize,
    device: &candle_core::Device,
) -> Result<()> {
    let config = &run.config;
    let memory = plan::rank_memory(run, topology)?;
    let (per_rank, available, what) = match config.train.device {
        DeviceKind::Cpu => (memory.total, host_available_bytes(), "memory"),
        DeviceKind::Cuda => (
            memory.states.total(),
            run::device_memory::device_free_bytes(device),
            "free GPU memory",
        ),
    };
    let Some(available) = available else {
        return Ok(());
    };
    let needed = per_rank.saturating_mul(ranks_here as u64);
    if needed <= available {
        return Ok(());
    }
    let ranks = match ranks_here {
        1 => "this rank".to_string(),
        n => format!(
            "the {n} ranks of this process, {} each",
            readable::bytes(per_rank)
        ),
    };
    let mut lower = vec!["a smaller model"];
    if config.train.device == DeviceKind::Cpu {
        lower.push("a smaller train.micro_batch");
        if config.model.recompute != model::Recompute::Full {
            lower.push("model.recompute = true");
        }
    }
    if config.zero.prefetch_depth > 0 {
        lower.push("a lower zero.prefetch_depth");
    }
    if ranks_here == 1 {
        lower.push("more ranks (dist.world_size)");
    }
    bail!(
        "the plan estimates {} for {ranks}, more than the {} of {what} available: lower it with \
         {} (`trainer plan --config FILE` itemises the estimate)",
        readable::bytes(needed),
        readable::bytes(available),
        lower.join(", ")
    );
}

/// Host memory this process can still allocate: `MemAvailable`, lowered to the room its cgroup
/// (v2) has left; `None` where `/proc/meminfo` cannot be read (not Linux).
fn host_available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let available = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())?
        .saturating_mul(1024);
    Some(match cgroup_room() {
        Some(room) => available.min(room),
        None => available,
    })
}

/// `memory.max - memory.current` of this process's cgroup v2, where it has a limit.
fn cgroup_room() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = membership.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    // "max" (no limit) does not parse: no room to lower to.
    let max = read("memory.max")?;
    Some(max.saturating_sub(read("memory.current").unwrap_or(0)))
}

/// Checks, before the first step, that this process can write what it will write: rank 0's
/// process (`lead`) the run folder (`log.dir`) and, when they exist, `metrics.jsonl` and
/// `config.toml` in it; every process the checkpoint folder, which every rank writes its file
/// into. Each folder is probed by creating and removing a file of its own, so nothing there
/// is changed.
pub fn check_writable(config: &RunConfig, lead: bool) -> Result<()> {
    let checkpoints = config.checkpoint_dir();
    if lead {
        let run_dir = &config.log.dir;
        probe_folder(run_dir, "log.dir")?;
        for name in ["metrics.jsonl", "config.toml"] {
            let path = run_dir.join(name);
            if path.exists() {
                OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("log.dir: cannot write {}", path.display()))?;
            }
        }
    }
    std::fs::create_dir_all(&checkpoints).with_context(|| {
        format!(
            "checkpoint.dir: cannot create {} (checkpoints could not be written)",
            checkpoints.display()
        )
    })?;
    probe_folder(&checkpoints, "checkpoint.dir")
}

/// Creates and removes a file of this process's own in `dir` (set by config key `key`).
fn probe_folder(dir: &Path, key: &str) -> Result<()> {
    let probe = dir.join(format!(".write-test.{}", std::process::id()));
    let created = OpenOptions::new().write(true).create_new(true).open(&probe);
    match created {
        Ok(file) => {
            drop(file);
            std::fs::remove_file(&probe)
                .with_context(|| format!("{key}: cannot remove {}", probe.display()))
        }
        Err(e) => Err(e).with_context(|| format!("{key}: cannot write in {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use run::config::Overrides;

    fn resolved(config: &RunConfig) -> Run {
        Run::resolve(config.clone(), None).unwrap()
    }

    /// Every config of configs/paper/ (and its ablation/) passes its data, batch and evaluation
    /// checks at the world it names (384 ranks for the throughput runs), with the token counts
    /// of The Pile as prepared (`data/pile/pile_train` and `pile_val`); none of it is allocated.
    #[test]
    fn the_paper_configs_pass_their_start_up_checks_at_their_world() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut checked = Vec::new();
        for folder in ["configs/paper", "configs/paper/ablation"] {
            for entry in std::fs::read_dir(root.join(folder)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "toml") {
                    continue;
                }
                let config = RunConfig::load(&path, &Overrides::default()).unwrap();
                let world = config.dist.world_size;
                let run = Run::resolve(config, None).unwrap();
                // The Pile's training set is about 300B tokens; its validation file about 0.4B.
                check_data(&run, world, 300_000_000_000, Some(400_000_000))
                    .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                checked.push((path, world));
            }
        }
        assert!(
            checked.iter().filter(|(_, w)| *w == 384).count() >= 8,
            "{checked:?}"
        );
    }

    #[test]
    fn a_world_larger_than_the_evaluation_is_accepted() {
        let mut config = RunConfig::default();
        config.model.preset = Some("tiny".into());
        config.train.global_batch = 128;
        config.train.micro_batch = 1;
        // 64 evaluation samples (the default), 1459 sequences, 128 ranks.
        check_data(&resolved(&config), 128, 2_000_000, Some(1459 * 64 + 1)).unwrap();
        // No validation sequence at all is still an error, naming the key that gave the data.
        config.data.valid_fraction = 0.05;
        let e = format!(
            "{:#}",
            check_data(&resolved(&config), 128, 2_000_000, Some(10)).unwrap_err()
        );
        assert!(
            e.starts_with("data.valid_fraction: the validation data has no sequence"),
            "{e}"
        );
    }
}
