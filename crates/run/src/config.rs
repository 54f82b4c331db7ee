//! The run config: a TOML file, then `--set section.key=VALUE` overrides, then defaults.
//!
//! Precedence is command line over file over defaults. Overrides are merged into the parsed
//! TOML table before one strict deserialisation, so both go through the same checks: an unknown
//! key or a wrong type is an error naming the file and the dotted key. Values are checked here;
//! files named by the config are opened later, by the run.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use zero::ZeroConfig;

mod model_section;
pub use model_section::ModelSection;

/// The whole run config, one struct per section.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub model: ModelSection,
    pub data: DataSection,
    pub train: TrainSection,
    pub zero: ZeroConfig,
    pub dist: DistSection,
    pub log: LogSection,
    pub checkpoint: CheckpointSection,
}

/// `[data]`: where the tokens come from.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// Training sources: `.jsonl` / `.jsonl.zst` / `.jsonl.gz` / `.parquet` files (tokenised at
    /// start) or `.bin`/`.idx` prefixes.
    pub train: Vec<PathBuf>,
    /// Validation sources, same kinds. Empty: hold out `valid_fraction` of the training documents.
    pub valid: Vec<PathBuf>,
    /// Folder with the GPT-2 `vocab.json` and `merges.txt`, or a Hugging Face `tokenizer.json`
    /// (or a folder holding one).
    pub tokenizer: PathBuf,
    /// The end-of-document token (a token string). Unset: GPT-2's `<|endoftext|>`, else the
    /// tokenizer.json's first special token of `data::EOD_CANDIDATES`.
    pub eod_token: Option<String>,
    /// The JSON field or Parquet column holding each document's text.
    pub text_column: String,
    /// Fraction of training documents held out for validation when `valid` is empty.
    pub valid_fraction: f64,
}

impl Default for DataSection {
    fn default() -> Self {
        DataSection {
            train: Vec::new(),
            valid: Vec::new(),
            tokenizer: PathBuf::from("data/gpt2"),
            eod_token: None,
            text_column: data::TEXT_COLUMN.to_string(),
            valid_fraction: 0.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
    /// The blocks' linear layers in FP8 E4M3 with block scales, the rest as `bf16` on the GPU;
    /// on the CPU an emulation with the rest in f32 ([`model::LinearFormat::Fp8`]).
    Fp8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

/// `[train]`: batch, schedule and optimizer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Sequences per micro-batch per rank.
    pub micro_batch: usize,
    /// Sequences per optimizer step over all ranks = micro_batch x accumulation x world.
    pub global_batch: usize,
    /// Optimizer steps to train for.
    pub steps: u64,
    /// Peak learning rate, reached after `warmup_steps`.
    pub lr: f64,
    /// Learning rate at the end of the cosine decay.
    pub min_lr: f64,
    pub warmup_steps: u64,
    /// Steps over which the cosine decays (default: `steps`).
    pub decay_steps: Option<u64>,
    /// Decoupled weight decay on matrices and embeddings (not biases or norms).
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Clip the global gradient norm to this (0 = off).
    pub grad_clip: f64,
    /// Stop the run after this many steps in a row skipped for a non-finite gradient norm
    /// (docs/operations.md, "Divergence"); at least 1.
    pub max_skipped_steps: u64,
    /// Seeds the initialisation and the data order.
    pub seed: u64,
    pub precision: Precision,
    pub device: DeviceKind,
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            micro_batch: 8,
            global_batch: 8,
            steps: 100,
            lr: 3e-4,
            min_lr: 3e-5,
            warmup_steps: 0,
            decay_steps: None,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            max_skipped_steps: 10,
            seed: 1234,
            precision: Precision::Fp32,
            device: DeviceKind::Cpu,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Local,
    Nccl,
    Mpi,
}

/// `[dist]`: how many ranks and how they sit on nodes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistSection {
    pub backend: Backend,
    /// Ranks in all. With `local`, simulated as threads of this process.
    pub world_size: usize,
    /// Ranks per node (default: the launcher's processes per host; with `local`, all on one
    /// node). Smaller than the real count simulates more nodes (8 GPUs as 2 x 4).
    pub gpus_per_node: Option<usize>,
    /// Seconds a collective (or the bootstrap) may wait for its peers before this rank gives up
    /// and aborts the world, so a dead or hung process never hangs the others.
    pub timeout_s: u64,
    /// Benchmarks only (`nccl`): emulate nodes joined by a link of this many Gb/s, shared by the
    /// node's ranks, by holding the communication stream for each collective's cross-node bytes
    /// (comm::link; docs/launch.md). Unset: the real network.
    pub emulated_link_gbps: Option<f64>,
}

impl Default for DistSection {
    fn default() -> Self {
        DistSection {
            backend: Backend::Local,
            world_size: 1,
            gpus_per_node: None,
            timeout_s: 600,
            emulated_link_gbps: None,
        }
    }
}

/// `[log]`: the run directory and how often to write to it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Run directory: `metrics.jsonl`, `config.toml`, and checkpoints unless placed elsewhere.
    pub dir: PathBuf,
    /// Write a metrics line every this many steps.
    pub interval: u64,
    /// Evaluate every this many steps (0 = only at the end).
    pub eval_interval: u64,
    /// Validation sequences per evaluation (capped at what the data holds).
    pub eval_samples: usize,
    /// Progress bar: default on when stderr is a terminal, else plain log lines.
    pub progress: Option<bool>,
    /// Also write the training and validation scalars as TensorBoard events, to
    /// `<dir>/tensorboard/` (`tensorboard --logdir <dir>`).
    pub tensorboard: bool,
    /// Every this many steps (0 = never) write a sample of `sample_tokens` tokens after
    /// `sample_prompt`, to the log and to `<dir>/samples.jsonl` (rank 0).
    pub sample_interval: u64,
    /// The samples' prompt; empty: the end-of-document token alone, as a new document starts.
    pub sample_prompt: String,
    /// Tokens a sample writes.
    pub sample_tokens: usize,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            dir: PathBuf::from("runs/default"),
            interval: 1,
            eval_interval: 0,
            eval_samples: 64,
            progress: None,
            tensorboard: false,
            sample_interval: 0,
            sample_prompt: String::new(),
            sample_tokens: 48,
        }
    }
}

/// `[checkpoint]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// Default: `<log.dir>/checkpoints`.
    pub dir: Option<PathBuf>,
    /// Save every this many steps (0 = only at the end).
    pub interval: u64,
    /// Continue from the newest checkpoint in `dir`, if there is one.
    pub resume: bool,
    /// Trajectory settings ([`TRAJECTORY_KEYS`], e.g. "train.lr") that may differ from the
    /// checkpoint's on resume; any other difference is refused.
    pub allow_changes: Vec<String>,
    /// After each checkpoint, delete older ones beyond the newest `keep_last` (0 = keep all),
    /// so that a long run does not fill its disk.
    pub keep_last: usize,
    /// Checkpoints at steps that are multiples of this are milestones, never deleted (0 =
    /// none): a few points to go back to, however long the run.
    pub keep_every: u64,
    /// Write checkpoint files in the background while training goes on: each rank copies its
    /// state to host memory, a thread of its own writes, fsyncs and checksums it, and the
    /// checkpoint commits at the first step after every rank's write is done. At most one is
    /// in flight. Default: on for `train.device = "cuda"`, off on the CPU.
    pub r#async: Option<bool>,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            dir: None,
            interval: 0,
            resume: false,
            keep_last: 3,
            keep_every: 0,
            allow_changes: Vec::new(),
            r#async: None,
        }
    }
}

/// The keys of the settings that fix a run's trajectory (`job::resume::trajectory` records
/// them in each checkpoint), as config keys. `model.*` can never change on resume: the shards
/// would not fit.
pub const TRAJECTORY_KEYS: [&str; 31] = [
    "model.n_layer",
    "model.n_embd",
    "model.n_head",
    "model.seq_len",
    "model.vocab_size",
    "model.arch",
    "model.n_kv_head",
    "model.ffn_hidden",
    "model.head_dim",
    "model.norm_eps",
    "model.rope_theta",
    "model.rope_scaling",
    "model.tie_embeddings",
    "data.train",
    "data.valid",
    "data.tokenizer",
    "train.seed",
    "train.global_batch",
    "train.lr",
    "train.min_lr",
    "train.warmup_steps",
    "train.decay_steps",
    "train.weight_decay",
    "train.beta1",
    "train.beta2",
    "train.eps",
    "train.grad_clip",
    "train.precision",
    "zero.quantized_weights",
    "zero.quantized_gradients",
    "zero.reduce_dtype",
];

/// Keys of the quantisation that only matter while it is on, checked beside [`TRAJECTORY_KEYS`].
const QUANT_KEYS: [&str; 4] = [
    "zero.qgz_until",
    "zero.qgz_error_feedback",
    "zero.weight_quant_block",
    "zero.grad_quant_block",
];

/// Whether `key` may be listed in `checkpoint.allow_changes`.
pub fn may_change(key: &str) -> bool {
    !key.starts_with("model.") && (TRAJECTORY_KEYS.contains(&key) || QUANT_KEYS.contains(&key))
}

/// The command line's `--set section.key=VALUE` overrides (VALUE in TOML syntax), parsed once,
/// before any file is read.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// (the `--set` argument, its dotted key split, its value), in command-line order.
    entries: Vec<(String, Vec<String>, toml::Value)>,
}

impl Overrides {
    /// Parses each `section.key=VALUE`; an error names the argument.
    pub fn parse(specs: &[String]) -> Result<Self> {
        let entries = specs
            .iter()
            .map(|spec| {
                let (key, value) = spec
                    .split_once('=')
                    .with_context(|| format!("--set {spec}: expected section.key=VALUE"))?;
                let key = key.trim();
                let parsed: toml::Table = format!("v = {value}").parse().map_err(|_| {
                    anyhow::anyhow!(
                        "--set {spec}: VALUE must be TOML (quote strings: {key}='\"text\"')"
                    )
                })?;
                let value = parsed.get("v").cloned().context("--set: empty value")?;
                let parts: Vec<String> = key.split('.').map(str::to_string).collect();
                if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
                    bail!("--set {spec}: the key must be section.key");
                }
                Ok((spec.clone(), parts, value))
            })
            .collect::<Result<_>>()?;
        Ok(Overrides { entries })
    }

    /// Whether an override sets the dotted `key` (`zero.hpz_partition_size`).
    pub fn sets(&self, key: &str) -> bool {
        self.entries
            .iter()
            .any(|(_, parts, _)| parts.iter().map(String::as_str).eq(key.split('.')))
    }

    /// The `--set` argument to blame for an error about `message`: the last one whose dotted
    /// key the message names (an error caused by the command line names it, not the file).
    fn blamed(&self, message: &str) -> Option<&str> {
        self.entries
            .iter()
            .rev()
            .find(|(_, parts, _)| message.contains(&parts.join(".")))
            .map(|(spec, _, _)| spec.as_str())
    }

    /// Merges every override into `table`, in order.
    fn apply(&self, table: &mut toml::Table) -> Result<()> {
        for (spec, parts, value) in &self.entries {
            let (last, sections) = parts.split_last().expect("parse checked section.key");
            let mut node = &mut *table;
            for s in sections {
                let entry = node
                    .entry(s.clone())
                    .or_insert_with(|| toml::Value::Table(Default::default()));
                node = entry
                    .as_table_mut()
                    .with_context(|| format!("--set {spec}: `{s}` is not a section"))?;
            }
            node.insert(last.clone(), value.clone());
        }
        Ok(())
    }
}

impl RunConfig {
    /// Reads `path`, applies `overrides`, and checks the result.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map_or(0, |s| text[..s.start].lines().count().max(1));
            anyhow::anyhow!("{} line {line}: {}", path.display(), e.message())
        })?;
        overrides.apply(&mut table)?;
        let config: RunConfig = serde_path_to_error::deserialize(table).map_err(|e| {
            let key = e.path().to_string();
            match overrides.blamed(&key) {
                Some(spec) => anyhow::anyhow!("--set {spec}: {key}: {}", e.inner().message()),
                None => anyhow::anyhow!("{}: {key}: {}", path.display(), e.inner().message()),
            }
        })?;
        if let Err(e) = config.validate() {
            let message = format!("{e:#}");
            return Err(match overrides.blamed(&message) {
                Some(spec) => anyhow::anyhow!("--set {spec}: {message}"),
                None => anyhow::anyhow!("{}: {message}", path.display()),
            });
        }
        Ok(config)
    }

    /// The checks that need no I/O.
    pub fn validate(&self) -> Result<()> {
        let t = &self.train;
        let world = self.dist.world_size;
        if world == 0 {
            bail!("dist.world_size must be at least 1");
        }
        if t.micro_batch == 0 || t.global_batch == 0 {
            bail!("train.micro_batch and train.global_batch must be positive");
        }
        let Some(per_pass) = t.micro_batch.checked_mul(world) else {
            bail!(
                "train.micro_batch x dist.world_size = {} x {world} does not fit in 64 bits",
                t.micro_batch
            );
        };
        if !t.global_batch.is_multiple_of(per_pass) {
            bail!(
                "train.global_batch = {} is not divisible by micro_batch x world_size = {} x {}",
                t.global_batch,
                t.micro_batch,
                world
            );
        }
        if t.steps == 0 {
            bail!("train.steps must be positive");
        }
        // Each rate named alone, and inf refused with NaN: an infinite rate passes `> 0`.
        let finite = |key: &str, v: f64, positive: bool| -> Result<()> {
            match (v.is_finite(), positive) {
                (true, true) if v > 0.0 => Ok(()),
                (true, false) if v >= 0.0 => Ok(()),
                (_, true) => bail!("train.{key} = {v}: it must be a finite number > 0"),
                (_, false) => bail!("train.{key} = {v}: it must be a finite number >= 0"),
            }
        };
        finite("lr", t.lr, true)?;
        finite("min_lr", t.min_lr, false)?;
        if t.min_lr > t.lr {
            bail!("train.min_lr = {} is above train.lr = {}", t.min_lr, t.lr);
        }
        if !(0.0..1.0).contains(&t.beta1) || !(0.0..1.0).contains(&t.beta2) {
            bail!("train.beta1 and train.beta2 must be in [0, 1)");
        }
        finite("eps", t.eps, true)?;
        finite("weight_decay", t.weight_decay, false)?;
        finite("grad_clip", t.grad_clip, false)?;
        if t.max_skipped_steps == 0 {
            bail!("train.max_skipped_steps must be at least 1");
        }
        if let Some(d) = self.dist.gpus_per_node {
            if d == 0 || !world.is_multiple_of(d) {
                bail!("dist.gpus_per_node = {d} does not divide dist.world_size = {world}");
            }
        }
        if self.data.train.is_empty() {
            bail!(
                "data.train is empty: name at least one .jsonl, .jsonl.zst, .jsonl.gz, .parquet \
                 file or .bin/.idx prefix"
            );
        }
        if self.data.text_column.is_empty() {
            bail!("data.text_column is empty: name the JSON field or Parquet column of the text");
        }
        if self.data.eod_token.as_deref() == Some("") {
            bail!("data.eod_token is empty: name a token of the tokenizer, or leave it unset");
        }
        if !(0.0..1.0).contains(&self.data.valid_fraction) {
            bail!("data.valid_fraction must be in [0, 1)");
        }
        if self.data.valid.is_empty()
            && self.data.valid_fraction == 0.0
            && self.log.eval_samples > 0
        {
            bail!("no validation data: set data.valid, or data.valid_fraction > 0, or log.eval_samples = 0");
        }
        if self.log.interval == 0 {
            bail!("log.interval must be at least 1");
        }
        let c = &self.checkpoint;
        if c.keep_every > 0 && c.interval > 0 && !c.keep_every.is_multiple_of(c.interval) {
            bail!(
                "checkpoint.keep_every = {} is not a multiple of checkpoint.interval = {}: \
                 milestones must fall on checkpoints",
                c.keep_every,
                c.interval
            );
        }
        if let Some(gbps) = self.dist.emulated_link_gbps {
            if !(gbps.is_finite() && gbps > 0.0) {
                bail!("dist.emulated_link_gbps = {gbps}: a link rate must be positive");
            }
            if self.dist.backend != Backend::Nccl {
                bail!("dist.emulated_link_gbps emulates a slow network for dist.backend = \"nccl\" only");
            }
        }
        for key in &self.checkpoint.allow_changes {
            if !may_change(key) {
                bail!(
                    "checkpoint.allow_changes: {key:?} is not a setting that may change on resume \
                     (docs/operations.md lists them)"
                );
            }
        }
        self.zero.validate()?;
        // The model's sizes, checked here so that a bad one blames its `--set`; the model the
        // run trains is resolved once more, with the tokenizer at hand (`Run::resolve`). Any
        // vocabulary stands in for the tokenizer's here: only the sizes' own checks matter.
        self.model.resolve(Some(1))?;
        Ok(())
    }

    /// What this build can run: checked when training starts, not by `--print-config`.
    pub fn check_supported(&self) -> Result<()> {
        let t = &self.train;
        if t.precision == Precision::Fp16 {
            bail!("train.precision = \"fp16\" needs dynamic loss scaling, not implemented yet: use \"bf16\"");
        }
        if t.precision == Precision::Fp8 && t.device == DeviceKind::Cuda {
            self.check_fp8_gemm_sides()?;
        }
        if t.device == DeviceKind::Cuda && !cfg!(feature = "cuda") {
            return Err(not_built_with("train.device = \"cuda\"", "cuda"));
        }
        if self.dist.backend == Backend::Mpi && !cfg!(feature = "mpi") {
            return Err(not_built_with("dist.backend = \"mpi\"", "mpi"));
        }
        match (self.dist.backend, t.device) {
            (Backend::Nccl, DeviceKind::Cpu) => {
                bail!("dist.backend = \"nccl\" needs train.device = \"cuda\" (\"mpi\" is the CPU backend)")
            }
            (Backend::Mpi, DeviceKind::Cuda) => {
                bail!("dist.backend = \"mpi\" is the CPU backend: use \"nccl\" with train.device = \"cuda\"")
            }
            _ => {}
        }
        if self.dist.timeout_s == 0 {
            bail!("dist.timeout_s must be at least 1");
        }
        Ok(())
    }

    /// FP8 on the GPU: every side of the blocks' GEMMs (the tokens of a micro-batch, each
    /// linear layer's IN and OUT) a multiple of [`model::layers::GPU_MULTIPLE`], the 16-byte
    /// leading dimensions of cuBLASLt's FP8 GEMMs.
    fn check_fp8_gemm_sides(&self) -> Result<()> {
        let m = model::layers::GPU_MULTIPLE;
        let cfg = self.model.resolve(Some(1))?;
        let tokens = self.train.micro_batch * cfg.seq_len;
        if !tokens.is_multiple_of(m) {
            bail!(
                "train.precision = \"fp8\" on the GPU needs train.micro_batch x model.seq_len a \
                 multiple of {m} (cuBLASLt's FP8 GEMMs); got {tokens}"
            );
        }
        for p in &model::ModelLayout::new(&cfg).block(0).params {
            if p.shape.len() == 2 && p.shape.iter().any(|s| !s.is_multiple_of(m)) {
                bail!(
                    "train.precision = \"fp8\" on the GPU needs every linear layer's sides a \
                     multiple of {m} (cuBLASLt's FP8 GEMMs); {} is {:?}",
                    p.name,
                    p.shape
                );
            }
        }
        Ok(())
    }

    /// The device each rank computes on (every rank shares GPU 0 and one stream with the
    /// `local` backend).
    pub fn device(&self) -> Result<candle_core::Device> {
        match self.train.device {
            DeviceKind::Cpu => Ok(candle_core::Device::Cpu),
            DeviceKind::Cuda => cuda_device(),
        }
    }

    /// The dtype of parameters and compute; master weights and optimizer states are f32.
    /// Whether checkpoints are written in the background (`checkpoint.async`, default: on the GPU).
    pub fn checkpoint_async(&self) -> bool {
        self.checkpoint
            .r#async
            .unwrap_or(self.train.device == DeviceKind::Cuda)
    }

    pub fn compute_dtype(&self) -> candle_core::DType {
        match self.train.precision {
            Precision::Fp32 => candle_core::DType::F32,
            Precision::Bf16 => candle_core::DType::BF16,
            Precision::Fp16 => candle_core::DType::F16,
            // Everything but the blocks' linear layers: bf16 on the GPU, and on the CPU the
            // f32 of its reference, so that the emulation's only rounding is FP8's own.
            Precision::Fp8 => match self.train.device {
                DeviceKind::Cpu => candle_core::DType::F32,
                DeviceKind::Cuda => candle_core::DType::BF16,
            },
        }
    }

    /// What the blocks' linear layers multiply in.
    pub fn linears(&self) -> model::LinearFormat {
        match self.train.precision {
            Precision::Fp8 => model::LinearFormat::Fp8,
            _ => model::LinearFormat::Dense,
        }
    }

    /// Gradient accumulation steps per optimizer step.
    pub fn accumulation(&self) -> usize {
        self.train.global_batch / (self.train.micro_batch * self.dist.world_size)
    }

    pub fn checkpoint_dir(&self) -> PathBuf {
        self.checkpoint
            .dir
            .clone()
            .unwrap_or_else(|| self.log.dir.join("checkpoints"))
    }

    /// The resolved config as TOML, as written to the run directory.
    pub fn to_toml(&self) -> Result<String> {
        Ok(toml::to_string_pretty(self)?)
    }
}

/// GPU 0 with a stream of its own. Candle's `Device::new_cuda` computes on each calling
/// thread's per-thread stream; the local backend's ranks and communication threads share one
/// device, and one real stream orders all their work by issue order, so a tensor one thread
/// made is complete before another thread's kernel reads it.
#[cfg(feature = "cuda")]
fn cuda_device() -> Result<candle_core::Device> {
    let dev = candle_core::cuda_backend::CudaDevice::new_with_stream(0)
        .context("train.device = \"cuda\": cannot open GPU 0")?;
    crate::device_memory::keep_freed_memory(&dev);
    // SAFETY: every tensor of this process lives on this one stream (see above), so nothing
    // is read or written by another stream and stream order alone keeps them consistent.
    // Without this, cudarc records and waits on CUDA events for every buffer every op touches:
    // host time that bounded a gpt350m step at about 100 ms on the H200.
    unsafe { dev.disable_event_tracking() };
    Ok(candle_core::Device::Cuda(dev))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device() -> Result<candle_core::Device> {
    Err(not_built_with("train.device = \"cuda\"", "cuda"))
}

/// The error for a config `setting` that needs a cargo `feature` this binary was built without.
pub fn not_built_with(setting: &str, feature: &str) -> anyhow::Error {
    let support = match feature {
        "cuda" => "CUDA",
        "mpi" => "MPI",
        other => other,
    };
    anyhow::anyhow!(
        "{setting}: this binary was built without {support} support (cargo build --release \
         --features {feature})"
    )
}

#[cfg(test)]
mod tests;
