//! The ZeRO-3 training step over any model's schedule of units ([`model::Model`]).
//!
//! The engine knows units, not layers: it walks the model's schedule ([`Model::train_walk`],
//! [`Model::eval_walk`]) as a [`UnitSource`] that answers each request for a unit's parameters
//! with the next gather of [`Model::gather_order`] (prefetched up to `zero.prefetch_depth`
//! ahead) and takes each unit's gradient into a reduction. What each gather and reduction is
//! (exact or INT8, from the world or from hpZ's secondary partition, reduce-scatter or qgZ)
//! comes from the step's [`StepPlan`]; nothing else decides. Each unit is gathered once in
//! forward and at most once for backward, and its gradient reduced once: the 2 gathers + 1
//! reduce-scatter per unit of the paper's volume accounting (a tied embedding's backward
//! gather serves the head and its own backward).

use candle_core::{DType, Device, Tensor};
use std::collections::VecDeque;
use std::sync::Arc;

use comm::{Communicator, Group};
use kernels::profile::{scope, Family};
use model::{BackwardParams, LinearFormat, Model, ModelConfig, Pass, Recompute, UnitLayout};

use crate::codec::GradState;
use crate::gather::{Secondary, Working};
use crate::memory::{rank_memory, RankMemory};
use crate::{AdamW, DecayRanges, GradShard, Partition, Result, Techniques, ZeroConfig, ZeroPlan};
use source::{Parts, Shards, Source};

/// Gradient reductions left in flight during the backward pass: starting another finishes the
/// oldest, so the newest overlaps the next unit's backward while at most this many units' full
/// fp32 gradients (a reduce-scatter holds its input until it completes) are alive at once, as
/// `trainer plan` counts them (DeepSpeed's reduce bucket, Megatron's overlapped reduce).
pub const REDUCTIONS_IN_FLIGHT: usize = 2;

/// Everything the engine needs besides the model shape and the communicator.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub zero: ZeroConfig,
    /// Optimizer steps the run will take (qgZ's schedule is a fraction of them).
    pub total_steps: u64,
    /// Seed of the partition-independent initialisation.
    pub seed: u64,
    /// Activation checkpointing: what a block keeps for its backward, which recomputes the rest.
    pub recompute: Recompute,
    pub optimizer: AdamW,
    /// Clip the global gradient norm to this value (0 = no clipping).
    pub grad_clip: f64,
    pub device: Device,
    /// dtype of the gathered parameters and of the compute (f32 on CPU, bf16 on GPU); the
    /// master weights, moments and gradient shards stay f32.
    pub compute_dtype: DType,
    /// What the blocks' linear layers multiply in (FP8 compute: `train.precision = "fp8"`).
    pub linears: LinearFormat,
}

impl Default for EngineOptions {
    /// Plain ZeRO-3 on CPU: seed 0, one step, no recomputation, [`AdamW::default`], clip 1.0.
    fn default() -> Self {
        EngineOptions {
            zero: ZeroConfig::default(),
            total_steps: 1,
            seed: 0,
            recompute: Recompute::Off,
            optimizer: AdamW::default(),
            grad_clip: 1.0,
            device: Device::Cpu,
            compute_dtype: DType::F32,
            linears: LinearFormat::Dense,
        }
    }
}

/// What one optimizer step measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// Global L2 norm of the (averaged) gradient, before clipping; NaN or inf when the step
    /// was skipped.
    pub grad_norm: f64,
    /// The gradient norm was not finite (or some rank's loss was not), so [`Engine::step`]
    /// changed no weight or moment: identical on every rank, since the norm is all-reduced.
    pub skipped: bool,
}

/// The states each unit keeps per element, in checkpoint order: a checkpoint names them
/// `<unit>.<state>`, and each is laid out as the unit's flat buffer is partitioned.
pub const SHARD_STATES: [&str; 3] = ["master", "exp_avg", "exp_avg_sq"];

/// One named fp32 shard of engine state, as saved in a checkpoint (read back to the host).
pub struct NamedShard {
    pub name: String,
    pub data: Vec<f32>,
}

/// One rank's shard of one unit; every state is a 1-D f32 tensor on the compute device.
struct UnitShard {
    layout: UnitLayout,
    /// Where its linear weights lie in its flat buffer, for FP8 qwZ to encode them (none
    /// without it).
    linears: Arc<crate::codec::LinearLayout>,
    partition: Partition,
    /// fp32 master weights of my shard.
    master: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// The gradient of my shard, accumulated over micro-batches; `None` while it is zero (after
    /// a step), so that the first micro-batch's reduced gradient is taken as it is, with no
    /// zeroing pass and no accumulation pass. At W = 1 the first micro-batch's is the unit's
    /// gradient as the backward wrote it, with its weight as the scale ([`GradShard`]).
    grad: Option<GradShard>,
    decay: DecayRanges,
    /// hpZ: my node-local slice of the gathered unit, stamped with the weights it copies.
    secondary: Option<Secondary>,
    /// My shard in the compute dtype, written by the optimizer and stamped with the weights it
    /// copies: what world gathers read instead of casting `master` (none while the compute
    /// dtype is the master's f32).
    working: Option<Working>,
    /// What the gradient codecs keep of this unit between steps (qgZ's error feedback): taken
    /// by each reduction's job and handed back.
    grad_state: GradState,
}

/// A ZeRO-3 engine for one rank. See the module doc for the step's schedule.
pub struct Engine {
    model: Model,
    opts: EngineOptions,
    plan: ZeroPlan,
    comm: Box<dyn Communicator>,
    units: Vec<UnitShard>,
    /// Optimizer steps taken so far, skipped ones included (the training step).
    step: u64,
    /// The version of the master weights: a new one after every optimizer step (skipped ones too,
    /// so that each step's first gathers come from the world) and every checkpoint load. hpZ's
    /// secondary partitions are stamped with it and serve no other.
    weights: u64,
    /// The weights version the last training walk ran on: a walk on other weights is its
    /// step's first, whose gathers find no secondary partition kept (hpZ's rule).
    walked: Option<u64>,
    /// A micro-batch since the last step had a non-finite loss on this rank: the step then
    /// makes the global gradient norm NaN, so that every rank skips it.
    non_finite_loss: bool,
}

impl Engine {
    /// Builds my shards and fills them from the seed, independently of the world size.
    pub fn new(cfg: ModelConfig, opts: EngineOptions, comm: Box<dyn Communicator>) -> Result<Self> {
        let model = Model::new(cfg)?.with_linears(opts.linears);
        let plan = ZeroPlan::resolve(&opts.zero, comm.topology(), opts.total_steps)?
            .with_linears(opts.linears, model.layout());
        let model = model.with_backward_params(plan.backward_params());
        let cfg = model.config();
        let rank = comm.rank();
        let dev = &opts.device;
        let units = model
            .units()
            .iter()
            .cloned()
            .enumerate()
            .map(|(u, layout)| -> Result<UnitShard> {
                let partition = plan.partition(layout.numel);
                let range = partition.shard_range(rank);
                let n = range.len();
                let mut master = vec![0f32; n];
                init_parallel(cfg, &layout, opts.seed, range.start, &mut master);
                let decayed: Vec<_> = layout
                    .params
                    .iter()
                    .filter(|p| p.decay)
                    .map(|p| p.offset..p.offset + p.numel)
                    .collect();
                Ok(UnitShard {
                    decay: DecayRanges::for_shard(&decayed, &range),
                    linears: Arc::new(plan.linears(u).clone()),
                    layout,
                    master: Tensor::from_vec(master, n, dev)?,
                    exp_avg: Tensor::zeros(n, DType::F32, dev)?,
                    exp_avg_sq: Tensor::zeros(n, DType::F32, dev)?,
                    grad: None,
                    secondary: None,
                    working: None,
                    grad_state: GradState::for_run(&plan, partition.padded),
                    partition,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Engine {
            model,
            opts,
            plan,
            comm,
            units,
            step: 0,
            weights: 0,
            walked: None,
            non_finite_loss: false,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// The model's schedule of units.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Each unit's name and partition, in state order: how a checkpoint's shards are cut, so
    /// that one written under another partition can be re-sliced ([`crate::reslice`]).
    pub fn unit_partitions(&self) -> impl Iterator<Item = (&str, &Partition)> {
        self.units
            .iter()
            .map(|u| (u.layout.name.as_str(), &u.partition))
    }

    /// The resolved ZeRO / ZeRO++ plan.
    pub fn plan(&self) -> &ZeroPlan {
        &self.plan
    }

    /// The techniques optimizer step `step` (1-based) uses.
    pub fn techniques(&self, step: u64) -> Techniques {
        self.plan.techniques(step)
    }

    pub fn comm(&self) -> &dyn Communicator {
        self.comm.as_ref()
    }

    /// Optimizer steps taken, skipped ones included (restored from a checkpoint on resume).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Units in the model's order.
    pub fn num_units(&self) -> usize {
        self.units.len()
    }

    /// My fp32 gradient shard of unit `u`, as accumulated since the last [`Engine::step`].
    pub fn grad_shard(&self, u: usize) -> Result<Vec<f32>> {
        let unit = &self.units[u];
        let n = unit.master.elem_count();
        match &unit.grad {
            Some(g) => g.to_vec(n),
            None => Ok(vec![0.0; n]),
        }
    }

    /// This rank's memory for the model's states with `micro_batches` a step, as `trainer
    /// plan` counts it ([`crate::memory::rank_memory`] of this engine's plan and units, in the
    /// compute dtype).
    pub fn memory_estimate(&self, micro_batches: usize) -> RankMemory {
        let numels: Vec<usize> = self.units.iter().map(|u| u.layout.numel).collect();
        let pb = self.opts.compute_dtype.size_in_bytes();
        rank_memory(&self.plan, &numels, pb, micro_batches)
    }

    /// Unit `u`'s full padded parameters exactly as the forward computes with them (with qwZ,
    /// dequantised INT8; with FP8 qwZ, each linear weight's codes times their scales), gathered
    /// from the world now.
    pub fn gather_for_compute(&self, u: usize) -> Result<Vec<f32>> {
        let step = self.plan.step_plan(self.step + 1, Pass::Eval);
        let shards = Shards::Read(&self.units);
        let mut source = Source::new(self.parts(), step, shards, vec![u], 0, 1);
        let params = source.next_gather(u)?;
        let mut full = params.flat().to_dtype(DType::F32)?.to_vec1::<f32>()?;
        for (at, w) in params.fp8() {
            // Read on the host: on the GPU only the FP8 GEMMs read the codes.
            let cpu = &Device::Cpu;
            let w = model::Fp8Weight::new(w.codes().to_device(cpu)?, w.scales().to_device(cpu)?)?;
            let values = w.dequantize()?.flatten_all()?.to_vec1::<f32>()?;
            full[*at..*at + values.len()].copy_from_slice(&values);
        }
        Ok(full)
    }

    /// Unit `u`'s full padded fp32 master weights, gathered exactly (never quantised).
    fn gather_exact(&self, u: usize) -> Result<Vec<f32>> {
        let full = self
            .comm
            .all_gather(Group::World, self.units[u].master.clone())
            .wait()?;
        Ok(full.to_vec1::<f32>()?)
    }

    fn batch_tensors(&self, inputs: &[u32], targets: &[u32]) -> Result<(Tensor, Tensor)> {
        let t = self.model.config().seq_len;
        let b = inputs.len() / t;
        let dev = &self.opts.device;
        Ok((
            Tensor::from_slice(inputs, (b, t), dev)?,
            Tensor::from_slice(targets, (b, t), dev)?,
        ))
    }

    /// The engine's parts a walk of the schedule borrows (all but the model it walks).
    fn parts(&self) -> Parts<'_> {
        Parts {
            comm: self.comm.as_ref(),
            opts: &self.opts,
            plan: &self.plan,
            weights: self.weights,
            first_walk: self.walked != Some(self.weights),
        }
    }

    /// Forward and backward of one micro-batch (`inputs`, `targets`: B x T tokens, row-major).
    /// Adds `grad_scale` x (world mean of the gradient) into the gradient shards; returns this
    /// rank's mean loss over the micro-batch. A non-finite loss is not an error: the backward
    /// runs (every rank must make the same collectives) and the next [`Engine::step`] skips.
    pub fn forward_backward(
        &mut self,
        inputs: &[u32],
        targets: &[u32],
        grad_scale: f32,
    ) -> Result<f64> {
        let (tokens, targets) = self.batch_tensors(inputs, targets)?;
        if self.model.backward_params() == BackwardParams::Kept {
            self.keep_working_current()?;
        }
        let step = self.plan.step_plan(self.step + 1, Pass::Train);
        let order = self.model.gather_order(Pass::Train);
        let forward = self.model.units().len();
        let parts = Parts {
            comm: self.comm.as_ref(),
            opts: &self.opts,
            plan: &self.plan,
            weights: self.weights,
            first_walk: self.walked != Some(self.weights),
        };
        self.walked = Some(self.weights);
        let shards = Shards::Train {
            units: &mut self.units,
            reductions: VecDeque::with_capacity(REDUCTIONS_IN_FLIGHT + 1),
            grad_scale,
        };
        let depth = self.plan.prefetch_depth;
        let mut source = Source::new(parts, step, shards, order, depth, forward);
        let loss = self
            .model
            .train_walk(&mut source, &tokens, &targets, self.opts.recompute)?;
        source.finish_reductions()?;
        self.non_finite_loss |= !loss.is_finite();
        Ok(loss)
    }

    /// Every unit's working copy made from the master where none serves the current weights
    /// (before the first step, after a checkpoint load or a skipped step): a walk that keeps
    /// each unit's parameters from its forward for its backward ([`BackwardParams::Kept`], W =
    /// 1) then holds the copies the rank holds anyway, never a cast of the master a unit.
    fn keep_working_current(&mut self) -> Result<()> {
        let dtype = self.opts.compute_dtype;
        for u in &mut self.units {
            if u.working
                .as_ref()
                .and_then(|w| w.serve(self.weights))
                .is_none()
            {
                let data = match u.master.dtype() == dtype {
                    true => u.master.clone(),
                    false => u.master.to_dtype(dtype)?,
                };
                u.working = Some(Working::new(self.weights, data));
            }
        }
        Ok(())
    }

    /// This rank's mean loss over one micro-batch, forward only.
    pub fn eval_loss(&self, inputs: &[u32], targets: &[u32]) -> Result<f64> {
        let (tokens, targets) = self.batch_tensors(inputs, targets)?;
        let step = self.plan.step_plan(self.step + 1, Pass::Eval);
        let order = self.model.gather_order(Pass::Eval);
        let n = order.len();
        let shards = Shards::Read(&self.units);
        let depth = self.plan.prefetch_depth;
        let mut source = Source::new(self.parts(), step, shards, order, depth, n);
        self.model.eval_walk(&mut source, &tokens, &targets)
    }

    /// The sum of `value` over the world, through a one-element tensor on my device (NCCL
    /// reduces device memory only).
    fn sum_over_world(&self, value: f32) -> Result<f32> {
        let one = Tensor::from_vec(vec![value], 1, &self.opts.device)?;
        let sum = self.comm.all_reduce(Group::World, one).wait()?;
        Ok(sum.to_vec1::<f32>()?[0])
    }

    /// Whether `flag` is set on any rank (every rank gets the same answer).
    pub fn any_over_world(&self, flag: bool) -> Result<bool> {
        Ok(self.sum_over_world(if flag { 1.0 } else { 0.0 })? > 0.0)
    }

    /// The mean of `value` over the world (for losses logged by rank 0).
    pub fn mean_over_world(&self, value: f64) -> Result<f64> {
        let sum = self.sum_over_world(value as f32)?;
        Ok(sum as f64 / self.comm.topology().world() as f64)
    }

    /// Clips by the global gradient norm, applies AdamW with learning rate `lr` to my shards,
    /// and clears the gradient shards.
    ///
    /// Divergence: where the global gradient norm is NaN or infinite (a rank's gradient held a
    /// NaN or inf, or a rank's loss did; the squares are all-reduced in f32, so a norm above
    /// about 1.8e19 counts as infinite too), the step is skipped before either optimizer path
    /// (CPU or CUDA) runs: master weights and moments stay bitwise as they were, the gradients
    /// are dropped, and the stats say
    /// `skipped`. The norm is all-reduced, so every rank decides alike. The step count still
    /// advances: it is the training step, the one number a checkpoint saves of it, so a resumed
    /// run needs no new checkpoint field to continue bitwise as the straight run did (AdamW's
    /// bias correction of the next update counts the skipped step too).
    pub fn step(&mut self, lr: f64) -> Result<StepStats> {
        let _span = scope(&self.opts.device, Family::Optimizer);
        // Squares summed in f64 on the device, one read-back for all units.
        let squares = self
            .units
            .iter()
            .filter_map(|u| u.grad.as_ref())
            .map(crate::squares::sum_of_squares)
            .collect::<Result<Vec<_>>>()?;
        let local = match squares.is_empty() {
            true => 0.0,
            false => Tensor::stack(&squares, 0)?.sum_all()?.to_scalar::<f64>()?,
        };
        // A non-finite loss on this rank poisons the norm: its gradient may look finite (logits
        // far apart give an infinite loss and a finite softmax gradient) but is meaningless.
        let local = if std::mem::take(&mut self.non_finite_loss) {
            f64::NAN
        } else {
            local
        };
        let grad_norm = (self.sum_over_world(local as f32)? as f64).sqrt();
        self.step += 1;
        if !grad_norm.is_finite() {
            for u in &mut self.units {
                u.grad = None;
                // What the quantisers dropped from a non-finite gradient is no error to feed back.
                u.grad_state.clear();
            }
            // A new step: its first gathers come from the world, as every step's do.
            self.weights += 1;
            return Ok(StepStats {
                grad_norm,
                skipped: true,
            });
        }
        let clip = self.opts.grad_clip;
        let coef = if clip > 0.0 && grad_norm > clip {
            clip / (grad_norm + 1e-6)
        } else {
            1.0
        };
        // The weights this step makes; the working copies written beside them serve them.
        let next = self.weights + 1;
        let copy = (self.opts.compute_dtype != DType::F32).then_some(self.opts.compute_dtype);
        for u in &mut self.units {
            let u = &mut *u;
            let grad = match u.grad.take() {
                Some(g) => g,
                None => GradShard::f32(u.master.zeros_like()?),
            };
            let working;
            (u.master, u.exp_avg, u.exp_avg_sq, working) =
                self.opts.optimizer.update_tensors_with_copy(
                    &u.master,
                    &grad,
                    &u.exp_avg,
                    &u.exp_avg_sq,
                    &u.decay,
                    coef,
                    lr,
                    self.step,
                    copy,
                )?;
            u.working = working.map(|data| Working::new(next, data));
        }
        // hpZ's secondary partitions copy the weights this step just changed: they now refuse.
        self.weights = next;
        Ok(StepStats {
            grad_norm,
            skipped: false,
        })
    }

    /// Gathers every unit's fp32 master parameters, unpadded, with their layouts (for export
    /// and tests).
    pub fn gathered_parameters(&self) -> Result<Vec<(UnitLayout, Vec<f32>)>> {
        let mut out = Vec::with_capacity(self.units.len());
        for (u, unit) in self.units.iter().enumerate() {
            let mut full = self.gather_exact(u)?;
            full.truncate(unit.layout.numel);
            out.push((unit.layout.clone(), full));
        }
        Ok(out)
    }
}

/// [`model::init_unit_range`] over all cores: the initialisation is counter-based, so any split
/// of the range gives the same values (a 6.7B model is 6.7e9 normal draws).
fn init_parallel(cfg: &ModelConfig, layout: &UnitLayout, seed: u64, start: usize, out: &mut [f32]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 20;
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| model::init_unit_range(cfg, layout, seed, start + i * CHUNK, chunk));
}

mod source;
mod state;
#[cfg(test)]
mod tests;
