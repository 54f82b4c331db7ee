//! FP8 linear layers (issue 40): `x @ w` with both operands in FP8 E4M3 and f32 scales a
//! block, the forward and the two backward GEMMs side by side. The functions here are the
//! reference of the recipe; the CPU runs it as an emulation (each operand quantised and
//! dequantised in f32, the product in f32), which is what an FP8 GEMM with f32 accumulation
//! computes up to the order of its sums. On the GPU (module `cuda`) the quantisers of
//! `kernels/cuda/fp8.cu` write each operand's codes and scales, bitwise the CPU's, and
//! cuBLASLt's block-scaled FP8 GEMMs multiply them (`crate::gemm`): the forward reads the
//! weight's transposed codes, the weight gradient both operands' transposed codes (Hopper's FP8
//! MMA reads both operands K-contiguous). There the output is bf16, and a bias (in the epilogue)
//! and a residual (as C) are added before the GEMM's one rounding, as in the reference: a GPU
//! result differs from it by the order of the sums.
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
//! of the input gradient ([`ROW_BLOCK`]); in the weight gradient `128 x 1` (128 positions of a
//! column) for `dout` ([`COL_BLOCK`]) and `128 x 128` tiles for the layer's input
//! ([`INPUT_TILE`]), or a whole column for both operands of the down projection's
//! ([`whole_columns`], `swiglu_mlp_backward_of`); cuBLASLt takes these on Hopper as
//! `VEC128_32F`, `BLK128x128_32F` and `OUTER_VEC_32F` scales. Tiles at a matrix's edge are
//! shorter.
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
/// The scale block of a weight gradient's `dout`, contracted along its columns: `128 x 1`.
pub const COL_BLOCK: Tile = Tile { rows: 128, cols: 1 };
/// The scale block of a weight gradient's other operand, the layer's input `x (N, IN)`: one
/// scale a `128 x 128` tile of 128 tokens by 128 channels. On Hopper cuBLASLt multiplies it with
/// `dout`'s [`COL_BLOCK`]s at 1.24-1.29x the speed of `128 x 1` blocks on both sides at Llama
/// 3.2 1B's shapes and 2.2x at gpt350m's c_attn (docs/kernels.md, "FP8"); the tile goes to the
/// input, not the gradient, whose token-correlated outliers made block-wise gradients diverge
/// in DeepSeek-V3's trials.
pub const INPUT_TILE: Tile = Tile {
    rows: 128,
    cols: 128,
};

/// The scale block of `dout (N, OUT)`'s columns in a weight gradient whose input was
/// quantised in `x_tile`s: whole columns beside whole columns (cuBLASLt takes row-wise scales
/// on both operands only), else [`COL_BLOCK`].
pub fn dout_cols_tile(x_tile: Tile, n: usize) -> Tile {
    match x_tile == whole_columns(n) {
        true => x_tile,
        false => COL_BLOCK,
    }
}

/// The scale block of a weight gradient's operand `(n, _)` scaled a whole column at a time (one
/// scale a row of the transpose: torchao's row-wise, cuBLASLt's `OUTER_VEC_32F`), which the
/// down projection's weight gradient takes (docs/kernels.md, "FP8"): on Hopper that GEMM runs
/// at 1.3-1.4x the speed of 128 x 1 blocks, and the scale needs the column's absmax over all
/// the tokens before any of it is encoded, which SwiGLU's forward and a pass over down's dout
/// (the residual gradient, in bf16) find cheaply.
pub fn whole_columns(n: usize) -> Tile {
    Tile {
        rows: n.max(1),
        cols: 1,
    }
}

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
/// dense weight in the layer, bit for bit. A walk that keeps a unit's weights from its forward
/// for its backward quantises them once for both passes ([`crate::LinearFormat::for_both_passes`]):
/// then the weight also carries the forward's orientation, `w^T`'s codes as the forward's GEMM
/// reads them ([`Fp8Weight::transposed`]).
#[derive(Clone, Debug)]
pub struct Fp8Weight {
    codes: Tensor,
    scales: Tensor,
    transposed: Option<Transposed>,
}

/// `w^T`'s codes `(OUT, IN)` and scales `[ceil(OUT / 128)][round_up(ceil(IN / 128), 4)]` (f32,
/// the padding zeros): the same tiles as the weight's codes, laid out for the GEMM that
/// contracts over IN (the forward; `layers/fp8_linear/cuda.rs`).
#[derive(Clone, Debug)]
pub struct Transposed {
    pub codes: Tensor,
    pub scales: Tensor,
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
        Ok(Fp8Weight {
            codes,
            scales,
            transposed: None,
        })
    }

    /// This weight also holding `w^T`'s codes as the forward reads them, the same tiles
    /// transposed (made in the quantiser's read of the dense weight, `fp8_quantize_tiles`).
    pub fn with_transposed(self, t: Transposed) -> Result<Fp8Weight> {
        let (r, c) = self.dims();
        let ld = r.div_ceil(WEIGHT_TILE.rows).next_multiple_of(4);
        let fits = t.codes.dims() == [c, r]
            && t.codes.dtype() == DType::U8
            && t.scales.dims() == [c.div_ceil(WEIGHT_TILE.cols), ld]
            && t.scales.dtype() == DType::F32;
        if !fits {
            return Err(ModelError::ShapeMismatch {
                what: "FP8 weight: w^T's u8 codes (OUT, IN) and f32 tile scales, rows padded to 4",
                expected: vec![c, r],
                got: t.codes.dims().to_vec(),
            });
        }
        Ok(Fp8Weight {
            transposed: Some(t),
            ..self
        })
    }

    /// `w^T`'s codes and scales where this weight holds them ([`Fp8Weight::with_transposed`]).
    pub fn transposed(&self) -> Option<&Transposed> {
        self.transposed.as_ref()
    }

    /// This weight without `w^T`'s codes: what a backward that runs no forward of the layer
    /// again reads.
    pub fn without_transposed(self) -> Fp8Weight {
        Fp8Weight {
            transposed: None,
            ..self
        }
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

/// What an FP8 linear layer's backward reads of its input `x (N, IN)`: `x` in [`INPUT_TILE`]s
/// (or [`whole_columns`], SwiGLU's output), the weight gradient's operand, made in the
/// forward's one read of `x` ([`cols_forward_saving_of`]). A block keeps it in place of `x`
/// where the weight gradient is all its backward reads `x` for: on the GPU 1 byte an element
/// (and a scale a tile) instead of 2, and no pass over `x` in the backward. The numbers are
/// those the backward would make from `x`, bit for bit. The weight gradient scales dout's
/// columns as [`dout_cols_tile`] says for the tile `x` was kept in.
#[derive(Clone, Debug)]
pub struct Fp8Input {
    /// `x`'s dtype (the backward's outputs are in it) and `(N, IN)`.
    dtype: DType,
    dims: (usize, usize),
    cols: Fp8Cols,
}

#[derive(Clone, Debug)]
enum Fp8Cols {
    /// The CPU reference: `fp8_round(x, tile)`, f32 `(N, IN)`, `tile` [`INPUT_TILE`] or
    /// [`whole_columns`]`(N)`.
    Values { x: Tensor, tile: Tile },
    /// `x^T`'s codes `(IN, N)` and their scales: 128 x 128 tiles (`cuda::quantize_input_cols`'s)
    /// or whole columns (`cuda::quantize_cols_whole`'s).
    #[cfg(feature = "cuda")]
    Codes(cuda::Operand),
    /// SwiGLU's output `act (N, F)` on the GPU as its columns' absmax alone (`(F)` u32, the
    /// f32 bits; its whole columns' scales): down's weight gradient reads `act^T`'s codes,
    /// which SwiGLU's backward kernel makes from `gu` (`swiglu_mlp_backward_of`, the one reader).
    #[cfg(feature = "cuda")]
    SwigluAbsmax(Tensor),
}

impl Fp8Cols {
    /// The CPU reference of `x (N, IN)` in `tile`s.
    fn values(x: &Tensor, tile: Tile) -> Result<Fp8Cols> {
        Ok(Fp8Cols::Values {
            x: fp8_round(x, tile)?,
            tile,
        })
    }
}

impl Fp8Input {
    /// `(N, IN)`.
    pub fn dims(&self) -> (usize, usize) {
        self.dims
    }
}

/// `x @ w` in FP8, as f32: `x (N, IN)` in `1 x 128` blocks, `w (IN, OUT)` in `128 x 128` tiles.
pub fn fp8_matmul_forward(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let xq = fp8_round(x, ROW_BLOCK)?;
    let wq = fp8_round(w, WEIGHT_TILE)?;
    Ok(xq.matmul(&wq)?)
}

/// Gradients of [`fp8_matmul_forward`], as f32: `dx (N, IN) = dout @ w^T` (dout in `1 x 128`
/// blocks along OUT, `w` in the forward's tiles) and `dw (IN, OUT) = x^T @ dout` (`x` in
/// [`INPUT_TILE`]s, `dout` in `128 x 1` blocks along N). Quantisation passes the gradient
/// straight through: these are the gradients of the product of the quantised operands.
pub fn fp8_matmul_backward(dout: &Tensor, x: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
    rounded_matmul_backward(dout, x, &fp8_round(w, WEIGHT_TILE)?)
}

/// [`fp8_matmul_backward`] with the weight's FP8 values `wq` given.
fn rounded_matmul_backward(dout: &Tensor, x: &Tensor, wq: &Tensor) -> Result<(Tensor, Tensor)> {
    let dq = fp8_round(dout, ROW_BLOCK)?;
    let dx = dq.matmul(&wq.t()?)?;
    let xc = fp8_round(x, INPUT_TILE)?;
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
        if let Some(y) = cuda::cols_forward(x, std::slice::from_ref(w), bias, residual)? {
            return Ok(y);
        }
    }
    rounded_linear_forward(x, &w.fp8_values()?, bias, residual)
}

/// [`linear_forward_of`] with a bias, also returning what its backward reads of `x`
/// ([`cols_backward_saved_of`]): on the GPU both blockings of `x` come from one read.
pub(crate) fn linear_forward_saving_of(
    x: &Tensor,
    w: &LinearWeight,
    bias: &Tensor,
    residual: Option<&Tensor>,
) -> Result<(Tensor, Fp8Input)> {
    let (dtype, dims) = (x.dtype(), x.dims2()?);
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        let ws = std::slice::from_ref(w);
        if let Some((y, xt)) = cuda::cols_forward_saving(x, ws, Some(bias), residual)? {
            let cols = Fp8Cols::Codes(xt);
            return Ok((y, Fp8Input { dtype, dims, cols }));
        }
    }
    let y = rounded_linear_forward(x, &w.fp8_values()?, Some(bias), residual)?;
    let cols = Fp8Cols::values(x, INPUT_TILE)?;
    Ok((y, Fp8Input { dtype, dims, cols }))
}

/// `h = x @ w + b` in FP8, `gelu(h)`, and what the backward reads of `x`. On the GPU the bias
/// is added in the GEMM's epilogue.
pub(crate) fn linear_gelu_forward_saving_of(
    x: &Tensor,
    w: &LinearWeight,
    b: &Tensor,
) -> Result<(Tensor, Tensor, Fp8Input)> {
    let (dtype, dims) = (x.dtype(), x.dims2()?);
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        let ws = std::slice::from_ref(w);
        if let Some((h, xt)) = cuda::cols_forward_saving(x, ws, Some(b), None)? {
            let g = super::gelu_forward(&h)?;
            let cols = Fp8Cols::Codes(xt);
            return Ok((h, g, Fp8Input { dtype, dims, cols }));
        }
    }
    let h = rounded_linear_forward(x, &w.fp8_values()?, Some(b), None)?;
    let g = super::gelu_forward(&h)?;
    let cols = Fp8Cols::values(x, INPUT_TILE)?;
    Ok((h, g, Fp8Input { dtype, dims, cols }))
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
    cols_forward_of(x, &dense(ws), None, residual)
}

/// Each of `ws` (linear weights `(IN, OUT)` in the compute dtype) as an [`Fp8Weight`] for
/// both passes ([`crate::UnitParams::for_both_passes`]), `None` for one the GPU's quantisers
/// do not take (it stays dense): on the GPU the codes of both orientations from one read of
/// the bf16 weight, those sharing IN in one launch (`cuda::quantize_for_both_passes`); on the
/// CPU [`Fp8Weight::quantize`], whose values are those the layers round the weight to.
pub(crate) fn for_both_passes(ws: &[Tensor]) -> Result<Vec<Option<Fp8Weight>>> {
    #[cfg(feature = "cuda")]
    if ws.first().is_some_and(super::on_gpu) {
        return cuda::quantize_for_both_passes(ws);
    }
    ws.iter()
        .map(|w| Fp8Weight::quantize(w).map(Some))
        .collect()
}

fn dense(ws: &[Tensor]) -> Vec<LinearWeight> {
    ws.iter().cloned().map(LinearWeight::Dense).collect()
}

/// [`fp8_linear_cols_forward`] of weights given either way (dense, or gathered in FP8), with
/// the bias `(sum OUT_i)` where given (added in f32 before the one rounding, as the GPU's GEMM
/// epilogue adds it).
pub(crate) fn cols_forward_of(
    x: &Tensor,
    ws: &[LinearWeight],
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(y) = cuda::cols_forward(x, ws, bias, residual)? {
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
        if let Some(b) = bias {
            y = y.broadcast_add(&b.narrow(0, off, out)?.to_dtype(DType::F32)?)?;
        }
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

/// [`cols_forward_of`], also returning what its backward reads of `x`
/// ([`cols_backward_saved_of`]): on the GPU both blockings of `x` come from one read.
pub(crate) fn cols_forward_saving_of(
    x: &Tensor,
    ws: &[LinearWeight],
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<(Tensor, Fp8Input)> {
    let (dtype, dims) = (x.dtype(), x.dims2()?);
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some((y, xt)) = cuda::cols_forward_saving(x, ws, bias, residual)? {
            let cols = Fp8Cols::Codes(xt);
            return Ok((y, Fp8Input { dtype, dims, cols }));
        }
    }
    let y = cols_forward_of(x, ws, bias, residual)?;
    let cols = Fp8Cols::values(x, INPUT_TILE)?;
    Ok((y, Fp8Input { dtype, dims, cols }))
}

/// What [`cols_forward_saving_of`] keeps of `x`, without the product.
pub(crate) fn saved_input_of(x: &Tensor) -> Result<Fp8Input> {
    let (dtype, dims) = (x.dtype(), x.dims2()?);
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(xt) = cuda::cols_of(x)? {
            let cols = Fp8Cols::Codes(xt);
            return Ok(Fp8Input { dtype, dims, cols });
        }
    }
    let cols = Fp8Cols::values(x, INPUT_TILE)?;
    Ok(Fp8Input { dtype, dims, cols })
}

/// [`saved_input_of`] in [`whole_columns`]: what down's weight gradient keeps of SwiGLU's
/// output where the fused kernel does not make it (the CPU; on the GPU the columns' absmax,
/// then the codes, two reads of `x`).
pub(crate) fn saved_whole_of(x: &Tensor) -> Result<Fp8Input> {
    let (dtype, dims) = (x.dtype(), x.dims2()?);
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) && cuda::is_operand(x) {
        let xt = cuda::quantize_cols_whole(x, &cuda::column_absmax(x)?)?;
        let cols = Fp8Cols::Codes(xt);
        return Ok(Fp8Input { dtype, dims, cols });
    }
    let cols = Fp8Cols::values(x, whole_columns(dims.0))?;
    Ok(Fp8Input { dtype, dims, cols })
}

/// A shape the GPU's FP8 GEMMs do not take, where the quantiser before them did.
#[cfg(feature = "cuda")]
fn fp8_shape_error(what: &str, (n, k): (usize, usize)) -> ModelError {
    ModelError::Candle(candle_core::Error::Msg(format!(
        "FP8: {what} ({n}, {k}) and its weights do not fit the GPU's FP8 GEMMs"
    )))
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
    rounded_cols_backward(dout, &fp8_round(x, INPUT_TILE)?, INPUT_TILE, x.dtype(), ws)
}

/// [`cols_backward_of`] from what [`cols_forward_saving_of`] kept of `x`: the same gradients,
/// bit for bit.
pub(crate) fn cols_backward_saved_of(
    dout: &Tensor,
    x: &Fp8Input,
    ws: &[LinearWeight],
    into: &[Option<Tensor>],
) -> Result<(Tensor, Vec<Tensor>)> {
    match &x.cols {
        Fp8Cols::Values { x: xc, tile } => {
            let _ = into; // only the GPU's GEMMs write into slots
            rounded_cols_backward(dout, xc, *tile, x.dtype, ws)
        }
        #[cfg(feature = "cuda")]
        Fp8Cols::SwigluAbsmax(_) => Err(ModelError::Candle(candle_core::Error::Msg(
            "FP8: SwiGLU's output, kept for its own backward's kernel, reached another layer's \
             backward"
                .into(),
        ))),
        #[cfg(feature = "cuda")]
        Fp8Cols::Codes(xt) => {
            cuda::cols_backward_from(dout, xt, x.dims, ws, into)?.ok_or_else(|| {
                ModelError::Candle(candle_core::Error::Msg(format!(
                    "FP8: a saved ({}, {}) input whose gradient the GPU's GEMMs do not take",
                    x.dims.0, x.dims.1
                )))
            })
        }
    }
}

/// [`cols_backward_saved_of`] of one weight with a bias: `(dx, dw, db)`, `db` the column sums
/// of `dout`. On the GPU they come from the read that quantises `dout` (no pass of their own).
pub(crate) fn backward_saved_with_bias_of(
    dout: &Tensor,
    x: &Fp8Input,
    w: &LinearWeight,
    into: Option<Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if let Fp8Cols::Codes(xt) = &x.cols {
        if let Some(r) = cuda::cols_backward_from_with_bias(dout, xt, x.dims, w, into.clone())? {
            return Ok(r);
        }
    }
    let (dx, mut dws) = cols_backward_saved_of(dout, x, std::slice::from_ref(w), &[into])?;
    Ok((dx, dws.pop().expect("one weight"), super::bias_grad(dout)?))
}

/// The reference of the packed backward from `xc = fp8_round(x, tile)`: each term
/// fp8_matmul_backward's arithmetic (dout's columns in [`dout_cols_tile`] of `tile`), the
/// outputs in `dt`.
fn rounded_cols_backward(
    dout: &Tensor,
    xc: &Tensor,
    tile: Tile,
    dt: DType,
    ws: &[LinearWeight],
) -> Result<(Tensor, Vec<Tensor>)> {
    let wqs = ws
        .iter()
        .map(LinearWeight::fp8_values)
        .collect::<Result<Vec<_>>>()?;
    super::projection::cols_backward_each(dout, &wqs, |d, wq| {
        let dx = fp8_round(d, ROW_BLOCK)?.matmul(&wq.t()?)?;
        let dw = xc
            .t()?
            .matmul(&fp8_round(d, dout_cols_tile(tile, d.dim(0)?))?)?;
        Ok((dx.to_dtype(dt)?, dw.to_dtype(dt)?))
    })
}

#[cfg(feature = "cuda")]
pub mod cuda;
mod producers;

pub(crate) use producers::{
    gelu_linear_backward_of, layernorm_linear_forward_saving_of, layernorm_mlp_forward_of,
    rmsnorm_cols_forward_saving_of, swiglu_down_forward_of, swiglu_mlp_backward_of,
};
