//! GELU, tanh approximation.

use candle_core::Tensor;

use crate::error::Result;

pub(crate) const GELU_A: f64 = 0.044715;
/// sqrt(2 / pi)
pub(crate) const GELU_S: f64 = 0.797_884_560_802_865_4;

/// `gelu(h) = 0.5 h (1 + tanh(s (h + a h^3)))`, `s = sqrt(2/pi)`, `a = 0.044715`; any shape.
/// Backward needs `h`.
pub fn gelu_forward(h: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(h) {
        let _span = kernels::profile::scope(h.device(), kernels::profile::Family::Elementwise);
        if let Some(r) = cuda::gelu_forward(h)? {
            return Ok(r);
        }
        super::declined("gelu::gelu_forward", h)?;
    }
    // candle's `gelu` is exactly this formula (one fused pass); `gelu_erf` would be the erf form.
    Ok(h.gelu()?)
}

/// Gradient of [`gelu_forward`]: `dh = dout * (0.5 (1 + t) + 0.5 h (1 - t^2) s (1 + 3 a h^2))`
/// with `t = tanh(s (h + a h^3))`.
pub fn gelu_backward(dout: &Tensor, h: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(h) {
        let _span = kernels::profile::scope(h.device(), kernels::profile::Family::Elementwise);
        if let Some(r) = cuda::gelu_backward(dout, h)? {
            return Ok(r);
        }
        super::declined("gelu::gelu_backward", dout)?;
    }
    let h2 = h.sqr()?;
    let t = (h * h2.affine(GELU_A, 1.0)?)?.affine(GELU_S, 0.0)?.tanh()?;
    let left = t.affine(0.5, 0.5)?;
    let sech2 = t.sqr()?.affine(-1.0, 1.0)?;
    let dinner = h2.affine(0.5 * 3.0 * GELU_A * GELU_S, 0.5 * GELU_S)?;
    let local = (left + ((h * sech2)? * dinner)?)?;
    Ok((dout * local)?)
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launchers of the GELU kernels in `kernels/cuda/elementwise.cu`: bf16 tensors of any
    //! shape (taken contiguous), 16-byte vectors where every pointer is aligned, element by
    //! element otherwise. Other dtypes return `None` (the reference runs).
    use super::{GELU_A, GELU_S};
    use crate::error::Result;
    use crate::gpu;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{DType, Tensor};
    use kernels::Precision;

    /// Threads a CTA.
    const THREADS: usize = 256;
    /// At most this many CTAs (a grid-stride loop covers the rest): ~8 an SM on the H200.
    const MAX_CTAS: usize = 1056;

    /// Grid for `n` elements of which `nvec` 16-byte vectors: one vector (or tail element) a
    /// thread, capped at [`MAX_CTAS`].
    fn config(n: usize, nvec: usize) -> LaunchConfig {
        let work = if nvec > 0 { nvec + (n - 8 * nvec) } else { n };
        LaunchConfig {
            grid_dim: (work.div_ceil(THREADS).clamp(1, MAX_CTAS) as u32, 1, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// `gelu(h)`, or `None` unless `h` is bf16.
    ///
    /// Shapes: `h` any -> `out` like `h`.
    pub(super) fn gelu_forward(h: &Tensor) -> Result<Option<Tensor>> {
        if h.dtype() != DType::BF16 {
            return Ok(None);
        }
        let h = h.contiguous()?;
        let dev = gpu::device(&h)?;
        let out = gpu::uninit(h.shape(), DType::BF16, &dev)?;
        let n = h.elem_count();
        if n == 0 {
            return Ok(Some(out));
        }
        let (po, ph) = (gpu::ptr(&out)?, gpu::ptr(&h)?);
        let nvec = if (po | ph) % 16 == 0 { n / 8 } else { 0 };
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::ELEMENTWISE,
            &[],
            "gelu_forward",
        )?;
        // SAFETY: out and h hold n bf16 each (contiguous); the vectorised part only where both
        // are 16-byte aligned. Arguments in kernel order.
        unsafe {
            func.launch(
                config(n, nvec),
                &[
                    &po,
                    &ph,
                    &(n as i64),
                    &(nvec as i64),
                    &(GELU_A as f32),
                    &(GELU_S as f32),
                ],
            )?;
        }
        Ok(Some(out))
    }

    /// `dout * gelu'(h)`, or `None` unless both are bf16 of one shape.
    ///
    /// Shapes: `dout`, `h` any (the same) -> `dh` like `h`.
    pub(super) fn gelu_backward(dout: &Tensor, h: &Tensor) -> Result<Option<Tensor>> {
        if h.dtype() != DType::BF16 || dout.dtype() != DType::BF16 || dout.dims() != h.dims() {
            return Ok(None);
        }
        let (dout, h) = (dout.contiguous()?, h.contiguous()?);
        let dev = gpu::device(&h)?;
        let dh = gpu::uninit(h.shape(), DType::BF16, &dev)?;
        let n = h.elem_count();
        if n == 0 {
            return Ok(Some(dh));
        }
        let (pdh, pd, ph) = (gpu::ptr(&dh)?, gpu::ptr(&dout)?, gpu::ptr(&h)?);
        let nvec = if (pdh | pd | ph) % 16 == 0 { n / 8 } else { 0 };
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::ELEMENTWISE,
            &[],
            "gelu_backward",
        )?;
        // SAFETY: dh, dout and h hold n bf16 each (contiguous); the vectorised part only where
        // all three are 16-byte aligned. Arguments in kernel order.
        unsafe {
            func.launch(
                config(n, nvec),
                &[
                    &pdh,
                    &pd,
                    &ph,
                    &(n as i64),
                    &(nvec as i64),
                    &(GELU_A as f32),
                    &(GELU_S as f32),
                ],
            )?;
        }
        Ok(Some(dh))
    }
}
