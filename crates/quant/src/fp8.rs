//! FP8 E4M3 with one f32 scale a block: the CPU reference of issue 40's FP8 compute and FP8 qwZ
//! (docs/zeropp.md, "FP8 E4M3"). Format: OCP 8-bit Floating Point Specification (OFP8) rev 1.0,
//! 2023, E4M3 (Micikevicius et al. 2022, "FP8 Formats for Deep Learning"), the variant torch
//! calls `float8_e4m3fn`.
//!
//! A code is 1 sign bit, 4 exponent bits (bias 7) and 3 mantissa bits, finite only: no inf;
//! S.1111.111 (0x7F, 0xFF) is NaN, so the largest value is S.1111.110 = 1.75 x 2^8 = 448.
//! Exponent field 0 holds the subnormals m x 2^-9 (m = 1..7), the smallest 2^-9.
//! [`e4m3_decode`] is exact (every code is an f32); [`e4m3_encode`] clamps to ±448, then rounds
//! to the nearest code, ties to even (the even mantissa), and keeps a NaN NaN (0x7F, with its
//! sign bit). Saturating is torchao's choice (`to_fp8_saturated` clamps before the cast) and
//! what Hopper's `cvt.rn.satfinite.e4m3x2.f32` does; torch 2.15's own cast saturates as well
//! (older torch gave NaN codes for values that round past 448), and clamping first makes all
//! of them agree.
//!
//! Blocks: x: [L] f32 in blocks of `block` (the last may be shorter). A block of absmax `a`
//! (finite) takes, with a' = max(a, 1e-12) (torchao's floor on amax, which keeps both numbers
//! finite and normal for an all-zero block):
//! - multiplier m = fl32(448 / a'): torchao's `amax_to_scale` bit for bit (it divides in f64 and
//!   rounds to f32; for a >= 1e-12 that is the f32 division 448 / a, since a quotient rounded
//!   to 53 bits and then to 24 is the quotient rounded to 24);
//! - codes e4m3_encode(fl32(x * m)): one f32 product, then the saturating encode, torchao's
//!   codes bit for bit (`to_fp8_saturated(x * scale)`), ±448 at ±a;
//! - stored scale s = fl32(a' / 448) (one ulp lower where 448 s would overflow, as INT8's),
//!   the dequantisation factor: value = fl32(decode(code) x s). This is the form FP8 GEMMs take
//!   (cuBLASLt's A/B scale, torch._scaled_mm's `scale_a`) and the 4 bytes a block INT8 qwZ
//!   sends. torchao keeps m instead and hands the GEMM fl32(1 / m), which can differ from s by
//!   one ulp; s is the correctly rounded a' / 448.
//!
//! m and s are computed from a' separately (each the quotient rounded to f32), so m s = 1 + d
//! with |d| < 2^-22. A block holding an inf or NaN gets scale NaN and codes 0, as
//! INT8's and INT4's do (block/mod.rs), so it dequantises to NaN and never into finite numbers
//! (torchao would give NaN codes, or zeros and NaNs for an inf). Zeros keep their sign: -0.0
//! has code 0x80 and dequantises to -0.0, so an all-zero block comes back bitwise.
//!
//! Error ([`fp8_e4m3_bound`]): half an ulp of the e4m3 grid at the scaled magnitude |x| m, that
//! is at most |x| / 16 where |x| m >= 2^-6 (e4m3 normals) and s / 1024 below (the subnormal step
//! 2^-9, halved), plus a few f32 roundings. Row-wise scaling of a row-major [R, C] matrix is
//! `block` = C; tensor-wise, `block` >= L.
//!
//! ```
//! use quant::{dequantize_fp8_e4m3, e4m3_decode, e4m3_encode, quantize_fp8_e4m3};
//! assert_eq!(e4m3_encode(448.0), 0x7E);
//! assert_eq!(e4m3_encode(1e6), 0x7E); // saturates
//! assert_eq!(e4m3_encode(f32::NAN), 0x7F);
//! assert_eq!(e4m3_encode(-0.0), 0x80);
//! assert_eq!(e4m3_encode(432.0), 0x7E); // a tie between 416 (0x7D) and 448: to even
//! assert_eq!(e4m3_decode(0x01), 2f32.powi(-9));
//! assert!(e4m3_decode(0xFF).is_nan());
//!
//! // Block [14, -7, 3.5, 0]: absmax 14, multiplier 32, scale 14 / 448 = 1 / 32.
//! let (q, s) = quantize_fp8_e4m3(&[14.0, -7.0, 3.5, 0.0], 4).unwrap();
//! assert_eq!(q, vec![0x7E, 0xF6, 0x6E, 0x00]); // 448, -224, 112, 0
//! assert_eq!(s, vec![0.03125]);
//! assert_eq!(dequantize_fp8_e4m3(&q, &s, 4), vec![14.0, -7.0, 3.5, 0.0]);
//! ```

use crate::block::{absmax_bits, quantize_blocks, scale_of, ABS, NAN_SCALE, NON_FINITE};
use crate::QuantError;

/// The largest finite E4M3 value, 1.75 x 2^8.
pub const E4M3_MAX: f32 = 448.0;

/// torchao's floor on a block's amax (`EPS` of torchao.float8.float8_utils), an f64.
const AMAX_MIN: f64 = 1e-12;

/// The multiplier and the scale of a block whose amax is below [`AMAX_MIN`] (zeros included):
/// those of amax = 1e-12, computed in f64 and rounded once to f32.
const MIN_MULTIPLIER: f32 = (448.0 / AMAX_MIN) as f32;
const MIN_SCALE: f32 = (AMAX_MIN / 448.0) as f32;

/// Bits of [`E4M3_MAX`] as an f32.
const MAX_BITS: u32 = 0x43e0_0000;
/// Bits of 2^-6, the smallest E4M3 normal, as an f32.
const MIN_NORMAL_BITS: u32 = 121 << 23;

/// The f32 of every code, built at compile time by [`decode_bits`].
static DECODE: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = f32::from_bits(decode_bits(c as u8));
        c += 1;
    }
    t
};

/// The f32 bits of an E4M3 code: sign to bit 31; a normal's exponent rebiased (7 -> 127) and its
/// 3 mantissa bits to the top of f32's 23; a subnormal m x 2^-9 normalised (its leading bit
/// becomes the implicit one); NaN (S.1111.111) as exponent 255 with the 3 mantissa bits kept,
/// 0x7FF00000 (torch's bits for it).
const fn decode_bits(c: u8) -> u32 {
    let sign = ((c & 0x80) as u32) << 24;
    let e = ((c >> 3) & 0xf) as u32;
    let m = (c & 7) as u32;
    if e == 0xf && m == 7 {
        return sign | 0x7f80_0000 | m << 20;
    }
    if e == 0 {
        if m == 0 {
            return sign;
        }
        // m x 2^-9 with m's leading bit at p (0..=2): 2^(p - 9) x (m / 2^p).
        let p = 31 - m.leading_zeros();
        return sign | (p + 127 - 9) << 23 | (m & !(1 << p)) << (23 - p);
    }
    sign | (e + 120) << 23 | m << 20
}

/// The f32 value of an E4M3 code (exact; 0x7F and 0xFF are NaN).
#[inline]
pub fn e4m3_decode(code: u8) -> f32 {
    DECODE[code as usize]
}

/// v / 2^s rounded to the nearest integer, ties to even, for s in 1..=31.
#[inline(always)]
fn shift_round_even(v: u32, s: u32) -> u32 {
    let (q, rem, half) = (v >> s, v & ((1 << s) - 1), 1 << (s - 1));
    q + (rem > half || (rem == half && q & 1 == 1)) as u32
}

/// The E4M3 code of `x`: clamped to ±448 (inf included), then rounded to the nearest code, ties
/// to even; NaN gives NaN (0x7F, or 0xFF with the sign bit); -0.0 gives 0x80, and so does a
/// negative value that rounds to zero. Equal to torch's `x.clamp(-448, 448).to(float8_e4m3fn)`
/// bit for bit (tests/fp8.rs, against every code and each tie).
#[inline]
pub fn e4m3_encode(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & ABS;
    if abs > NON_FINITE {
        return sign | 0x7f;
    }
    // Non-negative f32 bits order like the values, so this is the clamp to 448.
    let abs = abs.min(MAX_BITS);
    let code = if abs >= MIN_NORMAL_BITS {
        // Keep the exponent and the top 3 mantissa bits, rounding away the low 20 (a carry
        // moves into the exponent, as it should); rebias the exponent from 127 to 7. At most
        // 448 = 0x7E here, since |x| <= 448 is a code.
        shift_round_even(abs, 20) - (120 << 3)
    } else {
        // |x| < 2^-6: the code is k = |x| / 2^-9 rounded to even, in 0..=8 (8 is 2^-6, code
        // 0x08, the smallest normal). |x| = M x 2^(E - 150) for f32 exponent field E (1 for
        // f32 subnormals) and integer significand M < 2^24, so k = M / 2^(141 - E); a shift
        // of 25 or more leaves M below half a unit: k = 0.
        let e = (abs >> 23).max(1);
        let m = if abs >> 23 == 0 {
            abs
        } else {
            (abs & 0x7f_ffff) | 0x80_0000
        };
        let s = 141 - e;
        if s >= 25 {
            0
        } else {
            shift_round_even(m, s)
        }
    };
    sign | code as u8
}

/// The scale (stored, dequantisation factor) and the multiplier (codes are e4m3_encode(x * m))
/// of a block of this absmax (module doc): for finite a, (fl32(a' / 448), fl32(448 / a')) with
/// a' = max(a, 1e-12) (the scale one ulp lower where 448 x scale would overflow); for inf or
/// NaN, (NaN, NaN). [`quantize_fp8_e4m3`] uses it for every block; it is the rule for the
/// GPU kernels to follow, and for tensor-wise scales (an amax all-reduced) to be made with.
pub fn fp8_e4m3_scale(amax: f32) -> (f32, f32) {
    let bits = amax.to_bits() & ABS;
    if bits >= NON_FINITE {
        return (NAN_SCALE, NAN_SCALE);
    }
    scales_of(bits)
}

/// [`fp8_e4m3_scale`] of finite absmax bits.
#[inline]
fn scales_of(absmax_bits: u32) -> (f32, f32) {
    let a = f32::from_bits(absmax_bits);
    if (a as f64) < AMAX_MIN {
        (MIN_SCALE, MIN_MULTIPLIER)
    } else {
        (scale_of(absmax_bits, E4M3_MAX), E4M3_MAX / a)
    }
}

/// FP8-quantise one block into `out` (same length); returns its scale ([`NAN_SCALE`] for a
/// block holding an inf or NaN, whose codes are then 0).
#[inline]
fn fp8_block(x: &[f32], out: &mut [u8]) -> f32 {
    let a = absmax_bits(x);
    if a >= NON_FINITE {
        out.fill(0);
        return NAN_SCALE;
    }
    let (scale, m) = scales_of(a);
    for (o, &v) in out.iter_mut().zip(x) {
        *o = e4m3_encode(v * m);
    }
    scale
}

/// FP8 E4M3 block quantisation of `x`: returns (codes \[L\], scales \[ceil(L / block)\]).
///
/// Each element's reconstruction error is at most [`fp8_e4m3_bound`] of it and its block's
/// scale; the codes are torchao's (dynamic scaling, one amax a block); a block holding an inf
/// or NaN gets a NaN scale and codes 0, so it dequantises to NaN and the other blocks are
/// unaffected. Errors: `ZeroBlock`.
pub fn quantize_fp8_e4m3(x: &[f32], block: usize) -> Result<(Vec<u8>, Vec<f32>), QuantError> {
    if block == 0 {
        return Err(QuantError::ZeroBlock);
    }
    let mut codes = vec![0u8; x.len()];
    let scales = quantize_blocks(x, block, &mut codes, block, fp8_block);
    Ok((codes, scales))
}

/// Inverse of [`quantize_fp8_e4m3`]: codes \[L\], scales \[ceil(L / block)\] -> \[L\] f32, each
/// e4m3_decode(code) x scale (one f32 product).
///
/// Panics if `block` is 0 or `scales` has the wrong length.
pub fn dequantize_fp8_e4m3(codes: &[u8], scales: &[f32], block: usize) -> Vec<f32> {
    assert!(block > 0, "block size must be positive");
    assert_eq!(
        scales.len(),
        codes.len().div_ceil(block),
        "one scale per block"
    );
    let mut out = vec![0f32; codes.len()];
    for ((oc, qc), &s) in out.chunks_mut(block).zip(codes.chunks(block)).zip(scales) {
        for (o, &q) in oc.iter_mut().zip(qc) {
            *o = e4m3_decode(q) * s;
        }
    }
    out
}

/// A tile of a row-major matrix that shares one FP8 scale: `rows x cols` elements, the last
/// tile of each direction shorter where the matrix is not a multiple. The FP8 linear layers'
/// three shapes (issue 40; DeepSeek-V3's and Transformer Engine's block scaling, which
/// cuBLASLt takes on Hopper as `VEC128_32F` and `BLK128x128_32F`): `1 x 128` along a GEMM
/// operand's contraction dimension when it is the row, `128 x 1` when it is the column, and
/// `128 x 128` for weights, whose one set of codes and scales then serves both the GEMM that
/// contracts over their rows and the one that contracts over their columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub rows: usize,
    pub cols: usize,
}

/// FP8 E4M3 quantisation of the row-major `rows x cols` matrix `x` with one scale a [`Tile`]:
/// returns (codes \[rows x cols\], row-major like `x`; scales \[ceil(rows / tile.rows) x
/// ceil(cols / tile.cols)\], row-major over the tiles). Each tile is quantised exactly as a
/// block of [`quantize_fp8_e4m3`] holding its elements (same absmax rule, same codes, same
/// scale, the same NaN rule), so `1 x cols` tiles are row-wise scaling and a tile as large as
/// the matrix tensor-wise. Errors: `ZeroBlock` for an empty tile side, `BadLength` when `x`
/// is not `rows x cols`.
pub fn quantize_fp8_e4m3_tiles(
    x: &[f32],
    rows: usize,
    cols: usize,
    tile: Tile,
) -> Result<(Vec<u8>, Vec<f32>), QuantError> {
    check_tiles(x.len(), rows, cols, tile)?;
    let (tr, tc) = (rows.div_ceil(tile.rows), cols.div_ceil(tile.cols));
    let mut codes = vec![0u8; x.len()];
    let mut scales = vec![0f32; tr * tc];
    let mut buf = Vec::with_capacity(tile.rows * tile.cols);
    let mut out = Vec::with_capacity(tile.rows * tile.cols);
    for ti in 0..tr {
        let r = ti * tile.rows..((ti + 1) * tile.rows).min(rows);
        for tj in 0..tc {
            let c = tj * tile.cols..((tj + 1) * tile.cols).min(cols);
            buf.clear();
            for i in r.clone() {
                buf.extend_from_slice(&x[i * cols + c.start..i * cols + c.end]);
            }
            out.clear();
            out.resize(buf.len(), 0);
            scales[ti * tc + tj] = fp8_block(&buf, &mut out);
            for (k, i) in r.clone().enumerate() {
                let w = c.len();
                codes[i * cols + c.start..i * cols + c.end]
                    .copy_from_slice(&out[k * w..(k + 1) * w]);
            }
        }
    }
    Ok((codes, scales))
}

/// Inverse of [`quantize_fp8_e4m3_tiles`]: each element e4m3_decode(code) x its tile's scale
/// (one f32 product). Errors as [`quantize_fp8_e4m3_tiles`], and `BadLength` for `scales`.
pub fn dequantize_fp8_e4m3_tiles(
    codes: &[u8],
    scales: &[f32],
    rows: usize,
    cols: usize,
    tile: Tile,
) -> Result<Vec<f32>, QuantError> {
    check_tiles(codes.len(), rows, cols, tile)?;
    let tc = cols.div_ceil(tile.cols);
    let expected = rows.div_ceil(tile.rows) * tc;
    if scales.len() != expected {
        return Err(QuantError::BadLength {
            what: "FP8 tile scales",
            got: scales.len(),
            expected,
        });
    }
    Ok(codes
        .iter()
        .enumerate()
        .map(|(k, &q)| {
            let (i, j) = (k / cols, k % cols);
            e4m3_decode(q) * scales[(i / tile.rows) * tc + j / tile.cols]
        })
        .collect())
}

fn check_tiles(len: usize, rows: usize, cols: usize, tile: Tile) -> Result<(), QuantError> {
    if tile.rows == 0 || tile.cols == 0 {
        return Err(QuantError::ZeroBlock);
    }
    if len != rows * cols {
        return Err(QuantError::BadLength {
            what: "FP8 tiled matrix",
            got: len,
            expected: rows * cols,
        });
    }
    Ok(())
}

/// Largest |x - dequantize_fp8_e4m3(quantize_fp8_e4m3(x))| of an element `x` whose block has
/// `scale`: half an ulp of the e4m3 grid at x's scaled magnitude, which is at most
/// max(|x| / 16, scale / 1024) (relative 2^-4 for e4m3 normals, half the subnormal step 2^-9
/// below them), plus the f32 roundings of the product x m, of the scale and multiplier
/// (m s = 1 + d, |d| < 2^-22), of the clamp near 448 and of the dequantising product: within
/// 16 ε of the first term and 8 ε |x| (ε = f32::EPSILON).
pub fn fp8_e4m3_bound(x: f32, scale: f32) -> f32 {
    let a = x.abs();
    (a / 16.0).max(scale / 1024.0) * (1.0 + 16.0 * f32::EPSILON) + 8.0 * f32::EPSILON * a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::rng::next;

    /// The positive finite E4M3 values in increasing order (codes 0..=0x7E), from the table.
    fn values() -> Vec<f32> {
        (0..=0x7eu8).map(e4m3_decode).collect()
    }

    /// The code of 0 <= a <= 448 by search in `v` ([`values`]): the nearest value, the even
    /// code on a tie.
    fn nearest_code(v: &[f32], a: f32) -> u8 {
        let i = v.partition_point(|&w| w <= a) - 1; // v[i] <= a
        if i == v.len() - 1 || a == v[i] {
            return i as u8;
        }
        let (lo, hi) = (a as f64 - v[i] as f64, v[i + 1] as f64 - a as f64);
        if lo < hi || (lo == hi && i % 2 == 0) {
            i as u8
        } else {
            (i + 1) as u8
        }
    }

    #[test]
    fn tiles_are_blocks_of_their_elements() {
        // A 5 x 7 matrix in 2 x 3 tiles (short last tiles both ways), magnitudes spread over
        // 2^-12..2^12 so that each tile's scale is its own.
        let (rows, cols) = (5, 7);
        let mut seed = 7919u64;
        let x: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let u = (next(&mut seed) >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * 2f32.powi((k % 25) as i32 - 12)
            })
            .collect();
        let tile = Tile { rows: 2, cols: 3 };
        let (q, s) = quantize_fp8_e4m3_tiles(&x, rows, cols, tile).unwrap();
        assert_eq!(s.len(), 3 * 3);
        for ti in 0..3 {
            for tj in 0..3 {
                let idx: Vec<usize> = (ti * 2..(ti * 2 + 2).min(rows))
                    .flat_map(|i| (tj * 3..(tj * 3 + 3).min(cols)).map(move |j| i * cols + j))
                    .collect();
                let block: Vec<f32> = idx.iter().map(|&k| x[k]).collect();
                let (bq, bs) = quantize_fp8_e4m3(&block, block.len()).unwrap();
                assert_eq!(bs, vec![s[ti * 3 + tj]], "tile ({ti}, {tj})");
                let got: Vec<u8> = idx.iter().map(|&k| q[k]).collect();
                assert_eq!(got, bq, "tile ({ti}, {tj})");
            }
        }
        let y = dequantize_fp8_e4m3_tiles(&q, &s, rows, cols, tile).unwrap();
        for (k, (a, b)) in x.iter().zip(&y).enumerate() {
            let scale = s[(k / cols / 2) * 3 + (k % cols) / 3];
            assert!((a - b).abs() <= fp8_e4m3_bound(*a, scale), "element {k}");
        }
        // Row-wise is 1 x cols tiles, and equals blocks of one row.
        let (qr, sr) = quantize_fp8_e4m3_tiles(&x, rows, cols, Tile { rows: 1, cols }).unwrap();
        assert_eq!((qr, sr), quantize_fp8_e4m3(&x, cols).unwrap());
        assert!(matches!(
            quantize_fp8_e4m3_tiles(&x, rows, cols + 1, tile),
            Err(QuantError::BadLength { .. })
        ));
        assert!(matches!(
            quantize_fp8_e4m3_tiles(&x, rows, cols, Tile { rows: 0, cols: 3 }),
            Err(QuantError::ZeroBlock)
        ));
        assert!(dequantize_fp8_e4m3_tiles(&q, &s[1..], rows, cols, tile).is_err());
    }

    #[test]
    fn decode_is_the_format() {
        for c in 0..=255u8 {
            let (s, e, m) = (c >> 7, (c >> 3) & 0xf, c & 7);
            let v = e4m3_decode(c);
            if e == 15 && m == 7 {
                assert!(v.is_nan());
                assert_eq!(v.is_sign_negative(), s == 1);
                continue;
            }
            let mag = if e == 0 {
                m as f64 * 2f64.powi(-9)
            } else {
                (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7)
            };
            assert_eq!(v as f64, if s == 1 { -mag } else { mag }, "code {c:#x}");
            assert_eq!(v.is_sign_negative(), s == 1);
        }
        assert_eq!(e4m3_decode(0x7e), E4M3_MAX);
        assert_eq!(e4m3_decode(0x08), 2f32.powi(-6));
    }

    #[test]
    fn encode_is_the_nearest_code_ties_to_even() {
        // Every f32 from 2^-11 to 512: below, everything encodes to 0; above, to 448.
        let v = values();
        let (lo, hi) = ((2f32.powi(-11)).to_bits(), 512f32.to_bits());
        for bits in lo..=hi {
            let a = f32::from_bits(bits);
            let want = nearest_code(&v, a.min(E4M3_MAX));
            assert_eq!(e4m3_encode(a), want, "{a}");
            assert_eq!(e4m3_encode(-a), want | 0x80, "{a}");
        }
        let mut s = 40u64;
        for _ in 0..1_000_000 {
            let b = next(&mut s) as u32;
            let x = f32::from_bits(b);
            let want = if x.is_nan() {
                0x7f
            } else if x.abs() < 2f32.powi(-11) {
                0
            } else if x.abs() > 512.0 {
                0x7e
            } else {
                nearest_code(&v, x.abs())
            };
            assert_eq!(e4m3_encode(x), want | ((b >> 24) as u8 & 0x80), "{x}");
        }
        for c in (0..=255u8).filter(|c| c & 0x7f != 0x7f) {
            assert_eq!(e4m3_encode(e4m3_decode(c)), c);
        }
    }

    #[test]
    fn multiplier_is_torchaos() {
        // fl32(448 / max(a, 1e-12)) in f64 as torchao computes it, over every binade.
        let mut s = 41u64;
        for _ in 0..1_000_000 {
            let a = f32::from_bits(next(&mut s) as u32 % NON_FINITE);
            let a64 = (a as f64).max(AMAX_MIN);
            let (scale, m) = fp8_e4m3_scale(a);
            assert_eq!(m.to_bits(), ((448.0 / a64) as f32).to_bits(), "{a}");
            let want = (a64 / 448.0) as f32;
            if (want * 448.0).is_finite() {
                assert_eq!(scale.to_bits(), want.to_bits(), "{a}");
            } else {
                assert_eq!(scale, want.next_down());
            }
            // m s = 1 + d, |d| < 2^-22.
            assert!(
                (m as f64 * scale as f64 - 1.0).abs() < 2f64.powi(-22),
                "{a}"
            );
        }
        assert!(fp8_e4m3_scale(f32::NAN).0.is_nan());
        assert!(fp8_e4m3_scale(f32::INFINITY).0.is_nan());
        assert_eq!(fp8_e4m3_scale(0.0), (MIN_SCALE, MIN_MULTIPLIER));
    }

    #[test]
    fn absmax_gives_448() {
        // Every significand of [1, 2) at a few exponents, the top binade, and random absmax
        // from 1e-12 up: the absmax element's code is ±448, the others within.
        let exps = [-39, -20, -1, 0, 8, 9, 60, 126];
        let check = |a: f32| {
            let (_, m) = fp8_e4m3_scale(a);
            assert_eq!(e4m3_encode(a * m), 0x7e, "{a}");
            assert_eq!(e4m3_encode(-a * m), 0xfe, "{a}");
        };
        for bits in 1.0f32.to_bits()..2.0f32.to_bits() {
            for e in exps {
                check(f32::from_bits(bits) * 2f32.powi(e));
            }
        }
        for bits in 2f32.powi(127).to_bits()..=f32::MAX.to_bits() {
            check(f32::from_bits(bits));
        }
        let first = (AMAX_MIN as f32).next_up().to_bits();
        let mut s = 42u64;
        for _ in 0..1_000_000 {
            let bits = first + (next(&mut s) as u32 % (NON_FINITE - first));
            check(f32::from_bits(bits));
        }
    }
}
