//! The machine a throughput prediction is for: its GPU, links and topology
//! ([`Cluster`]), and what a ring, an all-to-all, a memory-bound kernel and a linear layer's
//! FLOP take on it. [`crate::throughput`] builds its step from these.

use comm::Topology;
use model::LinearFormat;
use serde::Serialize;

use super::gpus::Gpu;

/// The share of the dense peak that a linear layer's GEMMs reach by themselves at a
/// transformer's shapes: cuBLASLt's bf16 GEMMs ran at about 700 TFLOP/s of the H200's 989 at
/// Llama 3.2 1B's (docs/results.md). The rest of the gap to `--mfu-fraction` is what the
/// fraction folds into the linear layers (norms, elementwise kernels, launch gaps), and under
/// FP8 only the GEMMs' part of a linear layer's time gets faster.
pub const GEMM_FRACTION: f64 = 0.7;
/// FP8 E4M3 GEMMs over bf16's at the same shapes on Hopper, measured (issue 40,
/// `torch._scaled_mm`): 1.63x at Llama 3.2 1B's linear shapes, 1.80x at 3B's, 1.91x at 8B's;
/// our block-scaled cuBLASLt GEMMs ran as fast as torch's (docs/results.md). The smallest of
/// the three, so that a prediction errs towards bf16; never above the data sheets' ratio.
pub const FP8_GEMM_SPEEDUP: f64 = 1.63;
/// Default `--inter-gbps`: one 100 Gb/s InfiniBand link a node, the paper's slowest cluster.
pub const DEFAULT_INTER_GBPS: f64 = 100.0;
/// Default `--latency-us`: a few µs a message, between NCCL's own per-hop estimates over
/// NVLink and over the network (src/graph/tuning.cc).
pub const DEFAULT_LATENCY_US: f64 = 5.0;

/// The links.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Network {
    /// Gb/s a GPU sends inside its node (NVLink, one direction).
    pub intra_gbps: f64,
    /// Gb/s a node sends to the others: all its network links together.
    pub inter_gbps: f64,
    /// µs a message (a ring step, an all-to-all peer).
    pub latency_us: f64,
}

/// The machine a prediction is for.
#[derive(Clone, Copy, Debug)]
pub struct Cluster {
    pub gpu: Gpu,
    /// The share of `peak_tflops` the compute reaches.
    pub mfu_fraction: f64,
    pub network: Network,
    pub topology: Topology,
    /// Ranks that share one GPU: 1, or the world with `--shared-gpu` (the local backend's
    /// worlds on one GPU), where every kernel of the world runs on the same SMs and memory.
    pub ranks_per_gpu: usize,
    /// Whether communication overlaps compute as the engine schedules it; `false`
    /// (`--no-overlap`): every job after the compute, the step their sum.
    pub overlap: bool,
}

/// A ring all-gather or reduce-scatter of `total` bytes (the whole gathered buffer, or the whole
/// input) over `p` ranks at `bytes_per_s` on its slowest edge: `(p-1)/p x total / bytes_per_s +
/// (p-1) x latency_s`; 0 for one rank.
pub fn ring_s(total: f64, p: usize, bytes_per_s: f64, latency_s: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let steps = (p - 1) as f64;
    steps / p as f64 * total / bytes_per_s + steps * latency_s
}

/// A direct all-to-all over `p` ranks of `per_rank` bytes each (its whole input, its own chunk
/// included) at `bytes_per_s` a rank: `(p-1)/p x per_rank / bytes_per_s + (p-1) x latency_s`.
pub fn all_to_all_s(per_rank: f64, p: usize, bytes_per_s: f64, latency_s: f64) -> f64 {
    ring_s(per_rank, p, bytes_per_s, latency_s)
}

impl Cluster {
    pub(crate) fn flop_rate(&self) -> f64 {
        self.gpu.peak_tflops * 1e12 * self.mfu_fraction
    }

    /// Seconds a FLOP of the blocks' linear layers in `linears` takes. In the compute dtype,
    /// `1 / (peak x mfu-fraction)`. In FP8 the GEMMs' share of that, `1 / (peak x
    /// GEMM_FRACTION)`, runs [`FP8_GEMM_SPEEDUP`] times faster (at most the data sheets'
    /// ratio), and the rest (the work the fraction folds in) does not change. A GPU without
    /// FP8 (which `trainer plan` refuses before it predicts) gets the dense time.
    pub(crate) fn linear_s_per_flop(&self, linears: LinearFormat) -> f64 {
        let dense = 1.0 / self.flop_rate();
        match (linears, self.gpu.fp8_peak_tflops) {
            (LinearFormat::Fp8, Some(fp8)) => {
                let gemm = dense.min(1.0 / (self.gpu.peak_tflops * 1e12 * GEMM_FRACTION));
                let speedup = FP8_GEMM_SPEEDUP.min(fp8 / self.gpu.peak_tflops);
                gemm / speedup + (dense - gemm)
            }
            _ => dense,
        }
    }

    fn intra(&self) -> f64 {
        self.network.intra_gbps * 1e9 / 8.0
    }

    fn inter(&self) -> f64 {
        self.network.inter_gbps * 1e9 / 8.0
    }

    pub(crate) fn latency(&self) -> f64 {
        self.network.latency_us * 1e-6
    }

    /// A world ring of `total` bytes: its slowest edge is a node's link when it spans nodes.
    pub fn world_ring_s(&self, total: f64) -> f64 {
        let bw = match self.topology.nodes > 1 {
            true => self.intra().min(self.inter()),
            false => self.intra(),
        };
        ring_s(total, self.topology.world(), bw, self.latency())
    }

    /// A ring over my node's D ranks.
    pub fn node_ring_s(&self, total: f64) -> f64 {
        ring_s(
            total,
            self.topology.ranks_per_node,
            self.intra(),
            self.latency(),
        )
    }

    /// qgZ's hop 1: an all-to-all of `per_rank` bytes over my node.
    pub fn node_all_to_all_s(&self, per_rank: f64) -> f64 {
        all_to_all_s(
            per_rank,
            self.topology.ranks_per_node,
            self.intra(),
            self.latency(),
        )
    }

    /// qgZ's hop 2: an all-to-all of `per_rank` bytes over the N ranks of my local index, the D
    /// such groups of a node sharing its link.
    pub fn cross_all_to_all_s(&self, per_rank: f64) -> f64 {
        let d = self.topology.ranks_per_node as f64;
        let bw = self.intra().min(self.inter() / d);
        all_to_all_s(per_rank, self.topology.nodes, bw, self.latency())
    }

    /// A memory-bound kernel moving `bytes` (read + written), on a GPU its ranks share.
    pub fn memory_s(&self, bytes: f64) -> f64 {
        self.ranks_per_gpu as f64 * bytes / (self.gpu.mem_bw_gbs * 1e9)
    }

    /// Compute that takes `s` seconds on a GPU of its own, on a GPU its ranks share.
    pub(crate) fn shared(&self, s: f64) -> f64 {
        self.ranks_per_gpu as f64 * s
    }
}
