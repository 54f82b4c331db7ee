//! SwiGLU, the gate of Llama's MLP: `silu(gate) * up` (HF `act_fn(gate_proj(x)) * up_proj(x)`).
//!
//! Size letters: `N` rows, `F` the MLP's hidden width.
//!
//! For half-precision inputs `silu` runs in f32 and is rounded once, as PyTorch's is (candle's
//! bf16 `silu` rounds every intermediate), then the product is taken in the input dtype. The
//! backward runs in f32 for half-precision inputs and in the input dtype otherwise.

use candle_core::{DType, Tensor};

use crate::error::Result;

/// The dtype the element-wise math runs in: f32 for half precision, else the input's.
fn math_dtype(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        d => d,
    }
}

/// `sigmoid(g) = 1 / (1 + exp(-g))` (0 where `exp(-g)` overflows).
fn sigmoid(g: &Tensor) -> Result<Tensor> {
    Ok(g.neg()?.exp()?.affine(1.0, 1.0)?.recip()?)
}

/// `out = silu(gate) * up`, `silu(g) = g * sigmoid(g)`.
///
/// Shapes: `gate (N, F)`, `up (N, F)` -> `out (N, F)`. Backward needs `gate` and `up`.
pub fn swiglu_forward(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let md = math_dtype(gate.dtype());
    let act = gate.to_dtype(md)?.silu()?.to_dtype(gate.dtype())?;
    Ok((act * up)?)
}

/// Gradients of [`swiglu_forward`]: returns `(dgate (N, F), dup (N, F))` in the inputs' dtype.
/// Returned, not accumulated.
///
/// Shapes: `dy (N, F)`, `gate (N, F)`, `up (N, F)` (the forward's inputs).
pub fn swiglu_backward(dy: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
    let md = math_dtype(gate.dtype());
    let (dy, g, u) = (dy.to_dtype(md)?, gate.to_dtype(md)?, up.to_dtype(md)?);
    let s = sigmoid(&g)?;
    // out = silu(gate) * up
    let dup = (&dy * g.silu()?)?;
    // silu'(g) = s * (1 + g * (1 - s))
    let dsilu = (&s * (&g * s.affine(-1.0, 1.0)?)?.affine(1.0, 1.0)?)?;
    let dgate = ((dy * u)? * dsilu)?;
    Ok((dgate.to_dtype(gate.dtype())?, dup.to_dtype(up.dtype())?))
}

/// [`swiglu_forward`] on the packed projection `gu (N, 2F)` = `[gate | up]` (what one
/// `matmul_cols_forward` of gate_proj and up_proj writes): `act (N, F)`. On the GPU one pass.
pub fn swiglu_packed_forward(gu: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(gu) {
        let _span = kernels::profile::scope(gu.device(), kernels::profile::Family::Elementwise);
        if let Some(r) = cuda::forward(gu)? {
            return Ok(r);
        }
        super::declined("swiglu::forward", gu)?;
    }
    let f = gu.dim(1)? / 2;
    swiglu_forward(&gu.narrow(1, 0, f)?, &gu.narrow(1, f, f)?)
}

/// [`swiglu_backward`] on the packed layout: `dact (N, F)`, `gu (N, 2F)` -> `dgu (N, 2F)` =
/// `[dgate | dup]`, the layout `matmul_cols_backward` reads. On the GPU one pass.
pub fn swiglu_packed_backward(dact: &Tensor, gu: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(gu) {
        let _span = kernels::profile::scope(gu.device(), kernels::profile::Family::Elementwise);
        if let Some(r) = cuda::backward(dact, gu)? {
            return Ok(r);
        }
        super::declined("swiglu::backward", dact)?;
    }
    let f = gu.dim(1)? / 2;
    let (dg, du) = swiglu_backward(dact, &gu.narrow(1, 0, f)?, &gu.narrow(1, f, f)?)?;
    Ok(Tensor::cat(&[dg, du], 1)?)
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launchers of `kernels/cuda/swiglu.cu`: 8 channels a thread; they take bf16, contiguous,
    //! 16-byte aligned buffers with `F % 8 == 0`, else `None` (the reference runs).
    use crate::error::Result;
    use crate::gpu;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{DType, Tensor};
    use kernels::Precision;

    const THREADS: u32 = 256;

    /// `(N, F)` of a packed `gu (N, 2F)` the kernels take.
    fn packed(gu: &Tensor) -> Result<Option<(usize, usize)>> {
        let &[n, f2] = gu.dims() else {
            return Ok(None);
        };
        let f = f2 / 2;
        let fits = gu.dtype() == DType::BF16
            && gu.is_contiguous()
            && f2 % 16 == 0
            && n > 0
            && (n * f / 8) < i32::MAX as usize
            && gpu::ptr(gu)? % 16 == 0;
        Ok(fits.then_some((n, f)))
    }

    fn grid(n: usize, f: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((n * f / 8).div_ceil(THREADS as usize) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    pub(super) fn forward(gu: &Tensor) -> Result<Option<Tensor>> {
        let Some((n, f)) = packed(gu)? else {
            return Ok(None);
        };
        let dev = gpu::device(gu)?;
        let act = gpu::uninit((n, f), DType::BF16, &dev)?;
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::SWIGLU,
            &[],
            "swiglu_forward",
        )?;
        let (pa, pg) = (gpu::ptr(&act)?, gpu::ptr(gu)?);
        // SAFETY: act (N, F) bf16 fresh, gu (N, 2F) bf16 contiguous and aligned; arguments in
        // kernel order.
        unsafe { func.launch(grid(n, f), &[&pa, &pg, &(n as i32), &(f as i32)])? };
        Ok(Some(act))
    }

    pub(super) fn backward(dact: &Tensor, gu: &Tensor) -> Result<Option<Tensor>> {
        let Some((n, f)) = packed(gu)? else {
            return Ok(None);
        };
        if dact.dims() != [n, f]
            || dact.dtype() != DType::BF16
            || !dact.is_contiguous()
            || gpu::ptr(dact)? % 16 != 0
        {
            return Ok(None);
        }
        let dev = gpu::device(gu)?;
        let dgu = gpu::uninit((n, 2 * f), DType::BF16, &dev)?;
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::SWIGLU,
            &[],
            "swiglu_backward",
        )?;
        let (pd, pa, pg) = (gpu::ptr(&dgu)?, gpu::ptr(dact)?, gpu::ptr(gu)?);
        // SAFETY: dgu (N, 2F) bf16 fresh; dact (N, F), gu (N, 2F) bf16 contiguous and
        // aligned; arguments in kernel order.
        unsafe { func.launch(grid(n, f), &[&pd, &pa, &pg, &(n as i32), &(f as i32)])? };
        Ok(Some(dgu))
    }
}
