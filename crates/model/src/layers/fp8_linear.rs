//! FP8 linear layers (issue 40): `x @ w` with both operands in FP8 E4M3 and f32 scales a
//! block, the forward and the two backward GEMMs side by side. The functions here are the
//! reference of the recipe; the CPU runs it as an emulation (each operand quantised and
//! dequantised in f32, the product in f32), which is what an FP8 GEMM with f32 accumulation
//! computes up to the order of its sums. On the GPU (module `cuda`) the quantisers of
//! `kernels/cuda/fp8.cu` write each operand's codes and scales, bitwise the CPU's, and
//! cuBLASLt's block-scaled FP8 GEMMs multiply them (`crate::gemm`): the forward reads the
//! weight's transposed codes, the weight gradient both operands' transposed codes (Hopper's FP8
//! MMA reads both operands K-contiguous). There the output is bf16 and a bias is added after
//! the GEMM's rounding, so a GPU result differs from the reference by the order of the sums and
//! one bf16 rounding.
//!
//! The recipe is block scaling (DeepSeek-V3's, Transformer Engine's `Float8BlockScaling`),
//! chosen for ZeRO++ rather than torchao's row-wise scales: a weight `w (IN, OUT)` takes one
//! scale a `128 x 128` tile ([`WEIGHT_TILE`]), and that one set of codes and scales serves both
//! GEMMs that read it, the forward (contracting over IN, its rows) and the input gradient
//! (contracting over OUT, its columns). Row-wise scales hold only for one of the two, so a
//! row-wise weight is quantised twice a step from its 16-bit copy; with tiles, a weight can be
//! quantised once, when the optimizer writes it, and gathered as FP8 by qwZ straight into the
//! GEMMs (docs/kernels.md, "FP8"). Activations and gradients take one scale per 128 elements
//! along the dimension the GEMM contracts: `1 x 128` for the left operand of the forward and
//! of the input gradient ([`ROW_BLOCK`]), `128 x 1` (128 positions of a column) for both
//! operands of the weight gradient ([`COL_BLOCK`]); cuBLASLt takes these on Hopper as
//! `VEC128_32F` and `BLK128x128_32F` scales. Tiles at a matrix's edge are shorter.
//!
//! Each quantisation is [`quant::quantize_fp8_e4m3_tiles`] (torchao's dynamic scaling, amax of
//! the block, saturating round to nearest even): its error is within [`quant::fp8_e4m3_bound`]
//! of each element, about 1/16 relative. A bias and a residual are added in f32 after the
//! product, as a GEMM's epilogue would, and the result rounds once to the input's dtype.

use candle_core::{DType, Tensor};
use quant::Tile;

use crate::error::{ModelError, Result};
use crate::linears::LinearWeight;

/// The scale block of weights: `128 x 128`.
pub const WEIGHT_TILE: Tile = Tile {
    rows: 128,
    cols: 128,
};
/// The scale block of a GEMM's left operand contracted along its rows: `1 x 128`.
pub const ROW_BLOCK: Tile = Tile { rows: 1, cols: 128 };
/// The scale block of an operand contracted along its columns (the weight gradient's): `128 x 1`.
pub const COL_BLOCK: Tile = Tile { rows: 128, cols: 1 };

/// On the GPU every side of an FP8 GEMM's operands (tokens, IN, OUT) is a multiple of this:
/// cuBLASLt's FP8 GEMMs want 16-byte leading dimensions.
pub const GPU_MULTIPLE: usize = 16;

/// `m (R, S)` quantised to FP8 with one scale a `tile` and dequantised: the values the FP8 GEMM
/// multiplies, as f32.
pub fn fp8_round(m: &Tensor, tile: Tile) -> Result<Tensor> {
    if m.device().is_cuda() {
        return Err(ModelError::Candle(candle_core::Error::Msg(format!(
            "FP8 on the GPU takes bf16 operands whose sides are multiples of {GPU_MULTIPLE}; got a \
             {:?} {:?} matrix",
            m.dtype(),
            m.dims()
        ))));
    }
    let (r, s) = m.dims2()?;
    let v = m.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let quantised = quant::quantize_fp8_e4m3_tiles(&v, r, s, tile)
        .and_then(|(q, sc)| quant::dequantize_fp8_e4m3_tiles(&q, &sc, r, s, tile))
        .map_err(|e| ModelError::Candle(candle_core::Error::Msg(format!("FP8: {e}"))))?;
    Ok(Tensor::from_vec(quantised, (r, s), m.device())?)
}

/// A weight `w (IN, OUT)` already in FP8 E4M3 with one scale a [`WEIGHT_TILE`]: its codes
/// `(IN, OUT)` (u8, the E4M3 bits) and scales `(ceil(IN / 128), ceil(OUT / 128))` (f32, the
/// dequantisation factors), exactly [`quant::quantize_fp8_e4m3_tiles`] of the weight. It is
/// what FP8 qwZ's gather delivers (`zero`'s `Fp8TileGather`), so that a layer multiplies
/// the gathered codes with no quantisation of its own: the same numbers as quantising the
/// dense weight in the layer, bit for bit.
#[derive(Clone, Debug)]
pub struct Fp8Weight {
    codes: Tensor,
    scales: Tensor,
}

impl Fp8Weight {
    /// From codes `(IN, OUT)` u8 and scales `(ceil(IN / 128), ceil(OUT / 128))` f32.
    pub fn new(codes: Tensor, scales: Tensor) -> Result<Fp8Weight> {
        let (r, c) = codes.dims2()?;
        let tiles = [r.div_ceil(WEIGHT_TILE.rows), c.div_ceil(WEIGHT_TILE.cols)];
        if codes.dtype() != DType::U8 || scales.dtype() != DType::F32 || scales.dims() != tiles {
            return Err(ModelError::ShapeMismatch {
                what: "FP8 weight: u8 codes (IN, OUT) and f32 scales, one a 128 x 128 tile",
                expected: tiles.to_vec(),
                got: scales.dims().to_vec(),
            });
        }
        Ok(Fp8Weight { codes, scales })
    }

    /// `w (IN, OUT)` quantised in 128 x 128 tiles (the CPU reference of what FP8 qwZ sends).
    pub fn quantize(w: &Tensor) -> Result<Fp8Weight> {
        let (r, c) = w.dims2()?;
        let v = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let (codes, scales) =
            quant::quantize_fp8_e4m3_tiles(&v, r, c, WEIGHT_TILE).map_err(fp8_error)?;
        let tiles = (r.div_ceil(WEIGHT_TILE.rows), c.div_ceil(WEIGHT_TILE.cols));
        Fp8Weight::new(
            Tensor::from_vec(codes, (r, c), w.device())?,
            Tensor::from_vec(scales, tiles, w.device())?,
        )
    }

    /// `(IN, OUT)`.
    pub fn dims(&self) -> (usize, usize) {
        let d = self.codes.dims();
        (d[0], d[1])
    }

    pub fn codes(&self) -> &Tensor {
        &self.codes
    }

    pub fn scales(&self) -> &Tensor {
        &self.scales
    }

    /// The values the FP8 GEMM multiplies, as f32 (each code's value times its tile's scale,
    /// one f32 product): [`fp8_round`] of the weight these codes were quantised from, bit for
    /// bit. The CPU's emulation reads these; on the GPU the GEMMs read the codes.
    pub fn dequantize(&self) -> Result<Tensor> {
        let (r, c) = self.dims();
        if self.codes.device().is_cuda() {
            return Err(ModelError::Candle(candle_core::Error::Msg(format!(
                "an FP8 weight ({r} x {c}) on the GPU is read by the FP8 GEMMs alone, which take \
                 bf16 inputs and sides that are multiples of {GPU_MULTIPLE}"
            ))));
        }
        let codes = self.codes.flatten_all()?.to_vec1::<u8>()?;
        let scales = self.scales.flatten_all()?.to_vec1::<f32>()?;
        let v = quant::dequantize_fp8_e4m3_tiles(&codes, &scales, r, c, WEIGHT_TILE)
            .map_err(fp8_error)?;
        Ok(Tensor::from_vec(v, (r, c), self.codes.device())?)
    }
}

fn fp8_error(e: quant::QuantError) -> ModelError {
    ModelError::Candle(candle_core::Error::Msg(format!("FP8: {e}")))
}

/// `x @ w` in FP8, as f32: `x (N, IN)` in `1 x 128` blocks, `w (IN, OUT)` in `128 x 128` tiles.
pub fn fp8_matmul_forward(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let xq = fp8_round(x, ROW_BLOCK)?;
    let wq = fp8_round(w, WEIGHT_TILE)?;
    Ok(xq.matmul(&wq)?)
}

/// Gradients of [`fp8_matmul_forward`], as f32: `dx (N, IN) = dout @ w^T` (dout in `1 x 128`
/// blocks along OUT, `w` in the forward's tiles) and `dw (IN, OUT) = x^T @ dout` (both in
/// `128 x 1` blocks along N). Quantisation passes the gradient straight through: these are the
/// gradients of the product of the quantised operands.
pub fn fp8_matmul_backward(dout: &Tensor, x: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
    rounded_matmul_backward(dout, x, &fp8_round(w, WEIGHT_TILE)?)
}

/// [`fp8_matmul_backward`] with the weight's FP8 values `wq` given.
fn rounded_matmul_backward(dout: &Tensor, x: &Tensor, wq: &Tensor) -> Result<(Tensor, Tensor)> {
    let dq = fp8_round(dout, ROW_BLOCK)?;
    let dx = dq.matmul(&wq.t()?)?;
    let xc = fp8_round(x, COL_BLOCK)?;
    let dc = fp8_round(dout, COL_BLOCK)?;
    let dw = xc.t()?.matmul(&dc)?;
    Ok((dx, dw))
}

/// `out = x @ w (+ bias) (+ residual)` with the product in FP8: `x (N, IN)`, `w (IN, OUT)`,
/// `bias (OUT)`, `residual (N, OUT)`; added in f32, rounded once to `x`'s dtype.
pub fn fp8_linear_forward(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    linear_forward_of(x, &LinearWeight::Dense(w.clone()), bias, residual)
}

/// [`fp8_linear_forward`] of a weight given either way: dense, or gathered in FP8.
pub(crate) fn linear_forward_of(
    x: &Tensor,
    w: &LinearWeight,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(y) = cuda::cols_forward(x, std::slice::from_ref(w), residual)? {
            return Ok(match bias {
                Some(b) => y.broadcast_add(b)?,
                None => y,
            });
        }
    }
    rounded_linear_forward(x, &w.fp8_values()?, bias, residual)
}

/// [`fp8_linear_forward`]'s reference with the weight's FP8 values `wq` given.
fn rounded_linear_forward(
    x: &Tensor,
    wq: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    let mut y = fp8_round(x, ROW_BLOCK)?.matmul(wq)?;
    if let Some(b) = bias {
        y = y.broadcast_add(&b.to_dtype(DType::F32)?)?;
    }
    if let Some(r) = residual {
        y = (y + r.to_dtype(DType::F32)?)?;
    }
    Ok(y.to_dtype(x.dtype())?)
}

/// Gradients of [`fp8_linear_forward`]: `(dx (N, IN), dw (IN, OUT), db (OUT) when want_db)`,
/// in `x`'s dtype; the bias gradient is `dout`'s column sums in f32, not quantised.
pub fn fp8_linear_backward(
    dout: &Tensor,
    x: &Tensor,
    w: &Tensor,
    want_db: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    linear_backward_of(dout, x, &LinearWeight::Dense(w.clone()), want_db)
}

/// [`fp8_linear_backward`] of a weight given either way.
pub(crate) fn linear_backward_of(
    dout: &Tensor,
    x: &Tensor,
    w: &LinearWeight,
    want_db: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some((dx, mut dws)) = cuda::cols_backward(dout, x, std::slice::from_ref(w), &[None])?
        {
            let db = want_db.then(|| super::bias_grad(dout)).transpose()?;
            return Ok((dx, dws.pop().expect("one weight"), db));
        }
    }
    let dt = x.dtype();
    let (dx, dw) = rounded_matmul_backward(dout, x, &w.fp8_values()?)?;
    let db = want_db
        .then(|| dout.to_dtype(DType::F32)?.sum(0)?.to_dtype(dt))
        .transpose()?;
    Ok((dx.to_dtype(dt)?, dw.to_dtype(dt)?, db))
}

/// Packed projections in FP8: `[x @ w_0 | x @ w_1 | ...] (+ residual)`, `x (N, IN)`, `w_i (IN,
/// OUT_i)`, `residual (N, sum OUT_i)`: each column block [`fp8_linear_forward`] of its weight.
/// On the GPU `x` is quantised once and each GEMM writes its columns of the one output.
pub fn fp8_linear_cols_forward(
    x: &Tensor,
    ws: &[Tensor],
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    cols_forward_of(x, &dense(ws), residual)
}

fn dense(ws: &[Tensor]) -> Vec<LinearWeight> {
    ws.iter().cloned().map(LinearWeight::Dense).collect()
}

/// [`fp8_linear_cols_forward`] of weights given either way (dense, or gathered in FP8).
pub(crate) fn cols_forward_of(
    x: &Tensor,
    ws: &[LinearWeight],
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(y) = cuda::cols_forward(x, ws, residual)? {
            return Ok(y);
        }
    }
    // The reference: x rounded once, each part fp8_linear_forward's arithmetic.
    let xq = fp8_round(x, ROW_BLOCK)?;
    let mut off = 0;
    let mut parts = Vec::with_capacity(ws.len());
    for w in ws {
        let wq = w.fp8_values()?;
        let out = wq.dim(1)?;
        let mut y = xq.matmul(&wq)?;
        if let Some(r) = residual {
            y = (y + r.narrow(1, off, out)?.to_dtype(DType::F32)?)?;
        }
        parts.push(y.to_dtype(x.dtype())?);
        off += out;
    }
    Ok(match parts.len() {
        1 => parts.pop().expect("one part"),
        _ => Tensor::cat(&parts, 1)?,
    })
}

/// Gradients of [`fp8_linear_cols_forward`]: `(dx = sum_i dout_i @ w_i^T, [dw_i = x^T @
/// dout_i])`, each term [`fp8_linear_backward`]'s; on the GPU `dw_i` goes into `into[i]` where
/// given (a slot of the unit's flat gradient, then returned as that view).
pub fn fp8_linear_cols_backward(
    dout: &Tensor,
    x: &Tensor,
    ws: &[Tensor],
    into: &[Option<Tensor>],
) -> Result<(Tensor, Vec<Tensor>)> {
    cols_backward_of(dout, x, &dense(ws), into)
}

/// [`fp8_linear_cols_backward`] of weights given either way.
pub(crate) fn cols_backward_of(
    dout: &Tensor,
    x: &Tensor,
    ws: &[LinearWeight],
    into: &[Option<Tensor>],
) -> Result<(Tensor, Vec<Tensor>)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(r) = cuda::cols_backward(dout, x, ws, into)? {
            return Ok(r);
        }
    }
    let _ = into; // only the GPU's GEMMs write into slots
                  // The reference: x's 128 x 1 rounding once, each term fp8_matmul_backward's arithmetic.
    let dt = x.dtype();
    let xc = fp8_round(x, COL_BLOCK)?;
    let wqs = ws
        .iter()
        .map(LinearWeight::fp8_values)
        .collect::<Result<Vec<_>>>()?;
    super::projection::cols_backward_each(dout, &wqs, |d, wq| {
        let dx = fp8_round(d, ROW_BLOCK)?.matmul(&wq.t()?)?;
        let dw = xc.t()?.matmul(&fp8_round(d, COL_BLOCK)?)?;
        Ok((dx.to_dtype(dt)?, dw.to_dtype(dt)?))
    })
}

#[cfg(feature = "cuda")]
pub mod cuda {
    //! The FP8 linear layers on the GPU: the quantisers of `kernels/cuda/fp8.cu` and
    //! cuBLASLt's block-scaled FP8 GEMMs (`crate::gemm`), in cuBLAS's column-major terms (a
    //! row-major `(R, S)` matrix is column-major `(S, R)` with leading dimension `S`):
    //! - forward `y^T (OUT, N) = w^T x^T`: A = w's transposed codes `(OUT, IN)` row-major
    //!   (tiles, K = IN), B = x's codes `(N, IN)` (1 x 128 blocks), D = y `(N, OUT)`;
    //! - input gradient `dx^T (IN, N)`: A = w's codes `(IN, OUT)` (tiles, K = OUT), B = dout's
    //!   codes `(N, OUT)` (1 x 128);
    //! - weight gradient `dw^T (OUT, IN)`, i.e. `dw (IN, OUT)` row-major: A = dout^T's codes
    //!   `(OUT, N)`, B = x^T's codes `(IN, N)`, both 128 x 1 blocks of the originals (K = N).
    //!
    //! Everything is queued on the tensors' stream; the codes live until the GEMMs that read
    //! them have been queued (stream order keeps them valid until those have run).
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::CudaDevice;
    use candle_core::{DType, Tensor};
    use kernels::launch::{Kernel, Module};
    use kernels::profile::Family;

    use super::GPU_MULTIPLE;
    use crate::error::Result;
    use crate::gemm::{self, BlockScales, Epilogue, Gemm, ScaleMode};
    use crate::gpu;
    use crate::linears::LinearWeight;

    /// One CTA's threads in every quantiser (fp8.cu's launch bounds).
    const THREADS: usize = 256;
    /// The K-block and tile side of the scales.
    const BLOCK: usize = 128;

    fn kernel(dev: &CudaDevice, name: &str) -> Result<Kernel> {
        Ok(Kernel::load(
            dev,
            Module::new(&kernels::FP8, &[], kernels::Flavour::Fast),
            name,
        )?)
    }

    /// FP8 codes of a GEMM operand stored K-contiguous, `(outer, K)` row-major (u8 tensors: the
    /// E4M3 bits, which the GEMM reads as `CUDA_R_8F_E4M3`), and their f32 scales in cuBLASLt's
    /// layout for `mode`.
    pub struct Operand {
        pub codes: Tensor,
        pub scales: Tensor,
        pub mode: ScaleMode,
    }

    /// A weight `w (IN, OUT)` in 128 x 128 tiles: its codes for the input gradient (`(IN, OUT)`,
    /// K = OUT) and the transposed ones for the forward (`(OUT, IN)`, K = IN), one scale a
    /// tile in each operand's layout.
    pub struct Weight {
        pub codes: Operand,
        pub codes_t: Operand,
    }

    /// Whether a `(rows, cols)` bf16 matrix can be an FP8 operand: contiguous, both sides
    /// multiples of [`GPU_MULTIPLE`], and small enough for the kernels' int indices.
    fn takes(t: &Tensor) -> bool {
        t.dtype() == DType::BF16
            && t.is_contiguous()
            && t.dims2().is_ok_and(|(r, c)| {
                r.is_multiple_of(GPU_MULTIPLE)
                    && c.is_multiple_of(GPU_MULTIPLE)
                    && r > 0
                    && c > 0
                    && r <= i32::MAX as usize
                    && c <= i32::MAX as usize
            })
    }

    /// Whether a weight `(inp, OUT)` can be an FP8 operand: a bf16 matrix the quantisers take,
    /// or codes gathered in FP8 on the GPU with sides multiples of [`GPU_MULTIPLE`].
    fn takes_weight(w: &LinearWeight, inp: usize) -> bool {
        match w {
            LinearWeight::Dense(t) => takes(t) && t.dim(0).ok() == Some(inp),
            LinearWeight::Fp8(q) => {
                let (r, c) = q.dims();
                q.codes().device().is_cuda()
                    && q.codes().is_contiguous()
                    && r == inp
                    && r.is_multiple_of(GPU_MULTIPLE)
                    && c.is_multiple_of(GPU_MULTIPLE)
                    && c > 0
                    && c <= i32::MAX as usize
            }
        }
    }

    /// A weight's OUT.
    fn out_of(w: &LinearWeight) -> usize {
        match w {
            LinearWeight::Dense(t) => t.dim(1).unwrap_or(0),
            LinearWeight::Fp8(q) => q.dims().1,
        }
    }

    /// `(N, IN, sum OUT_i)` of packed projections the kernels take: `x (N, IN)`, every `w_i (IN,
    /// OUT_i)` and `other` (the residual, or dout) `(N, sum OUT_i)` FP8 operands; else `None`.
    fn packed_shape(
        x: &Tensor,
        ws: &[LinearWeight],
        other: Option<&Tensor>,
    ) -> Option<(usize, usize, usize)> {
        let (n, inp) = x.dims2().ok()?;
        let total: usize = ws.iter().map(out_of).sum();
        let fits = takes(x)
            && !ws.is_empty()
            && ws.iter().all(|w| takes_weight(w, inp))
            && other.is_none_or(|o| takes(o) && o.dims() == [n, total]);
        fits.then_some((n, inp, total))
    }

    /// A weight as the GEMM that contracts over its IN reads it (the forward: its transposed
    /// codes `(OUT, IN)`, scales `[OB][round_up(IB, 4)]`), or with `!forward` as the input
    /// gradient's reads it (its codes `(IN, OUT)`, scales `[IB][round_up(OB, 4)]`): quantised
    /// here from bf16, or rearranged from the codes and tile scales FP8 qwZ gathered (the same
    /// bytes: `fp8_quantize_tiles` is `quant::quantize_fp8_e4m3_tiles` bit for bit).
    fn weight_operand(w: &LinearWeight, forward: bool) -> Result<Operand> {
        match w {
            LinearWeight::Dense(t) => {
                let (codes, codes_t) = quantize_tiles(t, !forward, forward)?;
                Ok(match forward {
                    true => codes_t.expect("asked for w^T's codes"),
                    false => codes.expect("asked for w's codes"),
                })
            }
            LinearWeight::Fp8(q) => {
                let (inp, out) = q.dims();
                let (ib, ob) = (inp.div_ceil(BLOCK), out.div_ceil(BLOCK));
                let (codes, scales, pad) = match forward {
                    true => (q.codes().t()?.contiguous()?, q.scales().t()?, ib),
                    false => (q.codes().clone(), q.scales().clone(), ob),
                };
                let scales = scales
                    .pad_with_zeros(1, 0, pad.next_multiple_of(4) - pad)?
                    .contiguous()?;
                Ok(Operand {
                    codes,
                    scales,
                    mode: ScaleMode::Blk128x128,
                })
            }
        }
    }

    /// The `cols` columns from `col` of the row-major bf16 `x (R, ld)`, quantised: in 1 x 128
    /// blocks along the columns (`fp8_quantize_rows`: codes `(R, cols)`, scales `[ceil(cols /
    /// 128)][R]`), or with `transposed` in 128 x 1 blocks (`fp8_quantize_cols_t`: the codes of
    /// the transpose, `(cols, R)`, scales `[ceil(R / 128)][cols]`).
    fn quantize_view(x: &Tensor, col: usize, cols: usize, transposed: bool) -> Result<Operand> {
        let dev = gpu::device(x)?;
        let _span = kernels::profile::scope_cuda(&dev, Family::Quantisation);
        let (rows, ld) = x.dims2()?;
        let (name, codes, scales, cfg) = if transposed {
            let cfg = LaunchConfig {
                grid_dim: (cols.div_ceil(32) as u32, rows.div_ceil(BLOCK) as u32, 1),
                block_dim: (THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            (
                "fp8_quantize_cols_t",
                (cols, rows),
                (rows.div_ceil(BLOCK), cols),
                cfg,
            )
        } else {
            // A warp a block.
            let ctas = (rows * cols.div_ceil(BLOCK)).div_ceil(THREADS / 32);
            let cfg = kernels::launch::grid(ctas, THREADS);
            (
                "fp8_quantize_rows",
                (rows, cols),
                (cols.div_ceil(BLOCK), rows),
                cfg,
            )
        };
        let codes = gpu::uninit(codes, DType::U8, &dev)?;
        let scales = gpu::uninit(scales, DType::F32, &dev)?;
        let func = kernel(&dev, name)?;
        let px = gpu::ptr(x)? + 2 * col as u64;
        let (pc, ps) = (gpu::ptr(&codes)?, gpu::ptr(&scales)?);
        // SAFETY: x addresses rows x ld bf16 (this view: cols from col); codes rows x cols
        // bytes and the scales, fresh, each written once by the kernel; arguments in kernel
        // order.
        unsafe {
            func.launch(
                cfg,
                &[&px, &(ld as i64), &pc, &ps, &(rows as i32), &(cols as i32)],
            )?;
        }
        Ok(Operand {
            codes,
            scales,
            mode: ScaleMode::Vec128,
        })
    }

    /// `x (R, S)` in 1 x 128 blocks along S: codes `(R, S)`, scales `[ceil(S / 128)][R]`.
    pub fn quantize_rows(x: &Tensor) -> Result<Operand> {
        quantize_view(x, 0, x.dim(1)?, false)
    }

    /// `x (R, S)` in 128 x 1 blocks: the codes of `x^T`, `(S, R)`, scales `[ceil(R / 128)][S]`.
    pub fn quantize_cols_t(x: &Tensor) -> Result<Operand> {
        quantize_view(x, 0, x.dim(1)?, true)
    }

    /// `w (IN, OUT)` in 128 x 128 tiles, both orientations.
    pub fn quantize_weight(w: &Tensor) -> Result<Weight> {
        let (codes, codes_t) = quantize_tiles(w, true, true)?;
        Ok(Weight {
            codes: codes.expect("asked for w's codes"),
            codes_t: codes_t.expect("asked for w^T's codes"),
        })
    }

    /// `w (IN, OUT)` in 128 x 128 tiles: the codes for the input gradient where `want_codes`,
    /// the transposed ones for the forward where `want_codes_t` (a pass reads one of the two).
    fn quantize_tiles(
        w: &Tensor,
        want_codes: bool,
        want_codes_t: bool,
    ) -> Result<(Option<Operand>, Option<Operand>)> {
        let dev = gpu::device(w)?;
        let _span = kernels::profile::scope_cuda(&dev, Family::Quantisation);
        let (inp, out) = w.dims2()?;
        let (ib, ob) = (inp.div_ceil(BLOCK), out.div_ceil(BLOCK));
        let (ld_fwd, ld_bwd) = (ib.next_multiple_of(4), ob.next_multiple_of(4));
        let codes = want_codes
            .then(|| gpu::uninit((inp, out), DType::U8, &dev))
            .transpose()?;
        let codes_t = want_codes_t
            .then(|| gpu::uninit((out, inp), DType::U8, &dev))
            .transpose()?;
        // The padding of each scale row is never written: zeros, so that nothing undefined is
        // ever handed to cuBLASLt.
        let device = candle_core::Device::Cuda(dev.clone());
        let scales_fwd = Tensor::zeros((ob, ld_fwd), DType::F32, &device)?;
        let scales_bwd = Tensor::zeros((ib, ld_bwd), DType::F32, &device)?;
        let func = kernel(&dev, "fp8_quantize_tiles")?;
        let cfg = LaunchConfig {
            grid_dim: (ob as u32, ib as u32, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let pw = gpu::ptr(w)?;
        // A null address: the kernel skips that orientation.
        let address = |t: &Option<Tensor>| t.as_ref().map_or(Ok(0), gpu::ptr);
        let (pc, pt) = (address(&codes)?, address(&codes_t)?);
        let (pf, pb) = (gpu::ptr(&scales_fwd)?, gpu::ptr(&scales_bwd)?);
        // SAFETY: w (IN, OUT) bf16 contiguous; codes, codes_t IN x OUT bytes fresh, every one
        // written (or null, then never touched); the scales ob x ld_fwd and ib x ld_bwd f32;
        // arguments in kernel order.
        unsafe {
            func.launch(
                cfg,
                &[
                    &pw,
                    &(out as i64),
                    &pc,
                    &pt,
                    &pf,
                    &pb,
                    &(inp as i32),
                    &(out as i32),
                    &(ld_fwd as i32),
                    &(ld_bwd as i32),
                ],
            )?;
        }
        let operand = |codes: Tensor, scales: Tensor| Operand {
            codes,
            scales,
            mode: ScaleMode::Blk128x128,
        };
        Ok((
            codes.map(|c| operand(c, scales_bwd)),
            codes_t.map(|c| operand(c, scales_fwd)),
        ))
    }

    /// `D (m, n) = A^T B (+ C)` in cuBLAS terms with A stored `(m, k)` and B `(n, k)`, both
    /// K-contiguous FP8 operands: D bf16 at `d` with leading dimension `ldd`, C (when given)
    /// likewise.
    pub fn gemm_tn(
        dev: &CudaDevice,
        a: &Operand,
        b: &Operand,
        (m, n, k): (usize, usize, usize),
        d: u64,
        ldd: usize,
        c: Option<u64>,
    ) -> Result<()> {
        gemm::run(
            dev,
            &Gemm {
                m,
                n,
                k,
                a: gpu::ptr(&a.codes)?,
                lda: k,
                trans_a: true,
                b: gpu::ptr(&b.codes)?,
                ldb: k,
                trans_b: false,
                in_type: DType::F8E4M3,
                d,
                ldd,
                d_type: DType::BF16,
                epilogue: Epilogue::None,
                c,
                scales: Some(BlockScales {
                    a: gpu::ptr(&a.scales)?,
                    a_mode: a.mode,
                    b: gpu::ptr(&b.scales)?,
                    b_mode: b.mode,
                }),
            },
        )
    }

    /// `[x @ w_0 | x @ w_1 | ...] (+ residual)` in bf16, or `None` where the operands do not
    /// fit (then the caller's reference refuses CUDA tensors in one line).
    pub fn cols_forward(
        x: &Tensor,
        ws: &[LinearWeight],
        residual: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        let Some((n, inp, total)) = packed_shape(x, ws, residual) else {
            return Ok(None);
        };
        let dev = gpu::device(x)?;
        let xq = quantize_rows(x)?;
        let y = gpu::uninit((n, total), DType::BF16, &dev)?;
        let (py, pr) = (gpu::ptr(&y)?, residual.map(gpu::ptr).transpose()?);
        let mut off = 0u64;
        for w in ws {
            let out = out_of(w);
            let wq = weight_operand(w, true)?;
            let shift = 2 * off;
            gemm_tn(
                &dev,
                &wq,
                &xq,
                (out, n, inp),
                py + shift,
                total,
                pr.map(|p| p + shift),
            )?;
            off += out as u64;
        }
        Ok(Some(y))
    }

    /// Gradients of [`cols_forward`] without a residual's: `(dx, [dw_i])`, each `dw_i` written
    /// into `into[i]` where it is a bf16 `(IN, OUT_i)` slot; `None` where the operands do not
    /// fit.
    pub fn cols_backward(
        dout: &Tensor,
        x: &Tensor,
        ws: &[LinearWeight],
        into: &[Option<Tensor>],
    ) -> Result<Option<(Tensor, Vec<Tensor>)>> {
        let Some((n, inp, _)) = packed_shape(x, ws, Some(dout)) else {
            return Ok(None);
        };
        let dev = gpu::device(x)?;
        let xt = quantize_cols_t(x)?;
        let dx = gpu::uninit((n, inp), DType::BF16, &dev)?;
        let pdx = gpu::ptr(&dx)?;
        let mut dws = Vec::with_capacity(ws.len());
        let mut off = 0;
        for (i, w) in ws.iter().enumerate() {
            let out = out_of(w);
            let wq = weight_operand(w, false)?;
            let dq = quantize_view(dout, off, out, false)?;
            // dx (+)= dout_i @ w_i^T
            gemm_tn(
                &dev,
                &wq,
                &dq,
                (inp, n, out),
                pdx,
                inp,
                (i > 0).then_some(pdx),
            )?;
            let dt = quantize_view(dout, off, out, true)?;
            let dw = match into.get(i) {
                Some(Some(v))
                    if v.dtype() == DType::BF16 && v.is_contiguous() && v.dims() == [inp, out] =>
                {
                    v.clone()
                }
                _ => gpu::uninit((inp, out), DType::BF16, &dev)?,
            };
            // dw_i^T (OUT, IN) column-major is dw_i (IN, OUT) row-major.
            gemm_tn(&dev, &dt, &xt, (out, inp, n), gpu::ptr(&dw)?, out, None)?;
            dws.push(dw);
            off += out;
        }
        Ok(Some((dx, dws)))
    }
}
