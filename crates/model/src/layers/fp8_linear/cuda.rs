//! The FP8 linear layers on the GPU: the quantisers of `kernels/cuda/fp8.cu` and
//! cuBLASLt's block-scaled FP8 GEMMs (`crate::gemm`), in cuBLAS's column-major terms (a
//! row-major `(R, S)` matrix is column-major `(S, R)` with leading dimension `S`):
//! - forward `y^T (OUT, N) = w^T x^T`: A = w's transposed codes `(OUT, IN)` row-major
//!   (tiles, K = IN), B = x's codes `(N, IN)` (1 x 128 blocks), D = y `(N, OUT)`;
//! - input gradient `dx^T (IN, N)`: A = w's codes `(IN, OUT)` (tiles, K = OUT), B = dout's
//!   codes `(N, OUT)` (1 x 128);
//! - weight gradient `dw^T (OUT, IN)`, i.e. `dw (IN, OUT)` row-major: A = dout^T's codes
//!   `(OUT, N)` in 128 x 1 blocks of dout, B = x^T's codes `(IN, N)` in 128 x 128 tiles (K =
//!   N), or both with one scale a whole column (the down projection's).
//!
//! Everything is queued on the tensors' stream; the codes live until the GEMMs that read
//! them have been queued (stream order keeps them valid until those have run).
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::cuda_backend::CudaDevice;
use candle_core::{DType, Tensor};
use kernels::launch::{Kernel, Module};

use super::GPU_MULTIPLE;
use crate::error::Result;
/// How an operand's scales cover it (cuBLASLt's scale modes).
pub use crate::gemm::ScaleMode;
use crate::gemm::{self, BlockScales, Epilogue, Gemm};
use crate::gpu;
use crate::linears::LinearWeight;

mod activations;
pub mod fused;
mod weights;

pub use activations::{
    column_absmax, quantize_both, quantize_cols_t, quantize_cols_whole, quantize_input,
    quantize_input_cols, quantize_rows, quantize_whole_both,
};
use activations::{quantize_view_summing, Columns};
use weights::weight_operands;
pub use weights::{
    gathered_transposed, quantize_for_both_passes, quantize_weight, quantize_weights,
};

/// One CTA's threads in every quantiser (fp8.cu's launch bounds).
const THREADS: usize = 256;
/// The K-block and tile side of the scales.
const BLOCK: usize = 128;

/// The grid of fp8.cu's tile kernels: a CTA of [`THREADS`] a 128 x 128 tile, `x` tiles along
/// the columns by `y` along the rows.
fn tile_grid(x: usize, y: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

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
#[derive(Clone, Debug)]
pub struct Operand {
    pub codes: Tensor,
    pub scales: Tensor,
    pub mode: ScaleMode,
}

/// The dims of the f32 scales of `x^T`'s codes for `x (rows, cols)` scaled in `mode`, as
/// fp8.cu's quantisers write them: 128 x 1 blocks of `x` `[ceil(rows / 128)][cols]` (VEC128),
/// 128 x 128 tiles `[ceil(cols / 128)][round_up(ceil(rows / 128), 4)]` (BLK128x128 with its
/// padding), or one a whole column `[cols]` (OUTER_VEC).
fn transpose_scales(mode: ScaleMode, rows: usize, cols: usize) -> Vec<usize> {
    match mode {
        ScaleMode::Vec128 => vec![rows.div_ceil(BLOCK), cols],
        ScaleMode::Blk128x128 => vec![
            cols.div_ceil(BLOCK),
            rows.div_ceil(BLOCK).next_multiple_of(4),
        ],
        ScaleMode::Outer => vec![cols],
    }
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
    let dims = x.dims2().ok()?;
    takes(x).then(|| packed_fits(dims, ws, other)).flatten()
}

/// [`packed_shape`] for an input known by its dims `(N, IN)` (one the forward quantised).
fn packed_fits(
    (n, inp): (usize, usize),
    ws: &[LinearWeight],
    other: Option<&Tensor>,
) -> Option<(usize, usize, usize)> {
    let total: usize = ws.iter().map(out_of).sum();
    let fits = !ws.is_empty()
        && ws.iter().all(|w| takes_weight(w, inp))
        && other.is_none_or(|o| takes(o) && o.dims() == [n, total]);
    fits.then_some((n, inp, total))
}

/// `t` contiguous from a 16-byte aligned address, as cuBLASLt reads an operand and its
/// scales: a view into a gathered unit (FP8 qwZ's codes and tile scales) can start anywhere,
/// and is copied (bit for bit, into a fresh allocation) where it does not start on 16 bytes.
pub(super) fn aligned(t: Tensor) -> Result<Tensor> {
    let t = t.contiguous()?;
    match gpu::ptr(&t)? % 16 {
        0 => Ok(t),
        _ => Ok(t.force_contiguous()?),
    }
}

/// `D (m, n) = A^T B (+ bias) (+ C)` in cuBLAS terms with A stored `(m, k)` and B `(n, k)`,
/// both K-contiguous FP8 operands: D bf16 at `d` with leading dimension `ldd`, C (when given)
/// likewise, `bias` (when given) `m` bf16 added to every column of D in the epilogue, before
/// D's one rounding.
pub fn gemm_tn(
    dev: &CudaDevice,
    a: &Operand,
    b: &Operand,
    (m, n, k): (usize, usize, usize),
    d: u64,
    ldd: usize,
    c: Option<u64>,
) -> Result<()> {
    gemm_tn_bias(dev, a, b, (m, n, k), (d, ldd), c, None)
}

/// [`gemm_tn`] with a bias in the epilogue where `bias` is given.
fn gemm_tn_bias(
    dev: &CudaDevice,
    a: &Operand,
    b: &Operand,
    (m, n, k): (usize, usize, usize),
    (d, ldd): (u64, usize),
    c: Option<u64>,
    bias: Option<u64>,
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
            epilogue: bias.map_or(Epilogue::None, Epilogue::Bias),
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

/// `[x @ w_0 | x @ w_1 | ...] (+ bias) (+ residual)` in bf16 (the bias, `(sum OUT_i)`, added
/// in the GEMMs' epilogue), or `None` where the operands do not fit (then the caller's
/// reference refuses CUDA tensors in one line).
pub fn cols_forward(
    x: &Tensor,
    ws: &[LinearWeight],
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    Ok(forward(x, ws, bias, residual, false)?.map(|(y, _)| y))
}

/// [`cols_forward`], also quantising `x` in 128 x 128 tiles in the same read: the weight
/// gradient's operand ([`quantize_input_cols`]'s codes and scales), which the backward then
/// takes in place of `x` ([`cols_backward_from`]).
pub fn cols_forward_saving(
    x: &Tensor,
    ws: &[LinearWeight],
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Option<(Tensor, Operand)>> {
    Ok(forward(x, ws, bias, residual, true)?
        .map(|(y, xt)| (y, xt.expect("asked for x's column tiles"))))
}

fn forward(
    x: &Tensor,
    ws: &[LinearWeight],
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    saving: bool,
) -> Result<Option<(Tensor, Option<Operand>)>> {
    let Some((n, inp, total)) = packed_shape(x, ws, residual) else {
        return Ok(None);
    };
    let Some(bias) = epilogue_bias(bias, total)? else {
        return Ok(None);
    };
    let (xq, xt) = match saving {
        true => {
            let (xq, xt) = quantize_input(x)?;
            (xq, Some(xt))
        }
        false => (quantize_rows(x)?, None),
    };
    let y = forward_gemms(&xq, (n, inp, total), ws, bias.as_ref(), residual)?;
    Ok(Some((y, xt)))
}

/// [`cols_forward`] of an input given as its 1 x 128 blocks (`xq`, codes `(N, IN)`: quantised
/// where it was made, as `fused::quantize_swiglu` makes SwiGLU's output), or `None` where
/// the weights and the residual do not fit.
pub fn cols_forward_quantised(
    xq: &Operand,
    ws: &[LinearWeight],
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let (n, inp) = xq.codes.dims2()?;
    let Some(shape) = packed_fits((n, inp), ws, residual) else {
        return Ok(None);
    };
    let Some(bias) = epilogue_bias(bias, shape.2)? else {
        return Ok(None);
    };
    Ok(Some(forward_gemms(xq, shape, ws, bias.as_ref(), residual)?))
}

/// `bias` as the GEMMs' epilogue reads it, `(total)` bf16 contiguous (a view of a unit's flat
/// buffer already is: then the same tensor): `Some(None)` for no bias, `None` for a bias of
/// another length.
fn epilogue_bias(bias: Option<&Tensor>, total: usize) -> Result<Option<Option<Tensor>>> {
    Ok(match bias {
        None => Some(None),
        Some(b) if b.dims() != [total] => None,
        Some(b) => Some(Some(b.to_dtype(DType::BF16)?.contiguous()?)),
    })
}

/// The forward's GEMMs, one a weight into its columns of `y (N, total)`, each adding its
/// columns of `bias` in its epilogue.
fn forward_gemms(
    xq: &Operand,
    (n, inp, total): (usize, usize, usize),
    ws: &[LinearWeight],
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    let dev = gpu::device(&xq.codes)?;
    let y = gpu::uninit((n, total), DType::BF16, &dev)?;
    let (py, pr) = (gpu::ptr(&y)?, residual.map(gpu::ptr).transpose()?);
    let pb = bias.map(gpu::ptr).transpose()?;
    let mut off = 0u64;
    for (w, wq) in ws.iter().zip(weight_operands(ws, true)?) {
        let out = out_of(w);
        let shift = 2 * off;
        gemm_tn_bias(
            &dev,
            &wq,
            xq,
            (out, n, inp),
            (py + shift, total),
            pr.map(|p| p + shift),
            pb.map(|p| p + shift),
        )?;
        off += out as u64;
    }
    Ok(y)
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
    cols_backward_from(dout, &quantize_input_cols(x)?, (n, inp), ws, into)
}

/// `x`'s 128 x 128 tiles as [`cols_forward_saving`] keeps them, without the product; `None`
/// where `x` is no FP8 operand.
pub fn cols_of(x: &Tensor) -> Result<Option<Operand>> {
    match is_operand(x) {
        true => Ok(Some(quantize_input_cols(x)?)),
        false => Ok(None),
    }
}

/// Whether the quantisers take `x (R, S)` as an FP8 operand (bf16, contiguous, both sides
/// multiples of [`GPU_MULTIPLE`], within the kernels' int indices).
pub fn is_operand(x: &Tensor) -> bool {
    takes(x)
}

/// [`cols_backward`] from `x^T`'s codes as the forward kept them (`xt`, for an input `(N,
/// IN)`: 128 x 128 tiles, or whole columns): the same gradients, bit for bit.
pub fn cols_backward_from(
    dout: &Tensor,
    xt: &Operand,
    (n, inp): (usize, usize),
    ws: &[LinearWeight],
    into: &[Option<Tensor>],
) -> Result<Option<(Tensor, Vec<Tensor>)>> {
    if packed_fits((n, inp), ws, Some(dout)).is_none() || xt.codes.dims() != [inp, n] {
        return Ok(None);
    }
    // dout's columns as the weight gradient multiplies them with x's (dout_cols_mode).
    let douts = |off, out| match dout_cols_mode(xt.mode) {
        ScaleMode::Outer => quantize_whole_both(dout, off, out),
        _ => quantize_both(dout, off, out),
    };
    Ok(Some(backward_gemms(douts, xt, (n, inp), ws, into)?))
}

/// [`cols_backward_from`] of one weight with a bias: also the bias gradient (`dout`'s column
/// sums, each tile's in the read that quantises `dout`, then the tiles' in order:
/// deterministic), `(dx, dw, db)`; `None` where the operands do not fit.
pub fn cols_backward_from_with_bias(
    dout: &Tensor,
    xt: &Operand,
    (n, inp): (usize, usize),
    w: &LinearWeight,
    into: Option<Tensor>,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    let ws = std::slice::from_ref(w);
    let fits = packed_fits((n, inp), ws, Some(dout)).is_some()
        && xt.codes.dims() == [inp, n]
        && dout_cols_mode(xt.mode) == ScaleMode::Vec128;
    if !fits {
        return Ok(None);
    }
    let dev = gpu::device(dout)?;
    let out = out_of(w);
    let slices = n.div_ceil(BLOCK);
    let partials = gpu::uninit((slices, out), DType::F32, &dev)?;
    let douts = |off, out| match quantize_view_summing(
        dout,
        off,
        out,
        true,
        Columns::Blocks,
        Some(&partials),
    )? {
        (Some(rows), Some(cols)) => Ok((rows, cols)),
        _ => unreachable!("asked for both orientations"),
    };
    let (dx, mut dws) = backward_gemms(douts, xt, (n, inp), ws, &[into])?;
    let db = crate::layers::linear::bias_grad::column_partials_sum(&dev, &partials, slices, out)?;
    Ok(Some((dx, dws.pop().expect("one weight"), db)))
}

/// [`cols_backward_from`] with each weight's dout given in both blockings, `douts[i] =
/// (rows, cols)` as [`quantize_both`] makes them of `dout_i (N, OUT_i)` (quantised where they
/// were made, as `fused::quantize_swiglu_grad` makes SwiGLU's gradient), or `None` where the
/// shapes do not fit.
pub fn cols_backward_quantised(
    douts: &[(Operand, Operand)],
    xt: &Operand,
    (n, inp): (usize, usize),
    ws: &[LinearWeight],
    into: &[Option<Tensor>],
) -> Result<Option<(Tensor, Vec<Tensor>)>> {
    let fits = douts.len() == ws.len()
        && packed_fits((n, inp), ws, None).is_some()
        && xt.codes.dims() == [inp, n]
        && douts.iter().zip(ws).all(|((r, c), w)| {
            r.codes.dims() == [n, out_of(w)]
                && c.codes.dims() == [out_of(w), n]
                && c.mode == dout_cols_mode(xt.mode)
        });
    if !fits {
        return Ok(None);
    }
    let mut each = douts.iter();
    let douts = |_, _| Ok(each.next().expect("one dout a weight").clone());
    Ok(Some(backward_gemms(douts, xt, (n, inp), ws, into)?))
}

/// The backward's GEMMs: `dx = sum_i dout_i @ w_i^T` and each `dw_i = x^T @ dout_i` (into
/// `into[i]` where it is a bf16 `(IN, OUT_i)` slot), with `douts(off, out)` weight i's dout in
/// both blockings (its columns `off..off + out` of the packed dout).
fn backward_gemms(
    mut douts: impl FnMut(usize, usize) -> Result<(Operand, Operand)>,
    xt: &Operand,
    (n, inp): (usize, usize),
    ws: &[LinearWeight],
    into: &[Option<Tensor>],
) -> Result<(Tensor, Vec<Tensor>)> {
    let dev = gpu::device(&xt.codes)?;
    let dx = gpu::uninit((n, inp), DType::BF16, &dev)?;
    let pdx = gpu::ptr(&dx)?;
    let mut dws = Vec::with_capacity(ws.len());
    let mut off = 0;
    let wqs = weight_operands(ws, false)?;
    for (i, (w, wq)) in ws.iter().zip(wqs).enumerate() {
        let out = out_of(w);
        let (dq, dt) = douts(off, out)?;
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
        dws.push(weight_grad(&dt, xt, into.get(i).cloned().flatten())?);
        off += out;
    }
    Ok((dx, dws))
}

/// The scale mode of `dout^T`'s codes that a weight gradient multiplies with `x^T`'s in
/// `x_mode`: 128 x 1 blocks beside `x^T`'s 128 x 128 tiles (the pairing cuBLASLt runs at
/// 1.24-1.29x both in blocks, scripts/fp8bench/gemm_modes.cu; a gradient in tiles diverged in
/// DeepSeek-V3's trials, so the tiles go to the input), whole columns beside whole columns
/// (cuBLASLt takes OUTER_VEC only on both sides).
pub fn dout_cols_mode(x_mode: ScaleMode) -> ScaleMode {
    match x_mode {
        ScaleMode::Outer => ScaleMode::Outer,
        ScaleMode::Blk128x128 | ScaleMode::Vec128 => ScaleMode::Vec128,
    }
}

/// The weight gradient `dw = x^T @ dout (IN, OUT)` from the codes of `dout^T` (`dt`, `(OUT,
/// N)`) and of `x^T` (`xt`, `(IN, N)`), in modes cuBLASLt multiplies together
/// ([`dout_cols_mode`]), into `into` where it is a bf16 `(IN, OUT)` slot (a fresh tensor
/// otherwise).
pub fn weight_grad(dt: &Operand, xt: &Operand, into: Option<Tensor>) -> Result<Tensor> {
    let ((out, n), (inp, _)) = (dt.codes.dims2()?, xt.codes.dims2()?);
    let dev = gpu::device(&xt.codes)?;
    let dw = match into {
        Some(v) if v.dtype() == DType::BF16 && v.is_contiguous() && v.dims() == [inp, out] => v,
        _ => gpu::uninit((inp, out), DType::BF16, &dev)?,
    };
    // dw^T (OUT, IN) column-major is dw (IN, OUT) row-major.
    gemm_tn(&dev, dt, xt, (out, inp, n), gpu::ptr(&dw)?, out, None)?;
    Ok(dw)
}

/// The input gradient `dx = dout @ w^T (N, IN)` of one weight `w (IN, OUT)`, and `dout^T`'s
/// codes with one scale a whole column, for a weight gradient whose other operand is scaled so
/// ([`weight_grad`]); `None` where the operands do not fit.
pub fn input_grad_whole(
    dout: &Tensor,
    w: &LinearWeight,
    inp: usize,
) -> Result<Option<(Tensor, Operand)>> {
    let n = dout.dim(0)?;
    let ws = std::slice::from_ref(w);
    if packed_fits((n, inp), ws, Some(dout)).is_none() {
        return Ok(None);
    }
    let dev = gpu::device(dout)?;
    let (dq, dt) = quantize_whole_both(dout, 0, out_of(w))?;
    let dx = gpu::uninit((n, inp), DType::BF16, &dev)?;
    let wq = weight_operands(ws, false)?.pop().expect("one weight");
    gemm_tn(
        &dev,
        &wq,
        &dq,
        (inp, n, out_of(w)),
        gpu::ptr(&dx)?,
        inp,
        None,
    )?;
    Ok(Some((dx, dt)))
}
