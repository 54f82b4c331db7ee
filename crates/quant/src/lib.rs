//! Block-wise symmetric quantisation for ZeRO++'s quantised collectives.
//!
//! One fp32 scale per block of `block` elements: scale = absmax / qmax, q = round(x / scale)
//! clamped to [-qmax, qmax]. INT8 (qmax 127) carries weights for qwZ; INT4 (qmax 7, two values
//! a byte) carries gradients for qgZ. This module holds the CPU reference; the swizzled and
//! fused kernels of qgZ come with ZeRO++ (DESIGN.md section 3).

/// Errors of a quantiser.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// A non-finite input would be silently turned into finite numbers; refuse it.
    #[error("non-finite value {value} at element {index}")]
    NonFinite { index: usize, value: f32 },
    /// Block size zero.
    #[error("block size must be positive")]
    ZeroBlock,
}

/// Symmetric INT8 block quantisation of `x`: returns (codes, one scale per block).
///
/// Each element's reconstruction error is at most half its block's scale.
///
/// ```
/// let (q, s) = quant::quantize_int8(&[1.0, -0.5, 0.25, 0.0], 2).unwrap();
/// assert_eq!(q, vec![127, -64, 127, 0]);
/// assert_eq!(s, vec![1.0 / 127.0, 0.25 / 127.0]);
/// ```
pub fn quantize_int8(x: &[f32], block: usize) -> Result<(Vec<i8>, Vec<f32>), QuantError> {
    if block == 0 {
        return Err(QuantError::ZeroBlock);
    }
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len().div_ceil(block));
    for (b, chunk) in x.chunks(block).enumerate() {
        let mut absmax = 0f32;
        for (i, &v) in chunk.iter().enumerate() {
            if !v.is_finite() {
                return Err(QuantError::NonFinite {
                    index: b * block + i,
                    value: v,
                });
            }
            absmax = absmax.max(v.abs());
        }
        let scale = absmax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        codes.extend(
            chunk
                .iter()
                .map(|&v| (v * inv).round().clamp(-127.0, 127.0) as i8),
        );
        scales.push(scale);
    }
    Ok((codes, scales))
}

/// Inverse of [`quantize_int8`].
pub fn dequantize_int8(codes: &[i8], scales: &[f32], block: usize) -> Vec<f32> {
    codes
        .iter()
        .enumerate()
        .map(|(i, &q)| q as f32 * scales[i / block])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let (q, s) = quantize_int8(&x, 64).unwrap();
        let y = dequantize_int8(&q, &s, 64);
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            assert!(
                (a - b).abs() <= 0.5 * s[i / 64] * (1.0 + 1e-6),
                "element {i}"
            );
        }
    }

    #[test]
    fn zero_block_is_exact_and_nan_is_refused() {
        let (q, s) = quantize_int8(&[0.0; 8], 4).unwrap();
        assert_eq!(dequantize_int8(&q, &s, 4), vec![0.0; 8]);
        assert!(matches!(
            quantize_int8(&[1.0, f32::NAN], 4),
            Err(QuantError::NonFinite { index: 1, .. })
        ));
    }
}
