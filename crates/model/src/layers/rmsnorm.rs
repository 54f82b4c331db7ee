//! RMSNorm over the last dimension (Llama's `LlamaRMSNorm`), with the residual add before it
//! fused into the forward ([`add_rmsnorm_forward`]) and the residual gradient added in backward.
//!
//! Size letters: `N` rows, `C` channels.
//!
//! The statistics are computed in f32 for half-precision inputs, as Hugging Face does
//! (`hidden_states.to(torch.float32)`), and in f64 for f64 inputs (so that the gradient checks
//! keep their precision); the normalised rows are cast back to the input dtype *before* the
//! weight multiplies them: `weight * hidden_states.to(input_dtype)`.

use candle_core::{DType, Tensor, D};

use crate::error::Result;

/// What [`rmsnorm_forward`] saves for [`rmsnorm_backward`] (besides the input itself).
#[derive(Clone, Debug)]
pub struct RmsSaved {
    /// Per-row `1 / sqrt(mean(x^2) + eps)`, `(N)`: f32, or f64 for f64 inputs.
    pub rstd: Tensor,
}

/// The dtype the statistics are computed in: f64 for f64, f32 otherwise.
pub(crate) fn stat_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// `y = w * (x * rsqrt(mean(x^2) + eps))` over the last dimension.
///
/// Shapes: `x (N, C)`, `w (C)` -> `y (N, C)` in the dtype of `x`; saves `rstd (N)`.
pub fn rmsnorm_forward(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, RmsSaved)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        let _span = kernels::profile::scope(x.device(), kernels::profile::Family::Norm);
        if let Some(cuda::Forward {
            y: Some(y), saved, ..
        }) = cuda::forward(x, None, w, eps, true)?
        {
            return Ok((y, saved));
        }
        super::declined("rmsnorm::forward", x)?;
    }
    reference_forward(x, w, eps)
}

/// The residual add and the norm after it: `h = x + delta`, `y = rmsnorm(h)`. Returns
/// `(h, y, saved)`; the backward is [`rmsnorm_backward`] on `h` (whose `dresidual` carries
/// the residual stream's gradient on to `x` and `delta` alike).
///
/// Shapes: `x, delta (N, C)`, `w (C)` -> `h, y (N, C)`. On the GPU one pass (h is rounded to
/// the input dtype once, as the separate add would).
pub fn add_rmsnorm_forward(
    x: &Tensor,
    delta: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, RmsSaved)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        let _span = kernels::profile::scope(x.device(), kernels::profile::Family::Norm);
        if let Some(cuda::Forward {
            h: Some(h),
            y: Some(y),
            saved,
        }) = cuda::forward(x, Some(delta), w, eps, true)?
        {
            return Ok((h, y, saved));
        }
        super::declined("rmsnorm::residual_forward", x)?;
    }
    let h = (x + delta)?;
    let (y, saved) = reference_forward(&h, w, eps)?;
    Ok((h, y, saved))
}

/// What [`add_rmsnorm_forward`] (where `delta` is given) or [`rmsnorm_forward`] computes
/// besides the normalised rows: `(h, saved)`, `h = x + delta` (or `x` itself), for a consumer
/// that makes the rows itself from `h` and the statistics (the FP8 projections after a norm,
/// `fp8_quantize_rmsnorm`). One pass of the norm's kernel that does not write its output;
/// `None` where the kernel does not take the inputs.
#[cfg(feature = "cuda")]
pub(crate) fn rmsnorm_statistics(
    x: &Tensor,
    delta: Option<&Tensor>,
    w: &Tensor,
    eps: f64,
) -> Result<Option<(Tensor, RmsSaved)>> {
    if !super::on_gpu(x) {
        return Ok(None);
    }
    let _span = kernels::profile::scope(x.device(), kernels::profile::Family::Norm);
    Ok(match cuda::forward(x, delta, w, eps, false)? {
        Some(cuda::Forward {
            h: Some(h), saved, ..
        }) => Some((h, saved)),
        Some(cuda::Forward { h: None, saved, .. }) if delta.is_none() => Some((x.clone(), saved)),
        _ => None,
    })
}

/// [`rmsnorm_forward`] with basic candle ops.
fn reference_forward(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, RmsSaved)> {
    let sd = stat_dtype(x.dtype());
    let xf = x.to_dtype(sd)?;
    // variance = hidden_states.pow(2).mean(-1, keepdim=True)
    let ms = xf.sqr()?.mean_keepdim(D::Minus1)?;
    // hidden_states * torch.rsqrt(variance + eps)
    let rstd = ms.affine(1.0, eps)?.sqrt()?.recip()?;
    let normed = xf.broadcast_mul(&rstd)?.to_dtype(x.dtype())?;
    // weight * hidden_states.to(input_dtype)
    let y = normed.broadcast_mul(w)?;
    Ok((
        y,
        RmsSaved {
            rstd: rstd.squeeze(D::Minus1)?,
        },
    ))
}

/// Gradients of [`rmsnorm_forward`]: returns `(dx (N, C), dw (C))` in the dtypes of `x` and
/// `w`, where `dx` also holds `dresidual` when given (the gradient reaching `x` along the
/// residual stream, added here before the one cast back). Computed in the statistics' dtype.
/// Returned, not accumulated: the caller adds them where they belong.
///
/// Shapes: `dy (N, C)`, `x (N, C)` (the forward input), `w (C)`, `dresidual (N, C)`.
pub fn rmsnorm_backward(
    dy: &Tensor,
    saved: &RmsSaved,
    x: &Tensor,
    w: &Tensor,
    dresidual: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    rmsnorm_backward_into(dy, saved, x, w, dresidual, None)
}

/// [`rmsnorm_backward`] with `dw` written into `dw_into` on the GPU (a slot of the unit's flat
/// gradient, `(C)` bf16 contiguous), which is then what it returns; elsewhere `dw_into` is not
/// used. `dw` is deterministic on the GPU (fixed-order partial sums).
pub fn rmsnorm_backward_into(
    dy: &Tensor,
    saved: &RmsSaved,
    x: &Tensor,
    w: &Tensor,
    dresidual: Option<&Tensor>,
    dw_into: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        let _span = kernels::profile::scope(x.device(), kernels::profile::Family::Norm);
        if let Some(r) = cuda::backward(dy, saved, x, w, dresidual, dw_into)? {
            return Ok(r);
        }
        super::declined("rmsnorm::backward", dy)?;
    }
    let _ = dw_into;
    let sd = saved.rstd.dtype();
    let rstd = saved.rstd.unsqueeze(D::Minus1)?;
    let (dy, xf, wf) = (dy.to_dtype(sd)?, x.to_dtype(sd)?, w.to_dtype(sd)?);
    // xhat = x * rstd
    let xhat = xf.broadcast_mul(&rstd)?;
    // y = w * xhat
    let dw = (&dy * &xhat)?.sum(0)?;
    let dnorm = dy.broadcast_mul(&wf)?;
    // xhat = x * rstd, rstd = (mean(x^2) + eps)^(-1/2):
    // dx = rstd * (dnorm - xhat * mean(dnorm * xhat))
    let m = (&dnorm * &xhat)?.mean_keepdim(D::Minus1)?;
    let mut dx = dnorm.sub(&xhat.broadcast_mul(&m)?)?.broadcast_mul(&rstd)?;
    if let Some(r) = dresidual {
        dx = (dx + r.to_dtype(sd)?)?;
    }
    Ok((dx.to_dtype(x.dtype())?, dw.to_dtype(w.dtype())?))
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launchers of `kernels/cuda/rmsnorm.cu`: one warp a row, bf16 in and out, f32 `rstd`.
    //! They take rows of `C % 8 == 0` channels with every buffer 16-byte aligned, all bf16;
    //! anything else returns `None` (the reference runs).
    use super::RmsSaved;
    use crate::error::{ModelError, Result};
    use crate::gpu;
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUdevice_attribute, CUfunction_attribute,
    };
    use candle_core::cuda_backend::cudarc::driver::{DriverError, LaunchConfig};
    use candle_core::{DType, Tensor};
    use kernels::Precision;

    /// Warps a CTA of the forward (one row each).
    const FWD_WARPS: usize = 4;
    /// At most this many CTAs an SM in the backward's persistent grid.
    const BWD_CTAS_PER_SM: u32 = 4;
    /// Shared memory the backward's per-warp dw slices may take in a CTA.
    const BWD_SMEM: usize = 64 * 1024;
    /// Dynamic shared memory a CTA may use without opting in.
    const SMEM_DEFAULT: usize = 48 * 1024;

    fn driver(e: DriverError) -> ModelError {
        ModelError::Candle(candle_core::Error::wrap(e))
    }

    /// `(N, C)` of a 2-D bf16 `x` the kernels take.
    fn rows(x: &Tensor) -> Option<(usize, usize)> {
        let &[n, c] = x.dims() else { return None };
        let fits = x.dtype() == DType::BF16
            && c > 0
            && c % 8 == 0
            && n > 0
            && n <= i32::MAX as usize
            && c * 4 <= BWD_SMEM;
        fits.then_some((n, c))
    }

    /// Warps a CTA of the backward: up to 8, as many as fit their `C * 4`-byte dw slices in
    /// [`BWD_SMEM`].
    fn bwd_warps(c: usize) -> usize {
        (BWD_SMEM / (c * 4)).clamp(1, 8)
    }

    fn defines(c: usize) -> [kernels::Define; 2] {
        [("C", c as i64), ("WARPS", bwd_warps(c) as i64)]
    }

    /// Device addresses of contiguous bf16 tensors, or `None` if one is not 16-byte aligned.
    fn aligned<const K: usize>(ts: [&Tensor; K]) -> Result<Option<[u64; K]>> {
        let mut out = [0u64; K];
        for (o, t) in out.iter_mut().zip(ts) {
            if t.dtype() != DType::BF16 || !t.is_contiguous() {
                return Ok(None);
            }
            *o = gpu::ptr(t)?;
            if *o % 16 != 0 {
                return Ok(None);
            }
        }
        Ok(Some(out))
    }

    /// The address of an optional input (0, the kernels' null, where it is absent), or `None`
    /// where it is given but the kernels do not take it.
    fn optional(t: Option<&Tensor>) -> Result<Option<u64>> {
        match t {
            Some(t) => Ok(aligned([t])?.map(|[p]| p)),
            None => Ok(Some(0)),
        }
    }

    /// What [`forward`] writes.
    pub(super) struct Forward {
        /// `x + delta`, when delta is given.
        pub h: Option<Tensor>,
        /// The normalised rows, when asked for.
        pub y: Option<Tensor>,
        pub saved: RmsSaved,
    }

    /// The norm's outputs ([`Forward`]; `y` when `want_y`), or `None` for inputs the kernel
    /// does not take.
    pub(super) fn forward(
        x: &Tensor,
        delta: Option<&Tensor>,
        w: &Tensor,
        eps: f64,
        want_y: bool,
    ) -> Result<Option<Forward>> {
        let Some((n, c)) = rows(x) else {
            return Ok(None);
        };
        if w.dims() != [c] || delta.is_some_and(|d| d.dims() != x.dims()) {
            return Ok(None);
        }
        let Some([px, pw]) = aligned([x, w])? else {
            return Ok(None);
        };
        let Some(pdelta) = optional(delta)? else {
            return Ok(None);
        };
        let dev = gpu::device(x)?;
        let y = want_y
            .then(|| gpu::uninit((n, c), DType::BF16, &dev))
            .transpose()?;
        let h = delta
            .map(|_| gpu::uninit((n, c), DType::BF16, &dev))
            .transpose()?;
        let rstd = gpu::uninit(n, DType::F32, &dev)?;
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::RMSNORM,
            &defines(c),
            "rmsnorm_forward",
        )?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(FWD_WARPS) as u32, 1, 1),
            block_dim: ((FWD_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let pr = gpu::ptr(&rstd)?;
        let py = y.as_ref().map(gpu::ptr).transpose()?.unwrap_or(0);
        let ph = h.as_ref().map(gpu::ptr).transpose()?.unwrap_or(0);
        // SAFETY: y (when wanted; null otherwise, which the kernel does not write), h (when
        // delta is given) (N, C) bf16 and rstd (N) f32 fresh; x, delta (N, C) and w (C) bf16
        // contiguous and 16-byte aligned; arguments in kernel order.
        unsafe {
            func.launch(
                cfg,
                &[&py, &ph, &pr, &px, &pdelta, &pw, &(n as i32), &(eps as f32)],
            )?;
        }
        Ok(Some(Forward {
            h,
            y,
            saved: RmsSaved { rstd },
        }))
    }

    /// `(dx, dw)`, or `None` for inputs the kernels do not take. `dw` goes to `dw_into` when
    /// that is a bf16 contiguous `(C)` view (and is returned as that view).
    pub(super) fn backward(
        dy: &Tensor,
        saved: &RmsSaved,
        x: &Tensor,
        w: &Tensor,
        dresidual: Option<&Tensor>,
        dw_into: Option<&Tensor>,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let Some((n, c)) = rows(x) else {
            return Ok(None);
        };
        if dy.dims() != x.dims()
            || w.dims() != [c]
            || dresidual.is_some_and(|r| r.dims() != x.dims())
            || saved.rstd.dtype() != DType::F32
            || saved.rstd.elem_count() != n
            || !saved.rstd.is_contiguous()
        {
            return Ok(None);
        }
        let Some([pdy, px, pw]) = aligned([dy, x, w])? else {
            return Ok(None);
        };
        let Some(pres) = optional(dresidual)? else {
            return Ok(None);
        };
        let dev = gpu::device(x)?;
        let warps = bwd_warps(c);
        let smem = warps * c * 4;
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::RMSNORM,
            &defines(c),
            "rmsnorm_backward",
        )?;
        if smem > SMEM_DEFAULT {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(driver)?;
        }
        let threads = (warps * 32) as u32;
        let ctx = dev.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(driver)?;
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .map_err(driver)?
            .clamp(1, BWD_CTAS_PER_SM) as usize;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver)?
            .max(1) as usize;
        let grid = (sms * per_sm).min(n.div_ceil(warps));
        let partials = gpu::uninit((grid, c), DType::F32, &dev)?;
        let dx = gpu::uninit((n, c), DType::BF16, &dev)?;
        let dw = match dw_into {
            Some(v) if v.dims() == [c] && aligned([v])?.is_some() => v.clone(),
            _ => gpu::uninit(c, DType::BF16, &dev)?,
        };
        let (pdx, ppart, pdw, pr) = (
            gpu::ptr(&dx)?,
            gpu::ptr(&partials)?,
            gpu::ptr(&dw)?,
            gpu::ptr(&saved.rstd)?,
        );
        // SAFETY: dx (N, C) bf16 and partials (grid, C) f32 fresh; dy, x, dresidual (N, C),
        // w (C) bf16 contiguous and aligned, rstd (N) f32; arguments in kernel order.
        unsafe {
            func.launch(
                LaunchConfig {
                    grid_dim: (grid as u32, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: smem as u32,
                },
                &[&pdx, &ppart, &pdy, &px, &pr, &pw, &pres, &(n as i32)],
            )?;
        }
        let reduce = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::RMSNORM,
            &defines(c),
            "rmsnorm_backward_reduce",
        )?;
        // SAFETY: dw (C) bf16 (fresh or a slot of the caller's); partials written above on
        // this stream; arguments in kernel order.
        unsafe {
            reduce.launch(
                LaunchConfig {
                    grid_dim: (c.div_ceil(32) as u32, 1, 1),
                    block_dim: (32, 8, 1),
                    shared_mem_bytes: 0,
                },
                &[&pdw, &ppart, &(grid as i32)],
            )?;
        }
        Ok(Some((dx, dw)))
    }
}
