//! `trainer plan --throughput`: the predicted step time, tokens/s, TFLOP/s per GPU and exposed
//! communication of a config on a cluster shape, for plain ZeRO-3, each ZeRO++ technique alone
//! (qwZ, hpZ, qgZ) and all three (issue 28). docs/plan.md, "Throughput, predicted", lists every
//! input and compares the paper's published figures.
//!
//! The model is the engine's schedule, with closed forms for each piece:
//!
//! - **Compute.** A unit's forward FLOPs per token: a block's `2 x numel` plus causal attention
//!   `2 T C` (the convention of `Model::flops_per_token`, attention counted once); the LM head
//!   `2 V C`; an embedding lookup and a norm 0. Backward is twice the forward; with
//!   `model.recompute = true` a block's backward runs its forward again, with `"attention"`
//!   its attention half (the attention and the linear layers of
//!   `Family::attention_half_params`). Compute runs at
//!   `peak_tflops x mfu_fraction`. With `train.precision = "fp8"` the GEMMs' share of a block's
//!   linear layers (its `2 x numel`; the GEMMs alone reach [`GEMM_FRACTION`] of the peak) runs
//!   [`FP8_GEMM_SPEEDUP`] times faster, as measured, the rest of their time does not change,
//!   and their FP8 casts ([`Model::fp8_cast_bytes`]) run at [`FP8_CAST_BANDWIDTH_FRACTION`] of
//!   the memory bandwidth. The default fraction, 0.5, is the share of dense tensor peak
//!   that large transformer matmuls reach end to end in well-tuned trainers (Megatron-LM, 52% of
//!   A100 peak at 1T parameters, Narayanan et al. 2021); it is not fitted to the paper.
//! - **Collectives.** [`ring_s`]: a ring all-gather or reduce-scatter of `S` bytes over `p`
//!   ranks sends `(p-1)/p x S` over each ring edge in `p - 1` steps: `(p-1)/p x S / bw + (p-1) x
//!   latency`, at the bandwidth of the ring's slowest edge. Inside a node that is a GPU's NVLink
//!   (`intra_gbps`); a ring over nodes crosses each node's network link once, so its slowest
//!   edge is `min(intra, inter)` with `inter_gbps` the node's links together. This is why the
//!   time model does not divide the node's link by its D ranks for a ring: the ring forwards
//!   inside the node what entered it once, so a node's link carries `(p-1)/p x S`, the paper's
//!   "M across nodes per gather", and not D times the per-rank logical bytes of `comm` (which
//!   count each peer's copy). [`all_to_all_s`]: a direct all-to-all sends `(p-1)/p` of each
//!   rank's input to its peers, the same closed form on that input; qgZ's hop 2 runs the D
//!   ranks of a node at once over the node's link, so each sees `min(intra, inter / D)`.
//! - **Per unit, as the engine issues it** (payload bytes from [`zero::volume::unit_payload`],
//!   the byte counts of the plan's `comm` section): a plain gather is one world ring of the
//!   buffer in the parameter precision; qwZ's is two (INT8 codes, then f32 scales) plus the
//!   dequantise (codes and scales read, the buffer written) at the GPU's memory bandwidth; hpZ's
//!   later gathers of the step are node rings of the same buffer; the reduce-scatter is a world
//!   ring of the gradient in `zero.reduce_dtype` (fp32, or bf16: half the bytes); qgZ is the INT4 quantiser (fp32 read, INT4 written), hop 1 over
//!   the node, the fused dequantise-sum-requantise, hop 2 over the nodes and the final
//!   dequantise-sum, with error feedback reading and writing its f32 errors. Kernels run on the
//!   communication stream (docs/zeropp.md), so they add to the job's time.
//! - **Overlap**: [`super::overlap::overlap`] walks each micro-batch's schedule (gathers
//!   `zero.prefetch_depth` ahead, 2 reductions in flight); whether hpZ serves a gather from the
//!   node is the engine's rule, [`zero::SecondaryPartition::serves`] (a backward gather issued
//!   before its unit's forward gather was waited crosses nodes). A step is its micro-batches' walks, then the optimizer
//!   (AdamW and the squares over the shard, memory-bound) and two one-float all-reduces (loss,
//!   gradient norm) at `2 log2(W)` latencies each, which nothing hides.
//!
//! Not modelled: contention between the communication kernels and the compute for memory
//! bandwidth and SMs, NCCL's protocol and channel choices, stragglers, the data loader and the
//! gradient cast before a reduction (the same in every variant).
//!
//! TFLOP/s per GPU counts what the GPU executes, recomputation included (`tflops_per_gpu`),
//! which is how Megatron-DeepSpeed, the framework of the paper's runs, counts (its throughput
//! calculator multiplies by 4 instead of 3 with activation checkpointing);
//! `model_tflops_per_gpu` is `Model::flops_per_token` (no recomputation), what training logs.

use comm::{Group, Topology};
use model::{BackwardParams, LinearFormat, Model, Pass, Recompute, UnitKind};
use serde::Serialize;
use zero::volume::{unit_payload, UnitPayload};
use zero::{GatherSlot, ZeroConfig, ZeroPlan, REDUCTIONS_IN_FLIGHT};

use super::calibrate::Calibration;
pub use super::cluster::{
    all_to_all_s, ring_s, Cluster, Network, DEFAULT_INTER_GBPS, DEFAULT_LATENCY_US,
    FP8_GEMM_SPEEDUP, GEMM_FRACTION,
};
pub use super::gpus::{gpu, Gpu, DEFAULT_GPU, GPUS};
use super::overlap::{overlap, Slot, Timeline};

/// Default `--mfu-fraction` (module doc).
pub const DEFAULT_MFU_FRACTION: f64 = 0.5;
/// The share of the memory bandwidth the FP8 quantisers reach: 2.09 to 2.47 TB/s of bytes read
/// and written on the H100's 3.35 (62-74%) since they keep their tile in registers
/// (kernels/cuda/fp8.cu's header, 2026-12-06; about half before).
pub const FP8_CAST_BANDWIDTH_FRACTION: f64 = 0.7;
/// What one unit's jobs take on the communication stream under one plan, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UnitComm {
    /// A gather from the world (plain or qwZ).
    pub world_gather: f64,
    /// hpZ: a gather of the secondary partitions over the node.
    pub node_gather: f64,
    /// The gradient reduction (reduce-scatter, or qgZ's two hops and kernels).
    pub reduce: f64,
}

/// The jobs of a unit with payload `p` under `plan`.
pub fn unit_comm(plan: &ZeroPlan, p: &UnitPayload, c: &Cluster) -> UnitComm {
    let (data, scales) = (p.gather_data as f64, p.gather_scales as f64);
    let dequantise = match p.decode {
        0 => 0.0,
        bytes => c.memory_s(bytes as f64),
    };
    let two_rings = |ring: &dyn Fn(f64) -> f64| {
        ring(data)
            + match scales > 0.0 {
                true => ring(scales),
                false => 0.0,
            }
    };
    let world_gather = two_rings(&|s| c.world_ring_s(s)) + dequantise;
    let node_gather = two_rings(&|s| c.node_ring_s(s)) + dequantise;
    // The reduction of a qgZ step where qgZ is on: its kernels, then each hop on its group.
    let reduction = plan.grad_reductions()[0].codec();
    let reduce = match plan.topology.world() {
        // One rank: the scaled gradient is the shard, whatever the plan (crates/zero/src/reduce.rs).
        1 => 0.0,
        _ => {
            let kernels = match reduction.kernel_traffic(p.padded, plan.topology) {
                0 => 0.0,
                bytes => c.memory_s(bytes as f64),
            };
            let hops = reduction.hops(p.padded, plan.topology);
            hops.iter().fold(kernels, |t, hop| {
                let input = hop.input as f64;
                t + match hop.group {
                    Group::World => c.world_ring_s(input),
                    Group::IntraNode => c.node_all_to_all_s(input),
                    Group::InterNode => c.cross_all_to_all_s(input),
                }
            })
        }
    };
    UnitComm {
        world_gather,
        node_gather,
        reduce,
    }
}

/// Unit `u`'s forward FLOPs per token as (the linear layers' `2 x numel`, the attention's
/// `2 T C`); the head apart, an embedding and a norm 0.
pub(crate) fn forward_flops_split(model: &Model, u: usize) -> (f64, f64) {
    let cfg = model.config();
    let unit = &model.units()[u];
    match unit.kind {
        UnitKind::Block(_) => (
            2.0 * unit.numel as f64,
            2.0 * (cfg.seq_len * cfg.n_embd) as f64,
        ),
        UnitKind::Embedding | UnitKind::FinalNorm => (0.0, 0.0),
    }
}

/// [`forward_flops_split`] of what unit `u`'s backward runs again under `mode`: nothing, the
/// whole forward of a block under [`Recompute::Full`], or under [`Recompute::Attention`] the
/// linear layers of its attention half (`Family::attention_half_params`) and the attention.
pub(crate) fn recomputed_flops_split(model: &Model, u: usize, mode: Recompute) -> (f64, f64) {
    let (linear, rest) = forward_flops_split(model, u);
    let cfg = model.config();
    match (mode, model.units()[u].kind) {
        (Recompute::Full, UnitKind::Block(_)) => (linear, rest),
        (Recompute::Attention, UnitKind::Block(_)) => {
            let params = cfg.family().attention_half_params(cfg).unwrap_or(0);
            (2.0 * params as f64, rest)
        }
        _ => (0.0, 0.0),
    }
}

/// What is trained: the model and the per-GPU batch of a step.
pub struct Workload<'a> {
    pub model: &'a Model,
    /// Sequences a micro-batch.
    pub micro_batch: usize,
    /// Micro-batches a step.
    pub accumulation: usize,
    /// Bytes of a plain gathered parameter (2 for bf16/fp16).
    pub param_bytes: usize,
    pub recompute: Recompute,
    /// Measured unit and optimizer times (`--calibrate`) in place of FLOPs at the GPU's rate.
    pub calibration: Option<&'a Calibration>,
}

impl<'a> Workload<'a> {
    /// `micro_batch` sequences a micro-batch, `accumulation` micro-batches a step, gathered in
    /// bf16, from FLOPs (no calibration): the workload the tests predict.
    #[cfg(test)]
    pub(crate) fn bf16(
        model: &'a Model,
        micro_batch: usize,
        accumulation: usize,
        recompute: Recompute,
    ) -> Self {
        Workload {
            model,
            micro_batch,
            accumulation,
            param_bytes: 2,
            recompute,
            calibration: None,
        }
    }
}

impl Workload<'_> {
    /// Seconds of unit `u`'s forward in a micro-batch on `c`; `codes`: its weights arrive as
    /// FP8 codes (FP8 qwZ), which its FP8 layers do not quantise.
    fn forward_s(&self, u: usize, codes: bool, c: &Cluster) -> f64 {
        c.shared(match self.calibration {
            Some(k) => k.forward_s[u],
            None => {
                self.compute_s(self.forward_flops_split(u), c) + self.casts_s(u, false, codes, c)
            }
        })
    }

    /// Seconds of unit `u`'s backward in a micro-batch on `c` (`codes` as for the forward).
    fn backward_s(&self, u: usize, codes: bool, c: &Cluster) -> f64 {
        c.shared(match self.calibration {
            Some(k) => k.backward_s[u],
            None => {
                self.compute_s(self.backward_flops_split(u), c) + self.casts_s(u, true, codes, c)
            }
        })
    }

    /// Seconds of unit `u`'s FP8 casts in a micro-batch's forward, or its backward (with the
    /// forward's again for a block that recomputes, in either mode: the attention half's
    /// recomputation casts the MLP's inputs again too), at [`FP8_CAST_BANDWIDTH_FRACTION`] of
    /// the GPU's memory bandwidth: the bytes of [`Model::fp8_cast_bytes`], none for a model
    /// whose layers multiply in the compute dtype.
    fn casts_s(&self, u: usize, backward: bool, codes: bool, c: &Cluster) -> f64 {
        let tokens = self.micro_batch * self.model.config().seq_len;
        let (forward, backward_bytes) = self.model.fp8_cast_bytes(u, tokens, codes);
        let block = matches!(self.model.units()[u].kind, UnitKind::Block(_));
        // A recomputation casts the forward's inputs again, and its weights; a walk that kept
        // their codes from the forward transposes those, as FP8 qwZ's forward does.
        let recast = match self.model.backward_params() {
            BackwardParams::Kept if !codes => {
                forward - self.model.fp8_cast_bytes(u, 0, false).0
                    + self.model.fp8_cast_bytes(u, 0, true).0
            }
            _ => forward,
        };
        let bytes = match (backward, block && self.recompute.any()) {
            (false, _) => forward,
            (true, false) => backward_bytes,
            (true, true) => backward_bytes + recast,
        };
        bytes as f64 / (c.gpu.mem_bw_gbs * 1e9 * FP8_CAST_BANDWIDTH_FRACTION)
    }

    /// Seconds of a micro-batch's `(linear, rest)` FLOPs a token at the GPU's rates: the
    /// linear layers' at the rate of the model's [`LinearFormat`], the attention's at the
    /// dense rate.
    fn compute_s(&self, (linear, rest): (f64, f64), c: &Cluster) -> f64 {
        let linear_s = linear * c.linear_s_per_flop(self.model.linears());
        self.tokens_per_micro_batch() * (linear_s + rest / c.flop_rate())
    }

    /// Seconds of the loss head's forward and backward in a micro-batch on `c`.
    fn head_s(&self, c: &Cluster) -> f64 {
        c.shared(match self.calibration {
            Some(k) => k.head_s,
            None => self.head_flops() * self.tokens_per_micro_batch() / c.flop_rate(),
        })
    }

    /// Seconds of the optimizer step over a shard of `shard` parameters on `c`.
    fn optimizer_s(&self, shard: f64, c: &Cluster) -> f64 {
        match self.calibration {
            Some(k) => c.shared(shard * k.optimizer_s_per_param),
            // AdamW reads grad, master, m, v and writes master, m, v and the working copy; the
            // squares read the gradient once more.
            None => c.memory_s(shard * (32.0 + self.param_bytes as f64)),
        }
    }

    fn tokens_per_micro_batch(&self) -> f64 {
        (self.micro_batch * self.model.config().seq_len) as f64
    }

    /// Forward FLOPs of unit `u`'s own layers per token (the head apart).
    fn forward_flops(&self, u: usize) -> f64 {
        let (linear, rest) = self.forward_flops_split(u);
        linear + rest
    }

    /// [`Workload::forward_flops`] as (the linear layers' `2 x numel`, the attention's
    /// `2 T C`).
    fn forward_flops_split(&self, u: usize) -> (f64, f64) {
        forward_flops_split(self.model, u)
    }

    /// [`recomputed_flops_split`] under this workload's recomputation.
    fn recomputed_flops_split(&self, u: usize) -> (f64, f64) {
        recomputed_flops_split(self.model, u, self.recompute)
    }

    /// Unit `u`'s backward per token as `(linear, rest)`: twice the forward, and what it
    /// recomputes.
    fn backward_flops_split(&self, u: usize) -> (f64, f64) {
        let (linear, rest) = self.forward_flops_split(u);
        let (again_linear, again_rest) = self.recomputed_flops_split(u);
        (2.0 * linear + again_linear, 2.0 * rest + again_rest)
    }

    /// Backward FLOPs of unit `u` per token.
    fn backward_flops(&self, u: usize) -> f64 {
        let (linear, rest) = self.backward_flops_split(u);
        linear + rest
    }

    /// The LM head's forward and backward FLOPs per token: `3 x 2 V C`.
    fn head_flops(&self) -> f64 {
        let cfg = self.model.config();
        6.0 * (cfg.vocab_size * cfg.n_embd) as f64
    }

    /// What a GPU executes per micro-batch: every unit forward and backward and the head.
    pub fn hardware_flops_per_micro_batch(&self) -> f64 {
        let units = 0..self.model.units().len();
        let per_token: f64 = units
            .map(|u| self.forward_flops(u) + self.backward_flops(u))
            .sum::<f64>()
            + self.head_flops();
        per_token * self.tokens_per_micro_batch()
    }

    /// One micro-batch's walk in the engine's order ([`Model::gather_order`]); `first`: the
    /// step's first micro-batch, whose forward gathers come from the world under hpZ.
    pub fn walk(&self, plan: &ZeroPlan, comm: &[UnitComm], first: bool, c: &Cluster) -> Vec<Slot> {
        let order = self.model.gather_order(Pass::Train);
        let n = self.model.units().len();
        let head = self.model.head_unit();
        let depth = plan.prefetch_depth;
        let secondary = plan.step_plan(1, Pass::Train).secondary;
        let codes = plan.qwz.is_some_and(|q| q.fp8);
        let mut reduced = vec![false; n];
        let mut slots = Vec::with_capacity(order.len() + 1);
        for (k, &u) in order.iter().enumerate() {
            let forward = k < n;
            // hpZ's rule, as the engine applies it: the unit's forward gather is at position u.
            let from_node = secondary.serves(GatherSlot::at(k, u, depth, first));
            let gather = match from_node {
                true => comm[u].node_gather,
                false => comm[u].world_gather,
            };
            let (compute, reduce) = if forward && u == head && u == n - 1 {
                // The last unit holds the head: forward, head, its own backward.
                let s = self.forward_s(u, codes, c) + self.head_s(c) + self.backward_s(u, codes, c);
                (s, true)
            } else if forward {
                (self.forward_s(u, codes, c), false)
            } else if u == head {
                (self.head_s(c), false)
            } else {
                (self.backward_s(u, codes, c), true)
            };
            reduced[u] |= reduce;
            slots.push(Slot {
                gather_s: Some(gather),
                compute_s: compute,
                reduce_s: reduce.then_some(comm[u].reduce),
            });
        }
        // A walk that keeps the forward's parameters gathers nothing after the forward: a
        // tied head runs on the embedding's, and every backward on its unit's.
        if self.model.backward_params() == BackwardParams::Kept && head != n - 1 {
            slots.push(Slot {
                gather_s: None,
                compute_s: self.head_s(c),
                reduce_s: None,
            });
        }
        // Units whose backward reads no parameters (an embedding), or reads those kept from
        // its forward, finish last, ungathered.
        for u in (0..n).rev().filter(|&u| !reduced[u]) {
            slots.push(Slot {
                gather_s: None,
                compute_s: self.backward_s(u, codes, c),
                reduce_s: Some(comm[u].reduce),
            });
        }
        slots
    }
}

/// One variant's prediction.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Prediction {
    /// Seconds an optimizer step.
    pub step_s: f64,
    /// The compute stream's work a step: units, head, optimizer.
    pub compute_s: f64,
    /// The communication stream's work a step (gathers, reductions, their kernels) and the two
    /// closing all-reduces.
    pub comm_s: f64,
    /// `step_s - compute_s`: the communication nothing hid.
    pub exposed_comm_s: f64,
    /// Tokens a second, the whole cluster.
    pub tokens_per_s: f64,
    pub tokens_per_s_per_gpu: f64,
    /// Executed FLOPs (recomputation included) per second per GPU, in 10^12.
    pub tflops_per_gpu: f64,
    /// `Model::flops_per_token` x tokens per second per GPU, in 10^12 (no recomputation).
    pub model_tflops_per_gpu: f64,
    /// ZeRO-3's step time over this one.
    pub speedup: f64,
}

/// The prediction for `work` under `plan` on `c` (its `speedup` is 1: [`throughput`] sets it).
pub fn predict(work: &Workload, plan: &ZeroPlan, c: &Cluster) -> Prediction {
    // The engine's walk of this plan: at W = 1 the backward keeps the forward's parameters.
    let model = work
        .model
        .clone()
        .with_backward_params(plan.backward_params());
    let work = &Workload {
        model: &model,
        calibration: work.calibration,
        ..*work
    };
    let payloads: Vec<UnitPayload> = work
        .model
        .units()
        .iter()
        .enumerate()
        .map(|(i, u)| unit_payload(plan, i, u.numel, work.param_bytes))
        .collect();
    let comm: Vec<UnitComm> = payloads.iter().map(|p| unit_comm(plan, p, c)).collect();
    let depth = plan.prefetch_depth;
    let run = |first| {
        overlap(
            &work.walk(plan, &comm, first, c),
            depth,
            REDUCTIONS_IN_FLIGHT,
        )
    };
    let first: Timeline = run(true);
    let later = (work.accumulation - 1) as f64;
    let rest = match later > 0.0 {
        true => run(false),
        false => first,
    };
    let w = plan.topology.world();
    let shard: f64 = payloads.iter().map(|p| (p.padded / w) as f64).sum();
    let optimizer = work.optimizer_s(shard, c);
    let all_reduces = 2.0 * 2.0 * (w as f64).log2().ceil() * c.latency();
    let compute_s = first.compute_s + later * rest.compute_s + optimizer;
    let comm_s = first.comm_s + later * rest.comm_s + all_reduces;
    let step_s = match c.overlap {
        true => first.end_s + later * rest.end_s + optimizer + all_reduces,
        false => compute_s + comm_s,
    };
    let tokens_per_gpu = work.tokens_per_micro_batch() * work.accumulation as f64;
    let hardware = work.hardware_flops_per_micro_batch() * work.accumulation as f64;
    let model_flops = work.model.flops_per_token(work.model.config().seq_len) * tokens_per_gpu;
    Prediction {
        step_s,
        compute_s,
        comm_s,
        exposed_comm_s: step_s - compute_s,
        tokens_per_s: tokens_per_gpu * w as f64 / step_s,
        tokens_per_s_per_gpu: tokens_per_gpu / step_s,
        tflops_per_gpu: hardware / step_s / 1e12,
        model_tflops_per_gpu: model_flops / step_s / 1e12,
        speedup: 1.0,
    }
}

/// The five variants: name, qwZ, hpZ, qgZ.
pub const VARIANTS: [(&str, bool, bool, bool); 5] = [
    ("ZeRO-3", false, false, false),
    ("qwZ", true, false, false),
    ("hpZ", false, true, false),
    ("qgZ", false, false, true),
    ("ZeRO++", true, true, true),
];

/// The `throughput` section of the report.
#[derive(Debug, Serialize)]
pub struct Throughput {
    pub gpu: Gpu,
    pub mfu_fraction: f64,
    pub network: Network,
    /// Ranks sharing one GPU (`--shared-gpu`: the world).
    pub ranks_per_gpu: usize,
    /// False with `--no-overlap`: every job serialised after the compute.
    pub overlap: bool,
    /// The `--calibrate` file whose unit times replaced the GPU's peak x fraction, else null.
    pub calibrated_from: Option<String>,
    /// The blocks' linear layers multiply in FP8 (`train.precision = "fp8"`): their GEMMs
    /// [`FP8_GEMM_SPEEDUP`] times faster, their casts at [`FP8_CAST_BANDWIDTH_FRACTION`].
    pub fp8_linears: bool,
    /// Tokens a GPU trains a step: micro_batch x seq_len x accumulation.
    pub tokens_per_gpu_step: u64,
    /// FLOPs a GPU executes a step, recomputation included.
    pub hardware_flops_per_gpu_step: f64,
    /// `Model::flops_per_token` x tokens a GPU step.
    pub model_flops_per_gpu_step: f64,
    pub zero3: Prediction,
    pub qwz: Prediction,
    pub hpz: Prediction,
    pub qgz: Prediction,
    pub zeropp: Prediction,
}

impl Throughput {
    /// The variants in [`VARIANTS`] order, with their names.
    pub fn variants(&self) -> [(&'static str, &Prediction); 5] {
        let p = [&self.zero3, &self.qwz, &self.hpz, &self.qgz, &self.zeropp];
        std::array::from_fn(|i| (VARIANTS[i].0, p[i]))
    }
}

/// The plan of one variant: `base` (blocks, prefetch depth, error feedback, the reduce-scatter's
/// dtype) with the techniques
/// set, qgZ on for the whole run (the prediction is of a step with qgZ).
pub fn variant_plan(
    base: &ZeroConfig,
    (qwz, hpz, qgz): (bool, bool, bool),
    topology: Topology,
    steps: u64,
) -> zero::Result<ZeroPlan> {
    let cfg = ZeroConfig {
        quantized_weights: qwz,
        hpz_partition_size: if hpz { topology.ranks_per_node } else { 1 },
        quantized_gradients: qgz,
        qgz_until: 1.0,
        qgz_error_feedback: qgz && base.qgz_error_feedback,
        ..base.clone()
    };
    ZeroPlan::resolve(&cfg, topology, steps)
}

/// The five predictions of `work` on `c`, each variant of `base`.
pub fn throughput(
    work: &Workload,
    base: &ZeroConfig,
    steps: u64,
    c: &Cluster,
) -> zero::Result<Throughput> {
    let mut p = Vec::with_capacity(VARIANTS.len());
    for (_, qwz, hpz, qgz) in VARIANTS {
        let plan = variant_plan(base, (qwz, hpz, qgz), c.topology, steps)?
            .with_linears(work.model.linears(), work.model.layout());
        p.push(predict(work, &plan, c));
    }
    let zero3_s = p[0].step_s;
    for v in &mut p {
        v.speedup = zero3_s / v.step_s;
    }
    let tokens = work.tokens_per_micro_batch() * work.accumulation as f64;
    Ok(Throughput {
        gpu: c.gpu,
        mfu_fraction: c.mfu_fraction,
        network: c.network,
        ranks_per_gpu: c.ranks_per_gpu,
        overlap: c.overlap,
        calibrated_from: None,
        fp8_linears: work.model.linears() == LinearFormat::Fp8,
        tokens_per_gpu_step: tokens as u64,
        hardware_flops_per_gpu_step: work.hardware_flops_per_micro_batch()
            * work.accumulation as f64,
        model_flops_per_gpu_step: work.model.flops_per_token(work.model.config().seq_len) * tokens,
        zero3: p[0],
        qwz: p[1],
        hpz: p[2],
        qgz: p[3],
        zeropp: p[4],
    })
}

#[cfg(test)]
#[path = "throughput_tests.rs"]
mod tests;
