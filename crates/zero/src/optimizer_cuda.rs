//! The AdamW update of `optimizer.rs` as one CUDA kernel (`crates/kernels/cuda/adamw.cu`,
//! [`kernels::ADAMW`], compiled with NVRTC by [`kernels::loader`]), bitwise equal to
//! `AdamW::update_scaled`: the same f32 operations in the same order, written with IEEE
//! intrinsics (`__fmul_rn`, `__fdiv_rn`, `__fsqrt_rn`, ...) and compiled without FMA
//! contraction, the scalars computed on the host by `AdamW::scalars`, and the weight decay taken
//! on the decay ranges only. The gradient is read as it is stored (f32, or the unit's bf16
//! gradient at W = 1) with its scale, zero past its length.
//!
//! Launch shape: `THREADS` (256) a CTA, each thread `ELEMS` elements `THREADS` apart. The decay
//! ranges (sorted, disjoint) travel by value in the kernel parameters, up to `MAX_RANGES` a
//! launch; a shard with more ranges is cut into element spans of at most that many ranges each,
//! one launch per span. Each element binary-searches its range. Bytes moved per element: 12 read
//! (param, m, v) and 12 written, plus the gradient's 4 or 2, plus 2 for the bf16 copy.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr};
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice};
use candle_core::{DType, Result, Storage, Tensor};
use kernels::launch::{self, Kernel, Module};

use std::ops::Range;

use crate::optimizer::Scalars;
use crate::GradShard;

/// Decay ranges a launch carries in its parameters (`MAX_RANGES` in the source).
pub(crate) const MAX_RANGES: usize = 64;
/// Threads a CTA (`THREADS` in the source).
const THREADS: usize = 256;
/// Elements a thread (`ELEMS` in the source).
const ELEMS: usize = 4;

/// The source's defines: the constants this file shares with it.
const DEFINES: [kernels::Define; 3] = [
    ("MAX_RANGES", MAX_RANGES as i64),
    ("THREADS", THREADS as i64),
    ("ELEMS", ELEMS as i64),
];

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
// SAFETY: nine f32 in a #[repr(C)] struct, the layout of the kernel's struct Scalars.
unsafe impl DeviceRepr for Scalars {}

/// Element spans, each with at most [`MAX_RANGES`] of the (non-empty, sorted) decay ranges,
/// covering 0..len.
fn spans(len: usize, decay: &[Range<usize>]) -> Vec<(usize, usize, Ranges)> {
    let rs: Vec<_> = decay.iter().filter(|r| r.start < r.end).collect();
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

fn view<'a, T: candle_core::cuda_backend::CudaDType>(
    st: &'a Storage,
    t: &Tensor,
) -> Result<CudaView<'a, T>> {
    let Storage::Cuda(cs) = st else {
        candle_core::bail!("AdamW: tensor not on the GPU")
    };
    let o = t.layout().start_offset();
    Ok(cs.as_cuda_slice::<T>()?.slice(o..o + t.elem_count()))
}

/// GPU `AdamW::update_tensors_with_copy` (shapes already checked: param and moments 1-D
/// contiguous F32 of one length, the gradient's values 1-D contiguous F32 or BF16, no longer),
/// weight decay on the sorted, disjoint `decay` ranges; with `bf16_copy`, also the new
/// parameters in bf16, written by the same kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn update(
    dev: &CudaDevice,
    param: &Tensor,
    grad: &GradShard,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    decay: &[Range<usize>],
    scalars: &Scalars,
    bf16_copy: bool,
) -> Result<(Tensor, Tensor, Tensor, Option<Tensor>)> {
    let n = param.elem_count();
    // At least one element: a zero-byte allocation is an error of the driver.
    // SAFETY: the launches below write every one of the n elements before any read.
    let p_out: CudaSlice<f32> = unsafe { dev.alloc::<f32>(n.max(1))? };
    let m_out: CudaSlice<f32> = unsafe { dev.alloc::<f32>(n.max(1))? };
    let v_out: CudaSlice<f32> = unsafe { dev.alloc::<f32>(n.max(1))? };
    // SAFETY: as above, when asked for.
    let copy: Option<CudaSlice<half::bf16>> = match bf16_copy {
        true => Some(unsafe { dev.alloc::<half::bf16>(n.max(1))? }),
        false => None,
    };
    if n > 0 {
        let values = grad.values();
        let name = match values.dtype() {
            DType::BF16 => "adamw_bf16",
            _ => "adamw_f32",
        };
        let module = Module::new(&kernels::ADAMW, &DEFINES, kernels::Flavour::Exact);
        let f = Kernel::load(dev, module, name).map_err(candle_core::Error::wrap)?;
        let stream = f.stream();
        let (sp, sg, sm, sv) = (
            param.storage_and_layout().0,
            values.storage_and_layout().0,
            exp_avg.storage_and_layout().0,
            exp_avg_sq.storage_and_layout().0,
        );
        let (vp, vm, vv) = (
            launch::addr(&view::<f32>(&sp, param)?, stream),
            launch::addr(&view::<f32>(&sm, exp_avg)?, stream),
            launch::addr(&view::<f32>(&sv, exp_avg_sq)?, stream),
        );
        // The gradient's address: f32 or bf16, the kernel chosen above reads it as such.
        let vg = match values.dtype() {
            DType::BF16 => launch::addr(&view::<half::bf16>(&sg, values)?, stream),
            _ => launch::addr(&view::<f32>(&sg, values)?, stream),
        };
        let (po, mo, vo) = (
            launch::addr(&p_out, stream),
            launch::addr(&m_out, stream),
            launch::addr(&v_out, stream),
        );
        // The bf16 copy's address, or a null one.
        let co = copy.as_ref().map_or(0u64, |c| launch::addr(c, stream));
        let (grad_len, scale) = (values.elem_count() as i64, grad.scale());
        for (start, end, ranges) in spans(n, decay) {
            if start >= end {
                continue;
            }
            let (s64, e64) = (start as i64, end as i64);
            let cfg = launch::grid((end - start).div_ceil(THREADS * ELEMS), THREADS);
            // SAFETY: argument types and lengths match the kernel's signature (the bf16 copy's
            // address, or a null one); the span lies inside every buffer.
            unsafe {
                f.launch(
                    cfg,
                    &[
                        &vp, &vg, &grad_len, &scale, &vm, &vv, &po, &mo, &vo, &co, &s64, &e64,
                        &ranges, scalars,
                    ],
                )
            }
            .map_err(candle_core::Error::wrap)?;
        }
    }
    let wrap = |s: CudaSlice<f32>| launch::from_slice(CudaStorageSlice::F32(s), dev, n);
    let copy = copy.map(|s| launch::from_slice(CudaStorageSlice::BF16(s), dev, n));
    Ok((wrap(p_out), wrap(m_out), wrap(v_out), copy))
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    /// Needs only libnvrtc, no GPU.
    #[test]
    fn nvrtc_compiles_the_adamw_kernel() {
        let ptx = kernels::loader::ptx(&kernels::ADAMW, &DEFINES, kernels::Flavour::Exact)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(ptx.contains(".entry adamw_f32("));
        assert!(ptx.contains(".entry adamw_bf16("));
        assert!(
            !ptx.contains("fma.rn.f32"),
            "FMA contraction would change the bits"
        );
    }

    #[test]
    fn spans_cover_the_shard_with_few_ranges_each() {
        let d: Vec<_> = (0..150).map(|i| 10 * i + 2..10 * i + 7).collect();
        let s = spans(2000, &d);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].0, s[0].1), (0, 642));
        assert_eq!((s[1].0, s[1].1), (642, 1282));
        assert_eq!((s[2].0, s[2].1), (1282, 2000));
        assert_eq!(s[2].2.count, 22);
        assert_eq!(spans(5, &[]).len(), 1);
        assert_eq!(spans(5, &[2..2]).len(), 1);
    }
}
