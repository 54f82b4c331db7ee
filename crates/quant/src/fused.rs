//! qgZ's fused kernels (DESIGN.md section 3). They share the per-block arithmetic of
//! `block.rs`, so [`quantize_int4_swizzled`] is bitwise `quantize_int4` of the swizzled input
//! and [`dequantize_sum_requantize_int4`] bitwise `quantize_int4` of [`dequantize_sum_int4`].
//!
//! - [`quantize_int4_swizzled`]: before hop 1, quantise the full gradient [W * S] with its
//!   slices swizzled, without a swizzled f32 copy.
//! - [`dequantize_sum_int4`]: after hop 2, the fp32 sum of the N received pieces (the caller
//!   divides by W).
//! - [`dequantize_sum_requantize_int4`]: between the hops, the D received pieces summed and
//!   requantised, one block at a time (a block-sized scratch, no full f32 intermediate).
//!
//! Pieces are summed elementwise in piece order with fused multiply-adds: with q_j the code and
//! s_j the block scale of piece j, acc = fl(q_0 * s_0), then acc = fma(q_j, s_j, acc), one
//! rounding a piece (each product q_j * s_j enters its sum exact). So the sum is *not* the
//! composition `dequantize_int4(p0) + dequantize_int4(p1) + ...`, which rounds every product
//! as well as every sum; the two agree for one piece, and wherever the products are exact
//! in f32. The GPU kernels use the same fma chain (one instruction a piece and value).
//!
//! ```
//! let a = quant::quantize_int4(&[1.0, 2.0, 3.0, 7.0], 4).unwrap();
//! let b = quant::quantize_int4(&[7.0, 0.0, -7.0, 0.0], 4).unwrap();
//! let pieces = [(&a.0[..], &a.1[..]), (&b.0[..], &b.1[..])];
//! assert_eq!(quant::dequantize_sum_int4(&pieces, 4).unwrap(), vec![8.0, 2.0, -4.0, 7.0]);
//! ```

use crate::block;
use crate::int4::check_int4_block;
use crate::swizzle::swizzled_pos;
use crate::QuantError;

/// The checks of [`quantize_int4_swizzled`] on an input of `len` elements (the GPU path makes
/// them too); returns the slice length S.
pub(crate) fn check_swizzle(
    len: usize,
    nodes: usize,
    ranks_per_node: usize,
    block: usize,
) -> Result<usize, QuantError> {
    check_int4_block(block)?;
    let w = nodes * ranks_per_node;
    if w == 0 {
        return Err(QuantError::BadLength {
            what: "world size nodes * ranks_per_node",
            got: 0,
            expected: 1,
        });
    }
    if !len.is_multiple_of(w) {
        return Err(QuantError::BadLength {
            what: "input length (a multiple of the world size)",
            got: len,
            expected: len.next_multiple_of(w),
        });
    }
    let s = len / w;
    if !s.is_multiple_of(block) {
        return Err(QuantError::BadLength {
            what: "slice length (a multiple of the block)",
            got: s,
            expected: s.next_multiple_of(block),
        });
    }
    Ok(s)
}

/// Equals `quantize_int4(&swizzle(x, nodes, ranks_per_node), block)` bitwise, in one pass.
///
/// x: [W * S], W = nodes * ranks_per_node. Errors: `ZeroBlock`, `OddBlock`; `BadLength` if
/// W is 0, x.len() is not a multiple of W, or S is not a multiple of `block` (so no block
/// straddles two slices); `NonFinite` with the first inf/NaN *in x's own order* (not the
/// swizzled one).
pub fn quantize_int4_swizzled(
    x: &[f32],
    nodes: usize,
    ranks_per_node: usize,
    block: usize,
) -> Result<(Vec<u8>, Vec<f32>), QuantError> {
    let s = check_swizzle(x.len(), nodes, ranks_per_node, block)?;
    let mut packed = vec![0u8; x.len() / 2];
    let mut scales = vec![0f32; x.len() / block];
    if s == 0 {
        return Ok((packed, scales));
    }
    let blocks_per_slice = s / block;
    for (p, src) in x.chunks_exact(s).enumerate() {
        let q = swizzled_pos(p, nodes, ranks_per_node);
        let dst = &mut packed[q * s / 2..(q + 1) * s / 2];
        let dst_scales = &mut scales[q * blocks_per_slice..(q + 1) * blocks_per_slice];
        for ((xc, pc), sc) in src
            .chunks_exact(block)
            .zip(dst.chunks_exact_mut(block / 2))
            .zip(dst_scales)
        {
            match block::int4_block(xc, pc) {
                Ok(v) => *sc = v,
                Err(_) => {
                    let index = block::first_non_finite(x).expect("a block saw a non-finite");
                    return Err(QuantError::NonFinite {
                        index,
                        value: x[index],
                    });
                }
            }
        }
    }
    Ok((packed, scales))
}

/// Validate the pieces; returns the element count L (= 2 * packed length of each piece).
fn check_pieces(pieces: &[(&[u8], &[f32])], block: usize) -> Result<usize, QuantError> {
    check_int4_block(block)?;
    let Some(first) = pieces.first() else {
        return Ok(0);
    };
    let p = first.0.len();
    let nb = (2 * p).div_ceil(block);
    for (packed, scales) in pieces {
        if packed.len() != p {
            return Err(QuantError::BadLength {
                what: "piece packed length",
                got: packed.len(),
                expected: p,
            });
        }
        if scales.len() != nb {
            return Err(QuantError::BadLength {
                what: "piece scale count",
                got: scales.len(),
                expected: nb,
            });
        }
    }
    Ok(2 * p)
}

/// Block `b` of the sum of the pieces into `acc` (that block's length), in piece order: piece
/// 0 dequantised, then each further piece fused-multiply-added.
#[inline]
fn sum_block(pieces: &[(&[u8], &[f32])], b: usize, block: usize, acc: &mut [f32]) {
    let lo = b * block / 2;
    let hi = lo + acc.len() / 2;
    let (p0, s0) = pieces[0];
    block::int4_deq_block(&p0[lo..hi], s0[b], acc);
    for &(p, s) in &pieces[1..] {
        block::int4_deq_fma_block(&p[lo..hi], s[b], acc);
    }
}

/// Dequantise each INT4 piece (packed [P], scales [ceil(2P / block)], all pieces the same
/// shape) and return their f32 sum [2P], in piece order with one fused multiply-add a piece
/// after the first (module doc). No pieces: an empty sum.
///
/// Errors: `ZeroBlock`, `OddBlock`, `BadLength` if the pieces' shapes differ or disagree with
/// `block`.
pub fn dequantize_sum_int4(
    pieces: &[(&[u8], &[f32])],
    block: usize,
) -> Result<Vec<f32>, QuantError> {
    let n = check_pieces(pieces, block)?;
    let mut out = vec![0f32; n];
    for (b, acc) in out.chunks_mut(block).enumerate() {
        sum_block(pieces, b, block, acc);
    }
    Ok(out)
}

/// Equals `quantize_int4(&dequantize_sum_int4(pieces, block)?, block)` bitwise, one block at a
/// time. Errors: those of [`dequantize_sum_int4`], and `NonFinite` (index into the sum) if a
/// sum overflows or a scale is non-finite.
pub fn dequantize_sum_requantize_int4(
    pieces: &[(&[u8], &[f32])],
    block: usize,
) -> Result<(Vec<u8>, Vec<f32>), QuantError> {
    let n = check_pieces(pieces, block)?;
    let mut packed = vec![0u8; n / 2];
    let mut scales = Vec::with_capacity(n.div_ceil(block));
    let mut scratch = vec![0f32; block.min(n)];
    for (b, pc) in packed.chunks_mut(block / 2).enumerate() {
        let acc = &mut scratch[..2 * pc.len()];
        sum_block(pieces, b, block, acc);
        match block::int4_block(acc, pc) {
            Ok(s) => scales.push(s),
            Err(i) => {
                return Err(QuantError::NonFinite {
                    index: b * block + i,
                    value: acc[i],
                })
            }
        }
    }
    Ok((packed, scales))
}
