//! Symmetric block-wise INT8 (qwZ's weights, docs/design.md section 3).
//!
//! x: [L] f32 is cut into blocks of `block` elements (the last may be shorter); each block gets
//! one f32 scale = absmax / 127 (one ulp lower where 127 * scale would overflow) and codes
//! q = the integer nearest x * fl(1 / scale) (exact product, ties to even), in [-127, 127]
//! with ±absmax at ±127 (a subnormal scale whose reciprocal overflows: round(x / scale)
//! clamped, half away from zero; see block/mod.rs). An all-zero block has scale 0 and codes 0;
//! a block holding an inf or NaN has scale NaN and codes 0. Dequantised: q * scale.
//!
//! ```
//! let (q, s) = quant::quantize_int8(&[1.0, -0.5, 0.25, 0.0], 2).unwrap();
//! assert_eq!(q, vec![127, -64, 127, 0]); // -0.5 * fl(1 / fl(1/127)) = -0.5 * 127: a tie, to even
//! assert_eq!(s, vec![1.0 / 127.0, 0.25 / 127.0]);
//! assert_eq!(quant::dequantize_int8(&q, &s, 2)[0], 1.0);
//! ```

use crate::block;
use crate::QuantError;

/// Symmetric INT8 block quantisation of `x`: returns (codes [L], scales [ceil(L / block)]).
///
/// Each element's reconstruction error is at most [`int8_bound`] of its block's scale; a block
/// holding an inf or NaN gets a NaN scale (block/mod.rs), so it dequantises to NaN and the
/// other blocks are unaffected. Errors: `ZeroBlock`.
pub fn quantize_int8(x: &[f32], block: usize) -> Result<(Vec<i8>, Vec<f32>), QuantError> {
    if block == 0 {
        return Err(QuantError::ZeroBlock);
    }
    let mut codes = vec![0i8; x.len()];
    let scales = block::quantize_blocks(x, block, &mut codes, block, block::int8_block);
    Ok((codes, scales))
}

/// Inverse of [`quantize_int8`]: codes [L], scales [ceil(L / block)] -> [L] f32.
///
/// Panics if `block` is 0 or `scales` has the wrong length.
pub fn dequantize_int8(codes: &[i8], scales: &[f32], block: usize) -> Vec<f32> {
    assert!(block > 0, "block size must be positive");
    assert_eq!(
        scales.len(),
        codes.len().div_ceil(block),
        "one scale per block"
    );
    let mut out = vec![0f32; codes.len()];
    for ((oc, qc), &s) in out.chunks_mut(block).zip(codes.chunks(block)).zip(scales) {
        for (o, &q) in oc.iter_mut().zip(qc) {
            *o = q as f32 * s;
        }
    }
    out
}

/// Largest |x - dequantize_int8(quantize_int8(x))| of an element whose block has `scale`:
/// half a step (scale / 2), plus the f32 rounding of the reciprocal and the product and, in the
/// near-f32::MAX case, the one-ulp-lower scale: 256 ε · scale in all (ε = f32::EPSILON; without
/// that case about (127 + 1) ε); plus 128 subnormal units for subnormal scales.
pub fn int8_bound(scale: f32) -> f32 {
    scale * (0.5 + 256.0 * f32::EPSILON) + 128.0 * f32::from_bits(1)
}
