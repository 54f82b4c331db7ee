//! The GPUs `trainer plan --throughput --gpu` knows: dense peaks, memory bandwidth, NVLink and
//! memory from NVIDIA's data sheets. The time model that uses them is [`super::throughput`].

use serde::Serialize;

/// A GPU: its dense peak in the training precision, memory bandwidth and default NVLink.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Gpu {
    pub name: &'static str,
    /// Dense tensor-core TFLOP/s in fp16/bf16 (no sparsity).
    pub peak_tflops: f64,
    /// Dense tensor-core TFLOP/s in FP8 (E4M3), for the blocks' linear layers of
    /// `train.precision = "fp8"`; `None` on a GPU without FP8 tensor cores (before Ada/Hopper).
    pub fp8_peak_tflops: Option<f64>,
    /// GB/s (10^9 bytes) of device memory.
    pub mem_bw_gbs: f64,
    /// NVLink per GPU, one direction, Gb/s: the default of `--intra-gbps`.
    #[serde(skip)]
    pub nvlink_gbps: f64,
    /// GiB of device memory (the largest variant of the part): what `--advise` fits into.
    pub memory_gib: f64,
}

/// The presets of `--gpu`, from NVIDIA's data sheets (FP8: H100 and H200 SXM 1,979 TFLOP/s
/// dense, twice bf16's; V100 and A100 have none). NVLink per direction is half the
/// data sheet's bidirectional figure: V100 SXM2 300 GB/s (6 links, as in the DGX-2 of the
/// paper), A100 SXM 600 GB/s, H100 and H200 SXM 900 GB/s. Memory: V100 32 GB (the paper's
/// DGX-2), A100 and H100 80 GB, H200 141 GB (140 GiB as `nvidia-smi` counts it).
pub const GPUS: [Gpu; 4] = [
    Gpu {
        name: "v100",
        peak_tflops: 125.0,
        fp8_peak_tflops: None,
        mem_bw_gbs: 900.0,
        nvlink_gbps: 1200.0,
        memory_gib: 32.0,
    },
    Gpu {
        name: "a100",
        peak_tflops: 312.0,
        fp8_peak_tflops: None,
        mem_bw_gbs: 2039.0,
        nvlink_gbps: 2400.0,
        memory_gib: 80.0,
    },
    Gpu {
        name: "h100",
        peak_tflops: 989.0,
        fp8_peak_tflops: Some(1979.0),
        mem_bw_gbs: 3350.0,
        nvlink_gbps: 3600.0,
        memory_gib: 80.0,
    },
    Gpu {
        name: "h200",
        peak_tflops: 989.0,
        fp8_peak_tflops: Some(1979.0),
        mem_bw_gbs: 4800.0,
        nvlink_gbps: 3600.0,
        memory_gib: 140.0,
    },
];

/// The preset named `name` (case-insensitive).
pub fn gpu(name: &str) -> Option<Gpu> {
    GPUS.iter()
        .find(|g| g.name.eq_ignore_ascii_case(name))
        .copied()
}

/// Default `--gpu`: the GPU this project's runs use (docs/results.md).
pub const DEFAULT_GPU: &str = "h200";
