//! Linear layers (HF Conv1D: weight stored `(in, out)`): `x @ w + b`, with the residual add of
//! the projections that write into the residual stream fused in.

use candle_core::Tensor;

use crate::error::Result;

/// `out = x @ w + b`.
///
/// Shapes: `x (N, IN)`, `w (IN, OUT)`, `b (OUT)` -> `out (N, OUT)`. Backward needs `x` and `w`.
pub fn matmul_forward(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(r) = cuda::matmul_forward(None, x, w, b)? {
            return Ok(r);
        }
        super::declined("linear::matmul_forward", x)?;
    }
    Ok(x.matmul(w)?.broadcast_add(b)?)
}

/// `out = residual + x @ w + b`: a projection into the residual stream. Its backward is
/// [`matmul_backward`] of `dout` (the residual's gradient passes through unchanged).
///
/// Shapes: `residual (N, OUT)`, `x (N, IN)`, `w (IN, OUT)`, `b (OUT)` -> `out (N, OUT)`.
pub fn residual_matmul_forward(
    residual: &Tensor,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(r) = cuda::matmul_forward(Some(residual), x, w, b)? {
            return Ok(r);
        }
        super::declined("linear::residual_matmul_forward", x)?;
    }
    Ok((residual + x.matmul(w)?.broadcast_add(b)?)?)
}

/// Gradients of [`matmul_forward`]: returns `(dx (N, IN), dw (IN, OUT), db (OUT))`.
pub fn matmul_backward(dout: &Tensor, x: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let (dx, dw, db) = matmul_backward_into(dout, x, w, None, true)?;
    Ok((dx, dw, db.expect("asked for db")))
}

/// [`matmul_backward`] with `dw` written into `dw_into` when given and the GPU GEMM takes it
/// (a slot of the unit's flat gradient: the returned `dw` is then that view; elsewhere a fresh
/// tensor), and `db` only when `want_db`.
pub fn matmul_backward_into(
    dout: &Tensor,
    x: &Tensor,
    w: &Tensor,
    dw_into: Option<&Tensor>,
    want_db: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(r) = cuda::backward(dout, x, w, dw_into, want_db)? {
            return Ok(r);
        }
        super::declined("linear::backward", dout)?;
    }
    let _ = dw_into;
    let dx = dout.matmul(&w.t()?)?;
    let dw = x.t()?.matmul(dout)?;
    let db = want_db.then(|| dout.sum(0)).transpose()?;
    Ok((dx, dw, db))
}

/// The MLP's first layer with its GELU: `h = x @ w + b` and `g = gelu(h)`, both returned
/// (backward reads `g` for the next layer's weight gradient and `h` for GELU's derivative).
///
/// Shapes: `x (N, IN)`, `w (IN, OUT)`, `b (OUT)` -> `h, g (N, OUT)`. On the GPU one GEMM whose
/// epilogue adds the bias, applies GELU and keeps its input.
pub fn matmul_gelu_forward(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(r) = cuda::matmul_gelu_forward(x, w, b)? {
            return Ok(r);
        }
        super::declined("linear::matmul_gelu_forward", x)?;
    }
    let h = matmul_forward(x, w, b)?;
    let g = super::gelu_forward(&h)?;
    Ok((h, g))
}

/// Gradients of `out = gelu(h) @ w + b` (the MLP's second layer and the GELU before it):
/// returns `(dh (N, IN), dw (IN, OUT), db (OUT), dbias_h (IN))`, where `dbias_h` is the sum of
/// `dh` over rows: the bias gradient of the layer that produced `h`.
///
/// Shapes: `dout (N, OUT)`, `g = gelu(h)` and `h (N, IN)`, `w (IN, OUT)`. On the GPU: the
/// GEMMs, then our GELU backward with the bias gradient in one pass. (cuBLASLt's DGELU_BGRAD epilogue
/// does it in the GEMM, [`matmul_gelu_backward_epilogue`], but measured 0.3 ms slower a layer at
/// gpt350m's shape on the H200 than the GEMM plus our two passes.)
pub fn matmul_gelu_backward(
    dout: &Tensor,
    g: &Tensor,
    w: &Tensor,
    h: &Tensor,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    matmul_gelu_backward_into(dout, g, w, h, None)
}

/// [`matmul_gelu_backward`] with `dw` written into `dw_into` as [`matmul_backward_into`] does.
pub fn matmul_gelu_backward_into(
    dout: &Tensor,
    g: &Tensor,
    w: &Tensor,
    h: &Tensor,
    dw_into: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let (dg, dw, db) = matmul_backward_into(dout, g, w, dw_into, true)?;
    let (dh, dbias_h) = super::gelu_backward_bias_grad(&dg, h)?;
    Ok((dh, dw, db.expect("asked for db"), dbias_h))
}

/// [`matmul_gelu_backward`] with the GELU derivative and `dbias_h` in the dh GEMM's epilogue
/// (cuBLASLt DGELU_BGRAD) on the GPU; the plain path elsewhere. For the timing comparison in
/// tests/gpu/linear.rs.
#[doc(hidden)]
pub fn matmul_gelu_backward_epilogue(
    dout: &Tensor,
    g: &Tensor,
    w: &Tensor,
    h: &Tensor,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(g) {
        if let Some(r) = cuda::matmul_gelu_backward(dout, g, w, h)? {
            return Ok(r);
        }
        super::declined("linear::matmul_gelu_backward", dout)?;
    }
    matmul_gelu_backward(dout, g, w, h)
}

/// [`matmul_gelu_forward`] as a GEMM with the bias epilogue, then our GELU kernel: the
/// comparison for the GELU_AUX_BIAS epilogue in tests/gpu/linear.rs.
#[doc(hidden)]
pub fn matmul_gelu_forward_unfused(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let h = matmul_forward(x, w, b)?;
    let g = super::gelu_forward(&h)?;
    Ok((h, g))
}

/// The bias gradient of a linear layer: `dout (N, OUT)` summed over rows, `(OUT)`. On the GPU
/// our deterministic column-sum kernel: candle's `sum(0)` on the GPU cost about 0.4 ms a layer
/// at gpt350m's MLP width on the H200 (9.6 ms a step).
pub fn bias_grad(dout: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(dout) {
        let _span = kernels::profile::scope(dout.device(), kernels::profile::Family::Elementwise);
        return bias_grad::bias_grad_gpu(dout);
    }
    Ok(dout.sum(0)?)
}

/// [`gelu_backward`](super::gelu_backward) and the bias gradient of the layer that produced `h`
/// (`dh` summed over rows): `(dh, dbias)`. On the GPU one pass over `dout` and `h`.
///
/// Shapes: `dout, h (N, OUT)` -> `dh (N, OUT)`, `dbias (OUT)`.
pub fn gelu_backward_bias_grad(dout: &Tensor, h: &Tensor) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(h) {
        let _span = kernels::profile::scope(h.device(), kernels::profile::Family::Elementwise);
        if let Some(r) = bias_grad::gelu_backward_bias_grad_gpu(dout, h)? {
            return Ok(r);
        }
    }
    let dh = super::gelu_backward(dout, h)?;
    let dbias = bias_grad(&dh)?;
    Ok((dh, dbias))
}

/// [`matmul_backward`] without the bias gradient: `(dx (N, IN), dw (IN, OUT))`, for a layer
/// whose bias gradient came from elsewhere ([`matmul_gelu_backward`]'s `dbias_h`).
pub fn matmul_backward_no_bias(dout: &Tensor, x: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
    let (dx, dw, _) = matmul_backward_into(dout, x, w, None, false)?;
    Ok((dx, dw))
}

#[cfg(feature = "cuda")]
pub(super) mod cuda {
    //! Launchers: cuBLASLt GEMMs with no transpose copied (`crate::gemm`), the bias (and the
    //! residual) added in the forward GEMM's epilogue, the bias gradient by our column-sum
    //! kernel. A row-major `(R, S)` matrix is column-major `(S, R)` with leading dimension `S`.
    use crate::error::Result;
    use crate::gemm::{self, Epilogue, Gemm};
    use crate::gpu;
    use candle_core::cuda_backend::CudaDevice;
    use candle_core::{DType, Tensor};

    /// bf16, contiguous: what the GEMM path takes.
    fn takes(ts: &[&Tensor]) -> bool {
        ts.iter()
            .all(|t| t.dtype() == DType::BF16 && t.is_contiguous())
    }

    /// `d (N, OUT) = x (N, IN) @ w (IN, OUT)` with `epilogue`, plus `c (N, OUT)` when given.
    /// Column-major: `d^T (OUT, N) = w^T (OUT, IN) x^T (IN, N)`, where `w`'s memory is `w^T`
    /// with leading dimension OUT and `x`'s is `x^T` with IN.
    pub(in crate::layers) fn forward_gemm(
        dev: &CudaDevice,
        x: &Tensor,
        w: &Tensor,
        d: &Tensor,
        epilogue: Epilogue,
        c: Option<u64>,
    ) -> Result<()> {
        let (n, inp) = x.dims2()?;
        let (_, out) = w.dims2()?;
        gemm::run(
            dev,
            &Gemm {
                m: out,
                n,
                k: inp,
                a: gpu::ptr(w)?,
                lda: out,
                trans_a: false,
                b: gpu::ptr(x)?,
                ldb: inp,
                trans_b: false,
                in_type: DType::BF16,
                d: gpu::ptr(d)?,
                ldd: out,
                d_type: DType::BF16,
                epilogue,
                c,
                scales: None,
            },
        )
    }

    /// `dx (N, IN) = dout (N, OUT) @ w^T` with `epilogue`. Column-major:
    /// `dx^T (IN, N) = w (IN, OUT) dout^T (OUT, N)`, w's memory transposed.
    pub(in crate::layers) fn dx_gemm(
        dev: &CudaDevice,
        dout: &Tensor,
        w: &Tensor,
        dx: &Tensor,
        epilogue: Epilogue,
    ) -> Result<()> {
        let (n, out) = dout.dims2()?;
        let (inp, _) = w.dims2()?;
        gemm::run(
            dev,
            &Gemm {
                m: inp,
                n,
                k: out,
                a: gpu::ptr(w)?,
                lda: out,
                trans_a: true,
                b: gpu::ptr(dout)?,
                ldb: out,
                trans_b: false,
                in_type: DType::BF16,
                d: gpu::ptr(dx)?,
                ldd: inp,
                d_type: DType::BF16,
                epilogue,
                c: None,
                scales: None,
            },
        )
    }

    /// `dw (IN, OUT) = x^T @ dout`, plus the `dw` already there when `accumulate` (in place:
    /// cuBLASLt's C = D). Column-major: `dw^T (OUT, IN) = dout^T (OUT, N) x (N, IN)`, x's
    /// memory transposed.
    pub(in crate::layers) fn dw_gemm(
        dev: &CudaDevice,
        dout: &Tensor,
        x: &Tensor,
        dw: &Tensor,
        accumulate: bool,
    ) -> Result<()> {
        let (n, out) = dout.dims2()?;
        let (_, inp) = x.dims2()?;
        gemm::run(
            dev,
            &Gemm {
                m: out,
                n: inp,
                k: n,
                a: gpu::ptr(dout)?,
                lda: out,
                trans_a: false,
                b: gpu::ptr(x)?,
                ldb: inp,
                trans_b: true,
                in_type: DType::BF16,
                d: gpu::ptr(dw)?,
                ldd: out,
                d_type: DType::BF16,
                epilogue: Epilogue::None,
                c: accumulate.then(|| gpu::ptr(dw)).transpose()?,
                scales: None,
            },
        )
    }

    /// `residual + x @ w + b` (`residual` optional), or `None` for inputs the kernels do not
    /// take: one GEMM with the bias in its epilogue and the residual as its C.
    pub(super) fn matmul_forward(
        residual: Option<&Tensor>,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
    ) -> Result<Option<Tensor>> {
        if !takes(&[x, w, b]) || residual.is_some_and(|r| !takes(&[r])) {
            return Ok(None);
        }
        let (n, out) = (x.dim(0)?, w.dim(1)?);
        let dev = gpu::device(x)?;
        let y = gpu::uninit((n, out), DType::BF16, &dev)?;
        let c = residual.map(gpu::ptr).transpose()?;
        forward_gemm(&dev, x, w, &y, Epilogue::Bias(gpu::ptr(b)?), c)?;
        Ok(Some(y))
    }

    /// `(dx, dw, db if want_db)`: two GEMMs and our column sum, `dw` into `dw_into` when it
    /// is a bf16 contiguous `(IN, OUT)`; or `None` for inputs the kernels do not take.
    pub(super) fn backward(
        dout: &Tensor,
        x: &Tensor,
        w: &Tensor,
        dw_into: Option<&Tensor>,
        want_db: bool,
    ) -> Result<Option<(Tensor, Tensor, Option<Tensor>)>> {
        if !takes(&[dout, x, w]) {
            return Ok(None);
        }
        let (n, inp) = x.dims2()?;
        let out = w.dim(1)?;
        let dev = gpu::device(x)?;
        let dx = gpu::uninit((n, inp), DType::BF16, &dev)?;
        let dw = match dw_into {
            Some(v) if takes(&[v]) && v.dims() == [inp, out] => v.clone(),
            _ => gpu::uninit((inp, out), DType::BF16, &dev)?,
        };
        dx_gemm(&dev, dout, w, &dx, Epilogue::None)?;
        dw_gemm(&dev, dout, x, &dw, false)?;
        let db = want_db.then(|| super::bias_grad(dout)).transpose()?;
        Ok(Some((dx, dw, db)))
    }

    /// `(h, gelu(h))` with `h = x @ w + b`: one GEMM with cuBLASLt's GELU_AUX_BIAS epilogue
    /// (`aux` = h, D = gelu(h)).
    pub(super) fn matmul_gelu_forward(
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let (n, out) = (x.dim(0)?, w.dim(1)?);
        if !takes(&[x, w, b]) || out % 8 != 0 {
            // cuBLASLt's aux leading dimension must be a multiple of 8.
            return Ok(None);
        }
        let dev = gpu::device(x)?;
        let h = gpu::uninit((n, out), DType::BF16, &dev)?;
        let g = gpu::uninit((n, out), DType::BF16, &dev)?;
        let epilogue = Epilogue::GeluAuxBias {
            bias: gpu::ptr(b)?,
            aux: gpu::ptr(&h)?,
        };
        forward_gemm(&dev, x, w, &g, epilogue, None)?;
        Ok(Some((h, g)))
    }

    /// `(dh, dw, db, dbias_h)` of `out = g @ w + b`, `g = gelu(h)`: the dh GEMM with cuBLASLt's
    /// DGELU_BGRAD epilogue (aux = h), the dw GEMM, and our column sum for db.
    pub(super) fn matmul_gelu_backward(
        dout: &Tensor,
        g: &Tensor,
        w: &Tensor,
        h: &Tensor,
    ) -> Result<Option<(Tensor, Tensor, Tensor, Tensor)>> {
        let (n, inp) = g.dims2()?;
        if !takes(&[dout, g, w, h]) || inp % 8 != 0 {
            return Ok(None);
        }
        let out = w.dim(1)?;
        let dev = gpu::device(g)?;
        let dh = gpu::uninit((n, inp), DType::BF16, &dev)?;
        let dbias_h = gpu::uninit(inp, DType::BF16, &dev)?;
        let dw = gpu::uninit((inp, out), DType::BF16, &dev)?;
        let epilogue = Epilogue::DGeluBGrad {
            aux: gpu::ptr(h)?,
            bias_grad: gpu::ptr(&dbias_h)?,
        };
        dx_gemm(&dev, dout, w, &dh, epilogue)?;
        dw_gemm(&dev, dout, g, &dw, false)?;
        let db = super::bias_grad(dout)?;
        Ok(Some((dh, dw, db, dbias_h)))
    }
}

#[cfg(feature = "cuda")]
pub(crate) mod bias_grad {
    //! The bias gradient `db = sum over rows of dout`, deterministic: `bias_grad_partial` and
    //! `bias_grad_final` of `kernels/cuda/elementwise.cu`.
    use crate::error::{ModelError, Result};
    use crate::gpu;
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::CudaDevice;
    use candle_core::{DType, Tensor};
    use kernels::Precision;

    /// Columns a CTA of `bias_grad_partial` covers (16 threads of 8 columns).
    const TILE: usize = 128;
    /// Rows a CTA's threads step by (its 16 row groups).
    const ROW_GROUPS: usize = 16;
    /// CTAs an SM the partial pass aims at (256 threads each: a full SM).
    const CTAS_PER_SM: usize = 8;

    /// `db (OUT) = sum_n dout[n, :]`, summed in f32 in a fixed order, in the dtype of `dout`.
    ///
    /// Shapes: `dout (N, OUT)` (any leading dimensions are rows) -> `db (OUT)`. bf16 `dout`
    /// with `OUT % 8 == 0` on a 16-byte aligned address takes the kernels (one read of `dout`);
    /// anything else takes candle's `sum` in f32.
    pub(crate) fn bias_grad_gpu(dout: &Tensor) -> Result<Tensor> {
        let dout = dout.contiguous()?;
        let Some((n, out_dim)) = kernel_shape(&[&dout])? else {
            let out_dim = dout.dims().last().copied().unwrap_or(0);
            let n = dout.elem_count().checked_div(out_dim).unwrap_or(0);
            let flat = dout.reshape((n, out_dim))?;
            return Ok(flat.to_dtype(DType::F32)?.sum(0)?.to_dtype(dout.dtype())?);
        };
        let dev = gpu::device(&dout)?;
        let grid = Grid::new(&dev, n, out_dim)?;
        let partials = gpu::uninit((grid.slices, out_dim), DType::F32, &dev)?;
        let (pd, ppart) = (gpu::ptr(&dout)?, gpu::ptr(&partials)?);
        let partial = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::ELEMENTWISE,
            &[],
            "bias_grad_partial",
        )?;
        // SAFETY: dout (N, OUT) bf16 contiguous and 16-byte aligned, OUT % 8 == 0; partials
        // (slices, OUT) f32 fresh, slices * rows >= N. Arguments in kernel order.
        unsafe {
            partial.launch(
                grid.config(),
                &[
                    &ppart,
                    &pd,
                    &(n as i32),
                    &(out_dim as i32),
                    &(grid.rows as i32),
                ],
            )?;
        }
        column_partials_sum(&dev, &partials, grid.slices, out_dim)
    }

    /// `(dh, db)`: `dh = dout * gelu'(h)` and its column sums, in one pass over the inputs
    /// (`gelu_backward_bias_grad_partial`), or `None` where the kernels do not take the inputs
    /// (then [`super::super::gelu_backward`] and [`bias_grad_gpu`] run apart).
    pub(crate) fn gelu_backward_bias_grad_gpu(
        dout: &Tensor,
        h: &Tensor,
    ) -> Result<Option<(Tensor, Tensor)>> {
        if dout.dims() != h.dims() || !dout.is_contiguous() || !h.is_contiguous() {
            return Ok(None);
        }
        let Some((n, out_dim)) = kernel_shape(&[dout, h])? else {
            return Ok(None);
        };
        let dev = gpu::device(h)?;
        let grid = Grid::new(&dev, n, out_dim)?;
        let dh = gpu::uninit(dout.shape().clone(), DType::BF16, &dev)?;
        let partials = gpu::uninit((grid.slices, out_dim), DType::F32, &dev)?;
        let f = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::ELEMENTWISE,
            &[],
            "gelu_backward_bias_grad_partial",
        )?;
        let (pdh, ppart, pd, ph) = (
            gpu::ptr(&dh)?,
            gpu::ptr(&partials)?,
            gpu::ptr(dout)?,
            gpu::ptr(h)?,
        );
        let (a, s) = (
            super::super::gelu::GELU_A as f32,
            super::super::gelu::GELU_S as f32,
        );
        // SAFETY: dout, h (N, OUT) bf16 contiguous and 16-byte aligned, OUT % 8 == 0; dh the
        // same shape and partials (slices, OUT) f32, both fresh; slices * rows >= N. Arguments
        // in kernel order.
        unsafe {
            f.launch(
                grid.config(),
                &[
                    &pdh,
                    &ppart,
                    &pd,
                    &ph,
                    &(n as i32),
                    &(out_dim as i32),
                    &(grid.rows as i32),
                    &a,
                    &s,
                ],
            )?;
        }
        let db = column_partials_sum(&dev, &partials, grid.slices, out_dim)?;
        Ok(Some((dh, db)))
    }

    /// `(N, OUT)` of `ts[0]` (leading dimensions are rows) when the partial kernels take every
    /// tensor of `ts`: bf16, `OUT % 8 == 0`, sizes within i32, 16-byte aligned.
    fn kernel_shape(ts: &[&Tensor]) -> Result<Option<(usize, usize)>> {
        let dims = ts[0].dims();
        let out_dim = dims.last().copied().unwrap_or(0);
        let n = ts[0].elem_count().checked_div(out_dim).unwrap_or(0);
        let mut fits = dims.len() >= 2
            && out_dim % 8 == 0
            && n > 0
            && out_dim > 0
            && n <= i32::MAX as usize
            && out_dim <= i32::MAX as usize;
        for t in ts {
            fits = fits && t.dtype() == DType::BF16 && gpu::ptr(t)? % 16 == 0;
        }
        Ok(fits.then_some((n, out_dim)))
    }

    /// The partial pass's grid: `tiles` column tiles by `slices` row slices of `rows` rows.
    struct Grid {
        tiles: usize,
        slices: usize,
        rows: usize,
    }

    impl Grid {
        /// Enough row slices to fill the GPU, at least ROW_GROUPS rows a slice.
        fn new(dev: &CudaDevice, n: usize, out_dim: usize) -> Result<Grid> {
            let sms = dev
                .cuda_stream()
                .context()
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| ModelError::Candle(candle_core::Error::wrap(e)))?
                .max(1) as usize;
            let tiles = out_dim.div_ceil(TILE);
            let max_slices = n.div_ceil(ROW_GROUPS);
            let slices = (sms * CTAS_PER_SM).div_ceil(tiles).clamp(1, max_slices);
            let rows = n.div_ceil(slices);
            Ok(Grid {
                tiles,
                slices: n.div_ceil(rows),
                rows,
            })
        }

        fn config(&self) -> LaunchConfig {
            LaunchConfig {
                grid_dim: (self.tiles as u32, self.slices as u32, 1),
                block_dim: (16, ROW_GROUPS as u32, 1),
                shared_mem_bytes: 0,
            }
        }
    }

    /// `db (OUT)` bf16 from column sums `partials (slices, OUT)` f32 (the partial pass's, or a
    /// fused FP8 quantiser's, one slice a tile of rows), slices added in order.
    pub(crate) fn column_partials_sum(
        dev: &CudaDevice,
        partials: &Tensor,
        slices: usize,
        out_dim: usize,
    ) -> Result<Tensor> {
        let db = gpu::uninit(out_dim, DType::BF16, dev)?;
        let (pdb, ppart) = (gpu::ptr(&db)?, gpu::ptr(partials)?);
        let fin = gpu::function(
            dev,
            Precision::Bf16,
            &kernels::ELEMENTWISE,
            &[],
            "bias_grad_final",
        )?;
        let cfg = LaunchConfig {
            grid_dim: (out_dim.div_ceil(32) as u32, 1, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: db (OUT) bf16 fresh; partials (slices, OUT) f32 written before on this stream.
        unsafe {
            fin.launch(cfg, &[&pdb, &ppart, &(slices as i32), &(out_dim as i32)])?;
        }
        Ok(db)
    }
}
