//! Symmetric block-wise INT4 (qgZ's gradients, docs/design.md section 3).
//!
//! x: [L] f32, L even, blocks of `block` elements, `block` even (the last block may be
//! shorter, and is even too). Per block one f32 scale = absmax / 7 (one ulp lower where 7 *
//! scale would overflow); codes q = the integer nearest x * fl(1 / scale) (exact product, ties
//! to even), in [-7, 7] with ±absmax at ±7 (a subnormal scale whose reciprocal overflows:
//! round(x / scale) clamped, half away from zero; see block/mod.rs); all-zero block: scale 0,
//! codes 0; a block holding an inf or NaN: scale NaN, codes 0 (it dequantises to NaN). Two
//! codes a byte, [L / 2] u8: element 2i in the low nibble, element 2i+1
//! in the high nibble, each as 4-bit two's complement. Dequantised: q * scale.
//!
//! ```
//! // Block [1, -1, 7, -7]: absmax 7, scale 1, codes 1, -1, 7, -7.
//! let (p, s) = quant::quantize_int4(&[1.0, -1.0, 7.0, -7.0], 4).unwrap();
//! assert_eq!(s, vec![1.0]);
//! assert_eq!(p, vec![0xF1, 0x97]); // lo 1 = 0x1, hi -1 = 0xF; lo 7 = 0x7, hi -7 = 0x9
//! assert_eq!(quant::dequantize_int4(&p, &s, 4), vec![1.0, -1.0, 7.0, -7.0]);
//! ```

use crate::block;
use crate::QuantError;

/// Checks shared by the INT4 quantisers: `block` nonzero and even.
pub(crate) fn check_int4_block(block: usize) -> Result<(), QuantError> {
    if block == 0 {
        return Err(QuantError::ZeroBlock);
    }
    if !block.is_multiple_of(2) {
        return Err(QuantError::OddBlock);
    }
    Ok(())
}

/// Symmetric INT4 block quantisation of `x`: returns (packed [L / 2], scales [ceil(L / block)]).
///
/// Errors: `ZeroBlock`, `OddBlock`, `BadLength` if L is odd. Each element's reconstruction
/// error is at most [`int4_bound`] of its block's scale; a block holding an inf or NaN gets a
/// NaN scale (block/mod.rs), so it dequantises to NaN and the other blocks are unaffected.
pub fn quantize_int4(x: &[f32], block: usize) -> Result<(Vec<u8>, Vec<f32>), QuantError> {
    check_int4_block(block)?;
    if !x.len().is_multiple_of(2) {
        return Err(QuantError::BadLength {
            what: "INT4 input length (must be even)",
            got: x.len(),
            expected: x.len() + 1,
        });
    }
    let mut packed = vec![0u8; x.len() / 2];
    let scales = block::quantize_blocks(x, block, &mut packed, block / 2, block::int4_block);
    Ok((packed, scales))
}

/// Inverse of [`quantize_int4`]: packed [P], scales [ceil(2P / block)] -> [2P] f32.
///
/// Panics if `block` is 0 or odd, or `scales` has the wrong length.
pub fn dequantize_int4(packed: &[u8], scales: &[f32], block: usize) -> Vec<f32> {
    assert!(
        block > 0 && block.is_multiple_of(2),
        "INT4 block size must be positive and even"
    );
    let n = packed.len() * 2;
    assert_eq!(scales.len(), n.div_ceil(block), "one scale per block");
    let mut out = vec![0f32; n];
    for ((oc, pc), &s) in out
        .chunks_mut(block)
        .zip(packed.chunks(block / 2))
        .zip(scales)
    {
        block::int4_deq_block(pc, s, oc);
    }
    out
}

/// Largest |x - dequantize_int4(quantize_int4(x))| of an element whose block has `scale`:
/// half a step (scale / 2), plus the f32 rounding of the reciprocal and the product and, in the
/// near-f32::MAX case, the one-ulp-lower scale: 16 ε · scale in all (ε = f32::EPSILON; without
/// that case about (7 + 1) ε); plus 8 subnormal units for subnormal scales.
pub fn int4_bound(scale: f32) -> f32 {
    scale * (0.5 + 16.0 * f32::EPSILON) + 8.0 * f32::from_bits(1)
}
