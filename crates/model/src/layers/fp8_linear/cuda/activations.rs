//! An activation's or a gradient's FP8 codes as the GEMMs read them (`fp8_quantize_act`): its
//! 1 x 128 row blocks (the forward's and the input gradient's operand) and the codes of its
//! transpose for a weight gradient, in 128 x 1 blocks (dout), 128 x 128 tiles (a layer's
//! input) or whole columns (the down projection's), from one read of the bf16 matrix or of a
//! view of its columns.
use candle_core::{DType, Tensor};
use kernels::profile::Family;

use super::{kernel, tile_grid, transpose_scales, Operand, ScaleMode, BLOCK};
use crate::error::Result;
use crate::gpu;

/// What `fp8_quantize_act` makes of a matrix's columns, beside its row blocks.
#[derive(Clone, Copy)]
pub(super) enum Columns<'a> {
    /// Nothing.
    None,
    /// The codes of the transpose in 128 x 1 blocks of the matrix (VEC128): a weight
    /// gradient's dout.
    Blocks,
    /// The codes of the transpose with one scale a 128 x 128 tile (BLK128x128): a weight
    /// gradient's input.
    Tiles,
    /// The codes of the transpose with one scale a whole column (OUTER_VEC), from the columns'
    /// absmax bits given (`(cols)` u32, as [`column_absmax`] reduces them).
    Whole(&'a Tensor),
    /// The columns' absmax bits alone, max'ed into this `(cols)` u32 tensor.
    Absmax(&'a Tensor),
}

/// The `cols` columns from `col` of the row-major bf16 `x (R, ld)`, read once and quantised
/// (`fp8_quantize_act`) in 1 x 128 blocks along the columns where `rows_blocks` (codes
/// `(R, cols)`, scales `[ceil(cols / 128)][R]`) and as `columns` says: the codes of the
/// transpose, `(cols, R)`, with scales `[ceil(R / 128)][cols]` (128 x 1 blocks), `[ceil(cols /
/// 128)][round_up(ceil(R / 128), 4)]` (128 x 128 tiles) or `[cols]` (whole columns).
fn quantize_view(
    x: &Tensor,
    col: usize,
    cols: usize,
    rows_blocks: bool,
    columns: Columns,
) -> Result<(Option<Operand>, Option<Operand>)> {
    quantize_view_summing(x, col, cols, rows_blocks, columns, None)
}

/// [`quantize_view`], also writing each 128-row tile's column sums of the view into `partials`
/// (`(ceil(R / 128), cols)` f32) where given: a layer's bias gradient in the read that quantises
/// its dout.
pub(super) fn quantize_view_summing(
    x: &Tensor,
    col: usize,
    cols: usize,
    rows_blocks: bool,
    columns: Columns,
    partials: Option<&Tensor>,
) -> Result<(Option<Operand>, Option<Operand>)> {
    let dev = gpu::device(x)?;
    let (rows, ld) = x.dims2()?;
    // The kernel loads 16 bytes at a time: a view that does not start on 16 bytes (a storage
    // offset, rare) is copied first.
    if !(gpu::ptr(x)? + 2 * col as u64).is_multiple_of(16)
        || !ld.is_multiple_of(8)
        || !cols.is_multiple_of(8)
    {
        let copy = x.narrow(1, col, cols)?.force_contiguous()?;
        if gpu::ptr(&copy)?.is_multiple_of(16) && cols.is_multiple_of(8) {
            return quantize_view_summing(&copy, 0, cols, rows_blocks, columns, partials);
        }
        return Err(crate::error::ModelError::Candle(candle_core::Error::Msg(
            format!("FP8: a ({rows}, {cols}) operand the quantiser cannot load in 16-byte vectors"),
        )));
    }
    let _span = kernels::profile::scope_cuda(&dev, Family::Quantisation);
    let fresh = |want: bool, codes: (usize, usize), scales: &[usize]| -> Result<_> {
        Ok(match want {
            true => Some((
                gpu::uninit(codes, DType::U8, &dev)?,
                gpu::uninit(scales, DType::F32, &dev)?,
            )),
            false => None,
        })
    };
    let row_out = fresh(rows_blocks, (rows, cols), &[cols.div_ceil(BLOCK), rows])?;
    let transpose = |mode| fresh(true, (cols, rows), &transpose_scales(mode, rows, cols));
    let (col_out, mode, reduce, given) = match columns {
        Columns::None => (None, ScaleMode::Vec128, 0, 0),
        Columns::Blocks => (transpose(ScaleMode::Vec128)?, ScaleMode::Vec128, 0, 0),
        Columns::Tiles => (
            transpose(ScaleMode::Blk128x128)?,
            ScaleMode::Blk128x128,
            0,
            0,
        ),
        Columns::Whole(absmax) => {
            assert_eq!(absmax.dims(), [cols], "a column's absmax each");
            let out = transpose(ScaleMode::Outer)?;
            (out, ScaleMode::Outer, 0, gpu::ptr(absmax)?)
        }
        Columns::Absmax(absmax) => {
            assert_eq!(absmax.dims(), [cols], "a column's absmax each");
            (None, ScaleMode::Vec128, gpu::ptr(absmax)?, 0)
        }
    };
    let address = |o: &Option<(Tensor, Tensor)>| -> Result<(u64, u64)> {
        Ok(match o {
            Some((c, s)) => (gpu::ptr(c)?, gpu::ptr(s)?),
            None => (0, 0),
        })
    };
    let ((pc, ps), (pt, pst)) = (address(&row_out)?, address(&col_out)?);
    let px = gpu::ptr(x)? + 2 * col as u64;
    let pp = match partials {
        Some(p) => {
            assert_eq!(
                p.dims(),
                [rows.div_ceil(BLOCK), cols],
                "a tile's column sums each"
            );
            gpu::ptr(p)?
        }
        None => 0,
    };
    let tiles = matches!(columns, Columns::Tiles) as i32;
    let cfg = tile_grid(cols.div_ceil(BLOCK), rows.div_ceil(BLOCK));
    let func = kernel(&dev, "fp8_quantize_act")?;
    // SAFETY: x addresses rows x ld bf16 (this view: cols from col, its first element and ld
    // on 16 bytes, as checked above); each output fresh and written once by the kernel, a
    // null one never touched (partials, where given, (ceil(rows / 128), cols) f32, and the
    // absmax `(cols)` u32, asserted above; the tiles' scales with their padding, which the
    // last tile row writes); arguments in kernel order.
    unsafe {
        func.launch(
            cfg,
            &[
                &px,
                &(ld as i64),
                &pc,
                &ps,
                &pt,
                &pst,
                &(rows as i32),
                &(cols as i32),
                &pp,
                &reduce,
                &given,
                &tiles,
            ],
        )?;
    }
    let operand = |o: Option<(Tensor, Tensor)>, mode| {
        o.map(|(codes, scales)| Operand {
            codes,
            scales,
            mode,
        })
    };
    Ok((operand(row_out, ScaleMode::Vec128), operand(col_out, mode)))
}

/// The absmax of each column of `x (R, S)` over all its rows: `(S)` u32, the f32 bits of
/// `|x|`'s largest (an inf or NaN above every finite value), which a whole column's FP8 scale
/// is made from ([`quantize_whole_both`], [`quantize_cols_whole`]). One read of `x`.
pub fn column_absmax(x: &Tensor) -> Result<Tensor> {
    view_absmax(x, 0, x.dim(1)?)
}

/// [`column_absmax`] of the `cols` columns from `col` of `x (R, ld)`.
fn view_absmax(x: &Tensor, col: usize, cols: usize) -> Result<Tensor> {
    let absmax = Tensor::zeros(cols, DType::U32, x.device())?;
    quantize_view(x, col, cols, false, Columns::Absmax(&absmax))?;
    Ok(absmax)
}

/// The `cols` columns from `col` of `x (R, ld)` in 1 x 128 blocks along them (as
/// [`quantize_both`]) and the transpose's codes `(cols, R)` with one scale a whole column
/// (`[cols]`, [`ScaleMode::Outer`]): the dout of a weight gradient scaled row-wise, read twice
/// (its columns' absmax, then the codes).
pub fn quantize_whole_both(x: &Tensor, col: usize, cols: usize) -> Result<(Operand, Operand)> {
    let absmax = view_absmax(x, col, cols)?;
    match quantize_view(x, col, cols, true, Columns::Whole(&absmax))? {
        (Some(rows), Some(cols)) => Ok((rows, cols)),
        _ => unreachable!("asked for both orientations"),
    }
}

/// `x^T`'s codes `(S, R)` of `x (R, S)` with one scale a whole column from its absmax bits
/// `absmax (S)` u32 ([`column_absmax`] of `x`, or reduced where `x` was made).
pub fn quantize_cols_whole(x: &Tensor, absmax: &Tensor) -> Result<Operand> {
    let (_, q) = quantize_view(x, 0, x.dim(1)?, false, Columns::Whole(absmax))?;
    Ok(q.expect("asked for the columns"))
}

/// `x (R, S)` in 1 x 128 blocks along S: codes `(R, S)`, scales `[ceil(S / 128)][R]`.
pub fn quantize_rows(x: &Tensor) -> Result<Operand> {
    let (q, _) = quantize_view(x, 0, x.dim(1)?, true, Columns::None)?;
    Ok(q.expect("asked for the row blocks"))
}

/// `x (R, S)` in 128 x 1 blocks: the codes of `x^T`, `(S, R)`, scales `[ceil(R / 128)][S]`.
pub fn quantize_cols_t(x: &Tensor) -> Result<Operand> {
    let (_, q) = quantize_view(x, 0, x.dim(1)?, false, Columns::Blocks)?;
    Ok(q.expect("asked for the column blocks"))
}

/// A linear layer's input `x (N, IN)` as its weight gradient reads it: the codes of `x^T`,
/// `(IN, N)`, one scale a 128 x 128 tile (`[ceil(IN / 128)][round_up(ceil(N / 128), 4)]`,
/// BLK128x128).
pub fn quantize_input_cols(x: &Tensor) -> Result<Operand> {
    let (_, q) = quantize_view(x, 0, x.dim(1)?, false, Columns::Tiles)?;
    Ok(q.expect("asked for the column tiles"))
}

/// A linear layer's input `x (N, IN)` in one read as both its GEMMs read it: 1 x 128 blocks
/// (the forward, as [`quantize_rows`]) and [`quantize_input_cols`]'s tiles (the weight
/// gradient).
pub fn quantize_input(x: &Tensor) -> Result<(Operand, Operand)> {
    match quantize_view(x, 0, x.dim(1)?, true, Columns::Tiles)? {
        (Some(rows), Some(cols)) => Ok((rows, cols)),
        _ => unreachable!("asked for both orientations"),
    }
}

/// The `cols` columns from `col` of `x (R, ld)` both ways in one read: [`quantize_rows`] and
/// [`quantize_cols_t`] of that view (the backward's dout, read by both of its GEMMs).
pub fn quantize_both(x: &Tensor, col: usize, cols: usize) -> Result<(Operand, Operand)> {
    match quantize_view(x, col, cols, true, Columns::Blocks)? {
        (Some(rows), Some(cols)) => Ok((rows, cols)),
        _ => unreachable!("asked for both orientations"),
    }
}
