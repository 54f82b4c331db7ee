//! The AdamW update of `optimizer.rs` as one CUDA kernel (NVRTC), bitwise equal to
//! [`AdamW::update`]: the same f64 operations in the same order, written with IEEE intrinsics
//! (`__dmul_rn`, `__ddiv_rn`, `__dsqrt_rn`, ...) and compiled without FMA contraction, the bias
//! corrections computed on the host as `update` computes them, and the weight decay taken on the
//! `DecayRanges` only.
//!
//! Launch shape: one thread per element, 256 a CTA. The decay ranges (sorted, disjoint) travel
//! by value in the kernel parameters, up to `MAX_RANGES` a launch; a shard with more ranges is
//! cut into element spans of at most that many ranges each, one launch per span. Each thread
//! binary-searches its element's range. Bytes moved per element: 16 read (param, grad, m, v),
//! 12 written (new param, m, v).

use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::compile_ptx_with_opts;
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, Result, Storage, Tensor};

use crate::optimizer::{AdamW, DecayRanges};

/// Decay ranges a launch carries in its parameters.
pub(crate) const MAX_RANGES: usize = 64;

/// CUDA C source of the AdamW kernel.
pub const ADAMW_KERNEL: &str = r#"
typedef long long i64;
#define MAX_RANGES 64
struct Ranges { i64 lo[MAX_RANGES]; i64 hi[MAX_RANGES]; int count; };

// param, grad, m, v [len] f32 -> p_out, m_out, v_out, on elements [start, end).
extern "C" __global__ void __launch_bounds__(256) adamw_f32(
    const float* __restrict__ param, const float* __restrict__ grad,
    const float* __restrict__ m_in, const float* __restrict__ v_in,
    float* __restrict__ p_out, float* __restrict__ m_out, float* __restrict__ v_out,
    i64 start, i64 end, Ranges ranges,
    double beta1, double one_minus_beta1, double beta2, double one_minus_beta2,
    double eps, double weight_decay, double grad_coef, double lr, double bc1, double bc2) {
    const i64 i = start + (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= end) return;
    // Number of ranges starting at or before i; the last of them may contain i.
    int lo = 0, hi = ranges.count;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (ranges.lo[mid] <= i) lo = mid + 1; else hi = mid;
    }
    const double wd = (lo > 0 && i < ranges.hi[lo - 1]) ? weight_decay : 0.0;
    const double g = __dmul_rn((double)grad[i], grad_coef);
    const double m = __dadd_rn(__dmul_rn(beta1, (double)m_in[i]), __dmul_rn(one_minus_beta1, g));
    const double v = __dadd_rn(__dmul_rn(beta2, (double)v_in[i]),
                               __dmul_rn(__dmul_rn(one_minus_beta2, g), g));
    m_out[i] = __double2float_rn(m);
    v_out[i] = __double2float_rn(v);
    const double p = (double)param[i];
    const double step = __dadd_rn(
        __ddiv_rn(__ddiv_rn(m, bc1), __dadd_rn(__dsqrt_rn(__ddiv_rn(v, bc2)), eps)),
        __dmul_rn(wd, p));
    p_out[i] = __double2float_rn(__dsub_rn(p, __dmul_rn(lr, step)));
}
"#;

/// The kernel's `Ranges` parameter.
#[repr(C)]
#[derive(Clone, Copy)]
struct Ranges {
    lo: [i64; MAX_RANGES],
    hi: [i64; MAX_RANGES],
    count: i32,
}

// SAFETY: plain #[repr(C)] data with the layout of the kernel's struct Ranges.
unsafe impl DeviceRepr for Ranges {}

/// PTX of [`ADAMW_KERNEL`], compiled once per process.
pub fn adamw_ptx() -> Result<&'static str> {
    static PTX: OnceLock<String> = OnceLock::new();
    if let Some(p) = PTX.get() {
        return Ok(p);
    }
    let ptx = compile_ptx_with_opts(ADAMW_KERNEL, quant::cuda::exact_options())
        .map_err(candle_core::Error::wrap)?;
    Ok(PTX.get_or_init(|| ptx.to_src()))
}

/// Element spans, each with at most [`MAX_RANGES`] of the (non-empty, sorted) decay ranges,
/// covering 0..len.
fn spans(len: usize, decay: &DecayRanges) -> Vec<(usize, usize, Ranges)> {
    let rs: Vec<_> = decay.0.iter().filter(|r| r.start < r.end).collect();
    let chunks: Vec<_> = rs.chunks(MAX_RANGES).collect();
    if chunks.is_empty() {
        let none = Ranges {
            lo: [0; MAX_RANGES],
            hi: [0; MAX_RANGES],
            count: 0,
        };
        return vec![(0, len, none)];
    }
    let mut out = Vec::with_capacity(chunks.len());
    for (k, c) in chunks.iter().enumerate() {
        let start = if k == 0 { 0 } else { c[0].start };
        let end = chunks.get(k + 1).map_or(len, |n| n[0].start);
        let mut r = Ranges {
            lo: [0; MAX_RANGES],
            hi: [0; MAX_RANGES],
            count: c.len() as i32,
        };
        for (i, x) in c.iter().enumerate() {
            r.lo[i] = x.start as i64;
            r.hi[i] = x.end as i64;
        }
        out.push((start, end.min(len), r));
    }
    out
}

fn view<'a>(st: &'a Storage, t: &Tensor) -> Result<CudaView<'a, f32>> {
    let Storage::Cuda(cs) = st else {
        candle_core::bail!("AdamW: tensor not on the GPU")
    };
    let o = t.layout().start_offset();
    Ok(cs.as_cuda_slice::<f32>()?.slice(o..o + t.elem_count()))
}

/// GPU [`AdamW::update_tensors`] (shapes already checked: 1-D contiguous F32, equal lengths).
#[allow(clippy::too_many_arguments)]
pub(crate) fn update(
    opt: &AdamW,
    dev: &CudaDevice,
    param: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    decay: &DecayRanges,
    grad_coef: f64,
    lr: f64,
    t: u64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let n = param.elem_count();
    // At least one element: a zero-byte allocation is an error of the driver.
    // SAFETY: the launches below write every one of the n elements before any read.
    let mut p_out: CudaSlice<f32> = unsafe { dev.alloc::<f32>(n.max(1))? };
    let mut m_out: CudaSlice<f32> = unsafe { dev.alloc::<f32>(n.max(1))? };
    let mut v_out: CudaSlice<f32> = unsafe { dev.alloc::<f32>(n.max(1))? };
    if n > 0 {
        let f = dev.get_or_load_custom_func("adamw_f32", "zeropp_adamw", adamw_ptx()?)?;
        let stream = dev.cuda_stream();
        let (sp, sg, sm, sv) = (
            param.storage_and_layout().0,
            grad.storage_and_layout().0,
            exp_avg.storage_and_layout().0,
            exp_avg_sq.storage_and_layout().0,
        );
        let (vp, vg, vm, vv) = (
            view(&sp, param)?,
            view(&sg, grad)?,
            view(&sm, exp_avg)?,
            view(&sv, exp_avg_sq)?,
        );
        // As `update` computes them.
        let bc1 = 1.0 - opt.beta1.powi(t as i32);
        let bc2 = 1.0 - opt.beta2.powi(t as i32);
        let scalars = [
            opt.beta1,
            1.0 - opt.beta1,
            opt.beta2,
            1.0 - opt.beta2,
            opt.eps,
            opt.weight_decay,
            grad_coef,
            lr,
            bc1,
            bc2,
        ];
        for (start, end, ranges) in spans(n, decay) {
            if start >= end {
                continue;
            }
            let (s64, e64) = (start as i64, end as i64);
            let mut b = stream.launch_builder(&f);
            b.arg(&vp).arg(&vg).arg(&vm).arg(&vv);
            b.arg(&mut p_out).arg(&mut m_out).arg(&mut v_out);
            b.arg(&s64).arg(&e64).arg(&ranges);
            for x in &scalars {
                b.arg(x);
            }
            let cfg = LaunchConfig {
                grid_dim: ((end - start).div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: argument types and lengths match the kernel's signature; the span lies
            // inside all seven buffers.
            unsafe { b.launch(cfg) }.w()?;
        }
    }
    let wrap = |s: CudaSlice<f32>| {
        let st = CudaStorage {
            slice: CudaStorageSlice::F32(s),
            device: dev.clone(),
        };
        Tensor::from_storage(Storage::Cuda(st), n, BackpropOp::none(), false)
    };
    Ok((wrap(p_out), wrap(m_out), wrap(v_out)))
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    /// Needs only libnvrtc, no GPU.
    #[test]
    fn nvrtc_compiles_the_adamw_kernel() {
        let ptx = adamw_ptx().unwrap();
        assert!(ptx.contains(".entry adamw_f32("));
        assert!(
            !ptx.contains("fma.rn.f64"),
            "FMA contraction would change the bits"
        );
    }

    #[test]
    fn spans_cover_the_shard_with_few_ranges_each() {
        let d = DecayRanges((0..150).map(|i| 10 * i + 2..10 * i + 7).collect());
        let s = spans(2000, &d);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].0, s[0].1), (0, 642));
        assert_eq!((s[1].0, s[1].1), (642, 1282));
        assert_eq!((s[2].0, s[2].1), (1282, 2000));
        assert_eq!(s[2].2.count, 22);
        assert_eq!(spans(5, &DecayRanges::default()).len(), 1);
        assert_eq!(spans(5, &DecayRanges(vec![2..2])).len(), 1);
    }
}
