//! LayerNorm over the last dimension, with the residual gradient added in backward.

use candle_core::{Tensor, D};

use crate::error::Result;

/// LayerNorm epsilon (GPT-2's `layer_norm_epsilon`).
pub const LN_EPS: f64 = 1e-5;

/// What [`layernorm_forward`] saves for [`layernorm_backward`] (besides the input itself).
#[derive(Clone, Debug)]
pub struct LnSaved {
    /// Per-row mean, `(N, 1)`: f32 on the GPU path, the dtype of `x` in the reference.
    pub mean: Tensor,
    /// Per-row `1 / sqrt(var + eps)`, `(N, 1)`, same dtype as `mean`.
    pub rstd: Tensor,
}

/// `out = (x - mean) * rstd * w + b` over the last dimension.
///
/// Shapes: `x (N, C)`, `w (C)`, `b (C)` -> `out (N, C)`; saves `mean`, `rstd` `(N, 1)`.
pub fn layernorm_forward(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(Tensor, LnSaved)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        let _span = kernels::profile::scope(x.device(), kernels::profile::Family::Norm);
        if let Some((Some(out), saved)) = cuda::layernorm_forward(x, w, b, true)? {
            return Ok((out, saved));
        }
        super::declined("layernorm::layernorm_forward", x)?;
    }
    reference_forward(x, w, b)
}

/// The statistics of [`layernorm_forward`] without its output, for a consumer that makes the
/// normalised rows itself from `x` and them (GPT-2's FP8 projections after a norm,
/// `fp8_quantize_layernorm`): one pass of the norm's kernel that does not write its output;
/// `None` where the kernel does not take the inputs (or on the CPU).
#[cfg(feature = "cuda")]
pub(crate) fn layernorm_statistics(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Option<LnSaved>> {
    if !super::on_gpu(x) {
        return Ok(None);
    }
    let _span = kernels::profile::scope(x.device(), kernels::profile::Family::Norm);
    Ok(cuda::layernorm_forward(x, w, b, false)?.map(|(_, saved)| saved))
}

/// Gradients of [`layernorm_forward`]: returns `(dx (N, C), dw (C), db (C))`, where `dx` also
/// holds `dresidual` when given (the gradient reaching `x` along the residual stream, added here
/// so that no separate pass over `(N, C)` is spent on it).
///
/// Shapes: `dout (N, C)`, `x (N, C)` (the forward input), `w (C)`, `dresidual (N, C)`.
pub fn layernorm_backward(
    dout: &Tensor,
    saved: &LnSaved,
    x: &Tensor,
    w: &Tensor,
    dresidual: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        let _span = kernels::profile::scope(x.device(), kernels::profile::Family::Norm);
        if let Some(r) = cuda::layernorm_backward(dout, saved, x, w, dresidual)? {
            return Ok(r);
        }
        super::declined("layernorm::layernorm_backward", dout)?;
    }
    reference_backward(dout, saved, x, w, dresidual)
}

/// [`layernorm_forward`] with basic candle ops, in the dtype of `x`.
pub(crate) fn reference_forward(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(Tensor, LnSaved)> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    let rstd = var.affine(1.0, LN_EPS)?.sqrt()?.recip()?;
    let out = xc
        .broadcast_mul(&rstd)?
        .broadcast_mul(w)?
        .broadcast_add(b)?;
    Ok((out, LnSaved { mean, rstd }))
}

/// [`layernorm_backward`] with basic candle ops.
pub(crate) fn reference_backward(
    dout: &Tensor,
    saved: &LnSaved,
    x: &Tensor,
    w: &Tensor,
    dresidual: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (mean, rstd) = (
        saved.mean.to_dtype(x.dtype())?,
        saved.rstd.to_dtype(x.dtype())?,
    );
    // xhat = (x - mean) * rstd
    let xhat = x.broadcast_sub(&mean)?.broadcast_mul(&rstd)?;
    let db = dout.sum(0)?;
    let dw = (dout * &xhat)?.sum(0)?;
    // out = xhat * w + b
    let dnorm = dout.broadcast_mul(w)?;
    // dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    let m1 = dnorm.mean_keepdim(D::Minus1)?;
    let m2 = (&dnorm * &xhat)?.mean_keepdim(D::Minus1)?;
    let mut dx = dnorm
        .broadcast_sub(&m1)?
        .sub(&xhat.broadcast_mul(&m2)?)?
        .broadcast_mul(&rstd)?;
    if let Some(r) = dresidual {
        dx = (dx + r)?;
    }
    Ok((dx, dw, db))
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launchers of `kernels/cuda/layernorm.cu`: one warp a row, bf16 in and out, f32 `mean`,
    //! `rstd`. They take rows of `C % 8 == 0` channels (16-byte vectors) with every buffer
    //! 16-byte aligned, all in bf16; anything else returns `None` (the reference runs).
    use super::{LnSaved, LN_EPS};
    use crate::error::{ModelError, Result};
    use crate::gpu;
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUdevice_attribute, CUfunction_attribute,
    };
    use candle_core::cuda_backend::cudarc::driver::{DriverError, LaunchConfig};
    use candle_core::cuda_backend::CudaDevice;
    use candle_core::{DType, Tensor};
    use kernels::Precision;

    /// Warps a CTA of the forward (one row each).
    const FWD_WARPS: usize = 4;
    /// At most this many CTAs an SM in the backward's persistent grid.
    const BWD_CTAS_PER_SM: u32 = 4;
    /// Dynamic shared memory a CTA may use without opting in.
    const SMEM_DEFAULT: usize = 48 * 1024;

    fn driver(e: DriverError) -> ModelError {
        ModelError::Candle(candle_core::Error::wrap(e))
    }

    /// `(N, C)` of `x` (rows of the last dimension) when the kernels take it.
    fn rows(x: &Tensor) -> Option<(usize, usize)> {
        let c = *x.dims().last()?;
        if c == 0 || c % 8 != 0 || c > i32::MAX as usize / 2 {
            return None;
        }
        let n = x.elem_count() / c;
        (n > 0 && n <= i32::MAX as usize).then_some((n, c))
    }

    /// 16-byte vectors a lane holds for a row of `C` channels (VPL in layernorm.cu).
    fn vectors_per_lane(c: usize) -> usize {
        (c / 8).div_ceil(32)
    }

    /// Warps a CTA of the backward: up to 8, as many as fit 64 KiB of per-warp dw/db slices
    /// (`2048 * VPL` bytes each), at least one.
    fn bwd_warps(c: usize) -> usize {
        (65536 / (2048 * vectors_per_lane(c))).clamp(1, 8)
    }

    /// The defines of both kernels (one module a `C`).
    fn defines(c: usize) -> [kernels::Define; 2] {
        [("C", c as i64), ("WARPS", bwd_warps(c) as i64)]
    }

    fn all_bf16(ts: &[&Tensor]) -> bool {
        ts.iter().all(|t| t.dtype() == DType::BF16)
    }

    /// Device addresses of contiguous tensors, or `None` if one is not 16-byte aligned.
    fn aligned_ptrs<const K: usize>(ts: [&Tensor; K]) -> Result<Option<[u64; K]>> {
        let mut out = [0u64; K];
        for (o, t) in out.iter_mut().zip(ts) {
            *o = gpu::ptr(t)?;
            if *o % 16 != 0 {
                return Ok(None);
            }
        }
        Ok(Some(out))
    }

    fn sm_count(dev: &CudaDevice) -> Result<usize> {
        let ctx = dev.cuda_stream().context().clone();
        let n = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver)?;
        Ok(n.max(1) as usize)
    }

    /// The fused forward, or `None` for inputs the kernel does not take (the caller then runs
    /// the reference).
    ///
    /// Shapes: `x (N, C)` (any leading dimensions), `w (C)`, `b (C)` -> `out` like `x`,
    /// `mean`, `rstd` like `x` with a last dimension of 1, f32.
    pub(super) fn layernorm_forward(
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        want_out: bool,
    ) -> Result<Option<(Option<Tensor>, LnSaved)>> {
        if !all_bf16(&[x, w, b]) {
            return Ok(None);
        }
        let Some((n, c)) = rows(x) else {
            return Ok(None);
        };
        if w.dims() != [c] || b.dims() != [c] {
            return Ok(None);
        }
        let (x, w, b) = (x.contiguous()?, w.contiguous()?, b.contiguous()?);
        let Some([px, pw, pb]) = aligned_ptrs([&x, &w, &b])? else {
            return Ok(None);
        };
        let dev = gpu::device(&x)?;
        let out = want_out
            .then(|| gpu::uninit(x.shape(), DType::BF16, &dev))
            .transpose()?;
        let mut stat_dims = x.dims().to_vec();
        if let Some(last) = stat_dims.last_mut() {
            *last = 1;
        }
        let mean = gpu::uninit(stat_dims.as_slice(), DType::F32, &dev)?;
        let rstd = gpu::uninit(stat_dims.as_slice(), DType::F32, &dev)?;
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::LAYERNORM,
            &defines(c),
            "layernorm_forward",
        )?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(FWD_WARPS) as u32, 1, 1),
            block_dim: ((FWD_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (pm, pr) = (gpu::ptr(&mean)?, gpu::ptr(&rstd)?);
        let po = out.as_ref().map(gpu::ptr).transpose()?.unwrap_or(0);
        // SAFETY: out (N, C) bf16 (or null, which the kernel does not write), mean, rstd (N)
        // f32 fresh; x (N, C), w, b (C) bf16, all contiguous and 16-byte aligned; the
        // arguments match layernorm_forward's list.
        unsafe {
            func.launch(
                cfg,
                &[&po, &pm, &pr, &px, &pw, &pb, &(n as i32), &(LN_EPS as f32)],
            )?;
        }
        Ok(Some((out, LnSaved { mean, rstd })))
    }

    /// The fused backward, or `None` for inputs the kernel does not take.
    ///
    /// Shapes: `dout (N, C)`, `x (N, C)`, `saved` f32 `(N, 1)`, `w (C)`, `dresidual (N, C)`
    /// -> `dx (N, C)`, `dw (C)`, `db (C)`, all bf16. dw and db are deterministic: per-CTA
    /// partial sums in a fixed order, then a fixed-order sum over CTAs.
    pub(super) fn layernorm_backward(
        dout: &Tensor,
        saved: &LnSaved,
        x: &Tensor,
        w: &Tensor,
        dresidual: Option<&Tensor>,
    ) -> Result<Option<(Tensor, Tensor, Tensor)>> {
        if !all_bf16(&[dout, x, w]) || dresidual.is_some_and(|r| r.dtype() != DType::BF16) {
            return Ok(None);
        }
        if saved.mean.dtype() != DType::F32 || saved.rstd.dtype() != DType::F32 {
            return Ok(None);
        }
        let Some((n, c)) = rows(x) else {
            return Ok(None);
        };
        if x.rank() != 2
            || dout.dims() != x.dims()
            || dresidual.is_some_and(|r| r.dims() != x.dims())
            || w.dims() != [c]
            || saved.mean.elem_count() != n
            || saved.rstd.elem_count() != n
        {
            return Ok(None);
        }
        let warps = bwd_warps(c);
        let smem = warps * 2048 * vectors_per_lane(c);
        let dev = gpu::device(x)?;
        let ctx = dev.cuda_stream().context().clone();
        let smem_max = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(driver)?;
        if smem > smem_max.max(0) as usize {
            return Ok(None);
        }
        let (dout, x, w) = (dout.contiguous()?, x.contiguous()?, w.contiguous()?);
        let (mean, rstd) = (saved.mean.contiguous()?, saved.rstd.contiguous()?);
        let dres = dresidual.map(|r| r.contiguous()).transpose()?;
        let Some([pd, px, pw]) = aligned_ptrs([&dout, &x, &w])? else {
            return Ok(None);
        };
        let pres = match &dres {
            Some(r) => match aligned_ptrs([r])? {
                Some([p]) => p,
                None => return Ok(None),
            },
            None => 0u64,
        };
        let (pm, pr) = (gpu::ptr(&mean)?, gpu::ptr(&rstd)?);

        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::LAYERNORM,
            &defines(c),
            "layernorm_backward",
        )?;
        if smem > SMEM_DEFAULT {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(driver)?;
        }
        let threads = (warps * 32) as u32;
        ctx.bind_to_thread().map_err(driver)?;
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .map_err(driver)?
            .clamp(1, BWD_CTAS_PER_SM) as usize;
        let grid = (sm_count(&dev)? * per_sm).min(n.div_ceil(warps));
        let partials = gpu::uninit((grid, 2 * c), DType::F32, &dev)?;
        let dx = gpu::uninit(x.shape(), DType::BF16, &dev)?;
        let (pdx, ppart) = (gpu::ptr(&dx)?, gpu::ptr(&partials)?);
        let cfg = LaunchConfig {
            grid_dim: (grid as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: dx (N, C) bf16 and partials (grid, 2C) f32 fresh; dout, x, dres (or null)
        // (N, C) bf16, mean, rstd (N) f32, w (C) bf16, contiguous and (the bf16 ones) 16-byte
        // aligned; smem is what the kernel's WARPS slices take. Arguments in kernel order.
        unsafe {
            func.launch(
                cfg,
                &[&pdx, &ppart, &pd, &px, &pm, &pr, &pw, &pres, &(n as i32)],
            )?;
        }
        let dw = gpu::uninit(c, DType::BF16, &dev)?;
        let db = gpu::uninit(c, DType::BF16, &dev)?;
        let (pdw, pdb) = (gpu::ptr(&dw)?, gpu::ptr(&db)?);
        let reduce = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::LAYERNORM,
            &defines(c),
            "layernorm_backward_reduce",
        )?;
        let cfg = LaunchConfig {
            grid_dim: ((2 * c).div_ceil(32) as u32, 1, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: dw, db (C) bf16 fresh; partials (grid, 2C) f32 written above on this stream.
        unsafe {
            reduce.launch(cfg, &[&pdw, &pdb, &ppart, &(grid as i32)])?;
        }
        Ok(Some((dx, dw, db)))
    }
}
