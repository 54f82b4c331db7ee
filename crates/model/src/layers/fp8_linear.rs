//! FP8 linear layers (issue 40): `x @ w` with both operands in FP8 E4M3 and f32 scales a
//! block, the forward and the two backward GEMMs side by side. This is the reference of the
//! recipe; the CPU runs it as an emulation (each operand quantised and dequantised in f32, the
//! product in f32), which is what an FP8 GEMM with f32 accumulation computes up to the order of
//! its sums.
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

/// The scale block of weights: `128 x 128`.
pub const WEIGHT_TILE: Tile = Tile {
    rows: 128,
    cols: 128,
};
/// The scale block of a GEMM's left operand contracted along its rows: `1 x 128`.
pub const ROW_BLOCK: Tile = Tile { rows: 1, cols: 128 };
/// The scale block of an operand contracted along its columns (the weight gradient's): `128 x 1`.
pub const COL_BLOCK: Tile = Tile { rows: 128, cols: 1 };

/// `m (R, S)` quantised to FP8 with one scale a `tile` and dequantised: the values the FP8 GEMM
/// multiplies, as f32.
pub fn fp8_round(m: &Tensor, tile: Tile) -> Result<Tensor> {
    if m.device().is_cuda() {
        return Err(ModelError::Candle(candle_core::Error::Msg(
            "the FP8 linear layers have no GPU kernels yet (issue 40): FP8 runs on the CPU".into(),
        )));
    }
    let (r, s) = m.dims2()?;
    let v = m.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let quantised = quant::quantize_fp8_e4m3_tiles(&v, r, s, tile)
        .and_then(|(q, sc)| quant::dequantize_fp8_e4m3_tiles(&q, &sc, r, s, tile))
        .map_err(|e| ModelError::Candle(candle_core::Error::Msg(format!("FP8: {e}"))))?;
    Ok(Tensor::from_vec(quantised, (r, s), m.device())?)
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
    let dq = fp8_round(dout, ROW_BLOCK)?;
    let wq = fp8_round(w, WEIGHT_TILE)?;
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
    let mut y = fp8_matmul_forward(x, w)?;
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
    let dt = x.dtype();
    let (dx, dw) = fp8_matmul_backward(dout, x, w)?;
    let db = want_db
        .then(|| dout.to_dtype(DType::F32)?.sum(0)?.to_dtype(dt))
        .transpose()?;
    Ok((dx.to_dtype(dt)?, dw.to_dtype(dt)?, db))
}
