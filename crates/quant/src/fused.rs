//! qgZ's fused kernels (docs/design.md section 3). They share the per-block arithmetic of
//! `block/`, so [`quantize_int4_swizzled`] is bitwise `quantize_int4` of the swizzled input
//! and [`dequantize_sum_requantize_int4`] bitwise `quantize_int4` of [`dequantize_sum_int4`].
//!
//! - [`quantize_int4_swizzled`]: before hop 1, quantise the full gradient [W * S] with its
//!   slices swizzled, without a swizzled f32 copy.
//! - [`dequantize_sum_int4`]: after hop 2, the fp32 sum of the N received pieces (the caller
//!   divides by W).
//! - [`dequantize_sum_requantize_int4`]: between the hops, the D received pieces summed and
//!   requantised, one block at a time (a block-sized scratch, no full f32 intermediate).
//!
//! Pieces are summed elementwise in piece order with fused multiply-adds, in a per-block
//! *scale domain* ([`block::int4_sum_block`] states the rule): a nibble decodes exactly to the
//! subnormal (q + 8) 2^(p - 149) (p = 4 (i % 4), its bit position in the GPU decode), each
//! piece's scale is moved by the same power of two 2^k (k from the block's largest scale
//! exponent), the bias 8 sum_j s_j is taken out by the first piece's fma, and each further piece
//! is one fma (one rounding); the domain value v at position p is the true sum times
//! 2^-(149 - k - p). The f32 sum is fl(v 2^(149 - k - p)), one rounding. So the sum is *not*
//! the composition `dequantize_int4(p0) + dequantize_int4(p1) + ...`; it is within
//! 31 P 2^-24 sum_j |s_j| of the exact sum (P pieces) plus the last rounding, far below an INT4
//! step (a whole scale). The GPU kernels do the same operations (one mask and one fma a piece
//! and value, no per-piece subtraction).
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
/// straddles two slices). A block holding an inf or NaN gets a NaN scale and codes 0.
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
            *sc = block::int4_block(xc, pc);
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

/// Block `b` of the sum of the pieces into `acc` (that block's length), in the block's scale
/// domain ([`block::int4_sum_block`]); returns the domain's shift k.
#[inline]
fn sum_block(pieces: &[(&[u8], &[f32])], b: usize, block: usize, acc: &mut [f32]) -> i32 {
    block::int4_sum_block(pieces, b, b * block / 2, acc)
}

/// The domain values `v` of a block with shift `k` as true values: fl(v 2^(149 - k - p)) for
/// the position p of each element ([`block::mul_pow2`], one rounding).
#[inline]
fn to_true(v: &[f32], k: i32, out: &mut [f32]) {
    for (i, (o, &x)) in out.iter_mut().zip(v).enumerate() {
        *o = block::mul_pow2(x, block::true_shift(k, block::nibble_pos(i)));
    }
}

/// Dequantise each INT4 piece (packed [P], scales [ceil(2P / block)], all pieces the same
/// shape) and return their f32 sum [2P]: each block summed in its scale domain
/// ([`block::int4_sum_block`]), then each value v at position p rounded once to
/// fl(v 2^(149 - k - p)) (module doc). No pieces: an empty sum.
///
/// Errors: `ZeroBlock`, `OddBlock`, `BadLength` if the pieces' shapes differ or disagree with
/// `block`.
pub fn dequantize_sum_int4(
    pieces: &[(&[u8], &[f32])],
    block: usize,
) -> Result<Vec<f32>, QuantError> {
    let n = check_pieces(pieces, block)?;
    let mut out = vec![0f32; n];
    let mut scratch = vec![0f32; block.min(n)];
    for (b, o) in out.chunks_mut(block).enumerate() {
        let acc = &mut scratch[..o.len()];
        let k = sum_block(pieces, b, block, acc);
        to_true(acc, k, o);
    }
    Ok(out)
}

/// The pieces' sum requantised, one block at a time: scale and absmax are those of
/// `quantize_int4` of [`dequantize_sum_int4`]'s block (the true values t), and so are the codes
/// except on the fast path's subnormal exception below.
///
/// Codes (module doc of `block/mod.rs` for scale and r = fl(1 / scale)): where r is finite, let
/// r_0 = fl(r 2^(149 - k)) ([`block::mul_pow2`]) and r_12 = fl(r_0 2^-12). If r_0 is finite and
/// r_12 > 2^-126 (so r_p = r_0 2^-p = r 2^(149 - k - p) is exact for every position p), the code
/// of domain value v at position p is the integer nearest v r_p, ties to even (one fma on the
/// GPU): exactly the integer nearest (v 2^(149 - k - p)) r. Otherwise the block takes
/// `quantize_int4`'s rules on the true values t (code_mul with r, or the division rule where r
/// overflows; zeros where the scale is 0).
///
/// So this equals `quantize_int4(&dequantize_sum_int4(pieces, block)?, block)` bitwise wherever
/// every true value is exact, fl(v 2^(149 - k - p)) = v 2^(149 - k - p): the exception is a block
/// whose sum holds a subnormal value that rounded, and only where that changes a code (which
/// needs the block's absmax below about 2^-120: otherwise |t r| < 1/2 for every subnormal t).
///
/// A block whose sum holds an inf or NaN (a piece's NaN scale, or a sum that overflows) gets
/// a NaN scale and codes 0, as `quantize_int4` gives it, so it stays NaN through the next hop.
///
/// Errors: those of [`dequantize_sum_int4`].
pub fn dequantize_sum_requantize_int4(
    pieces: &[(&[u8], &[f32])],
    block: usize,
) -> Result<(Vec<u8>, Vec<f32>), QuantError> {
    let n = check_pieces(pieces, block)?;
    let mut packed = vec![0u8; n / 2];
    let mut scales = Vec::with_capacity(n.div_ceil(block));
    let mut scratch = vec![0f32; block.min(n)];
    let mut tv = vec![0f32; block.min(n)];
    for (b, pc) in packed.chunks_mut(block / 2).enumerate() {
        let acc = &mut scratch[..2 * pc.len()];
        let t = &mut tv[..2 * pc.len()];
        let k = sum_block(pieces, b, block, acc);
        to_true(acc, k, t);
        let m = block::absmax_bits(t);
        if m >= block::NON_FINITE {
            pc.fill(0);
            scales.push(block::NAN_SCALE);
            continue;
        }
        let scale = block::scale_of(m, 7.0);
        let r = 1.0 / scale;
        let r0 = block::mul_pow2(r, block::true_shift(k, 0));
        let r12 = r0 * block::pow2(-12);
        if scale != 0.0 && r.is_finite() && r0.is_finite() && r12.to_bits() > 0x0080_0000 {
            let rp = [
                r0 as f64,
                (r0 * block::pow2(-4)) as f64,
                (r0 * block::pow2(-8)) as f64,
                r12 as f64,
            ];
            for (i, (o, v)) in pc.iter_mut().zip(acc.chunks_exact(2)).enumerate() {
                let p = 2 * (i % 2);
                *o = block::pack(
                    block::code_mul(v[0], rp[p]),
                    block::code_mul(v[1], rp[p + 1]),
                );
            }
            scales.push(scale);
        } else {
            let s = block::int4_block(t, pc);
            debug_assert_eq!(s.to_bits(), scale.to_bits());
            scales.push(s);
        }
    }
    Ok((packed, scales))
}
