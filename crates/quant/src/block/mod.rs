//! Per-block kernels shared by every quantiser, so that the fused variants do exactly the
//! arithmetic of the plain ones (their bitwise-equality tests rely on it).
//!
//! Arithmetic, fixed here once:
//! - scale = absmax / qmax (one f32 division, round to nearest even), one ulp lower in the
//!   one case where qmax * scale would overflow to inf (see [`scale_of`]);
//! - codes: r = fl(1 / scale) (one f32 division, round to nearest even). Where r is finite,
//!   q = the integer nearest the exact product x * r, ties to even ([`code_mul`]); no clamp is
//!   needed, and x = ±absmax always gives ±qmax (proof at [`code_mul`]). Where r overflows to
//!   inf (a subnormal scale below about 2^-128) the whole block takes the division rule
//!   instead: q = round(clamp(fl(x / scale), -qmax, qmax)), half away from zero
//!   ([`code_div`]); there ±absmax gives ±qmax only where absmax >= qmax (qmax - 1/2) 2^-149,
//!   as a subnormal scale carries few significant bits. We multiply because the GPU then
//!   spends one FMA a code (the exact product rounded to an integer in one step,
//!   docs/kernels.md), where an exact division takes about ten instructions and
//!   round-half-away after a rounded quotient needs a test.
//! - scale == 0 (an all-zero block, or absmax so small that absmax/qmax underflows to 0):
//!   every code is 0.
//! - a block holding an inf or NaN: scale [`NAN_SCALE`] and every code 0, so the whole block
//!   dequantises to NaN (0 x NaN): a diverged value is never rounded into a finite one, and
//!   the other blocks are quantised as if it were not there. The GPU kernels do the same.
//! - dequantised value = q as f32 * scale.
//! - a sum of dequantised INT4 pieces (the fused kernels) is taken in each block's *scale
//!   domain*: every piece's scale shifted by one power of two k, nibbles decoded exactly as
//!   subnormals, then one fma a piece and value, in piece order; the rule and its error bound
//!   are at [`int4_sum_block`] (`domain.rs`).
//!
//! [`quantize_blocks`] runs a block quantiser over a whole input, for INT8 and INT4 alike.

mod domain;

pub(crate) use domain::*;

pub(crate) const ABS: u32 = 0x7fff_ffff;
/// `bits & ABS` is at least this for, and only for, inf and NaN.
pub(crate) const NON_FINITE: u32 = 0x7f80_0000;

/// Largest `|v|` bit pattern of the slice. For finite floats the bits of |v| order like |v|,
/// so an integer max (which vectorises, unlike an f32 max) gives the absmax; a result
/// `>= NON_FINITE` says the slice holds an inf or NaN.
#[inline]
pub(crate) fn absmax_bits(x: &[f32]) -> u32 {
    // i32 lanes: `bits & ABS` fits, and a signed compare-select vectorises on plain x86-64
    // (SSE2 has no unsigned 32-bit max).
    let mut lanes = [0i32; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for (l, v) in lanes.iter_mut().zip(c) {
            let b = (v.to_bits() & ABS) as i32;
            *l = if b > *l { b } else { *l };
        }
    }
    let mut m = it
        .remainder()
        .iter()
        .fold(0, |m, v| m.max(v.to_bits() & ABS));
    for l in lanes {
        m = m.max(l as u32);
    }
    m
}

/// The scale of a block that holds an inf or NaN: the quiet NaN the GPU's `scale_of` returns
/// too (bits 0x7fc00000), so that scales compare bitwise across the two.
pub(crate) const NAN_SCALE: f32 = f32::from_bits(0x7fc0_0000);

/// Round half away from zero, equal to `y.round() as i32` for |y| <= 2^22, but vectorisable
/// (no libm call on targets without SSE4.1): truncate, then look at the exact fraction.
/// Callers pass |y| <= 127 (clamped), where the unchecked conversion is exact.
#[inline(always)]
pub(crate) fn round_half_away(y: f32) -> i32 {
    assert_in_range(y);
    // SAFETY: y is finite and |y| <= 2^22 (checked in debug builds), so it fits an i32.
    // Unlike `as`, the unchecked conversion needs no saturation fix-ups and vectorises
    // (cvttps2dq on plain x86-64).
    let t: i32 = unsafe { y.to_int_unchecked() };
    let f = y - t as f32; // exact for |y| < 2^23
    t + (f >= 0.5) as i32 - (f <= -0.5) as i32
}

#[inline(always)]
fn assert_in_range(y: f32) {
    debug_assert!(y.abs() <= 4_194_304.0, "{y} out of range");
}

/// Code of one element by the division rule, given its block's nonzero scale: the fallback
/// of blocks whose `1 / scale` overflows (see [`code_mul`]).
#[inline(always)]
pub(crate) fn code_div(v: f32, scale: f32, qmax: f32) -> i32 {
    round_half_away((v / scale).clamp(-qmax, qmax))
}

/// 1.5 * 2^52: for |y| < 2^51, y + MAGIC52 (one f64 rounding) is MAGIC52 plus y rounded to an
/// integer, nearest with ties to even (MAGIC52 is even and its ulp is 1), and the low 32 bits
/// of the sum's bits are that integer in two's complement.
const MAGIC52: f64 = 6_755_399_441_055_744.0;

/// Reciprocal of a nonzero scale for [`code_mul`]: Some(fl(1 / scale)) as an f64, or None when
/// it overflows to inf (the block takes [`code_div`]).
#[inline(always)]
pub(crate) fn reciprocal(scale: f32) -> Option<f64> {
    let r = 1.0 / scale;
    r.is_finite().then_some(r as f64)
}

/// Code of one element given r = fl(1 / scale) finite ([`reciprocal`]): the integer nearest
/// the exact product v * r, ties to even.
///
/// Exact: v and r have 24-bit significands, so v * r has at most 48 bits, and its magnitude
/// (between 2^-149 * 2^-126 and 2^128 * 2^128) is in f64's normal range: the f64 product is
/// exact and the MAGIC52 addition is the one rounding.
///
/// No clamp is needed, and ±absmax gives ±qmax. Let a = absmax > 0, t = a / qmax (real),
/// s = scale, u = 2^-24.
/// - s = t (1 + d1) with |d1| <= 2^-21: a rounded quotient is within u t of t when normal; in
///   the overflow case of [`scale_of`] s is one ulp (<= 2u t) lower still; a subnormal s has
///   an error of at most 2^-150, and r finite means 1 / s < 2^128, s > 2^-128, so
///   2^-150 <= 2^-21.9 t.
/// - r = (1 / s)(1 + d2) with |d2| <= u: 1 / s is normal (s <= fl(f32::MAX / 7) < 2^126).
/// - so a r = qmax (1 + d2) / (1 + d1), and |a r - qmax| <= qmax (|d1| + |d2|) / (1 - |d1|)
///   < qmax 2^-20 <= 127 * 2^-20 < 2^-13.
///
/// For every |v| <= a, |v r| <= a r < qmax + 2^-13 < qmax + 1/2, so |q| <= qmax; and v = ±a
/// lies within 2^-13 of ±qmax, so q = ±qmax.
#[inline(always)]
pub(crate) fn code_mul(v: f32, r: f64) -> i32 {
    ((v as f64) * r + MAGIC52).to_bits() as i32
}

/// Scale of a block with the given absmax bits (finite): absmax / qmax, except that where
/// qmax * scale would overflow to inf (absmax near f32::MAX and the quotient rounded up) the
/// scale is one ulp lower, so that every dequantised value stays finite.
#[inline(always)]
pub(crate) fn scale_of(absmax_bits: u32, qmax: f32) -> f32 {
    let s = f32::from_bits(absmax_bits) / qmax;
    if s * qmax > f32::MAX {
        s.next_down()
    } else {
        s
    }
}

/// INT8-quantise one block into `out` (same length); returns its scale ([`NAN_SCALE`] for a
/// block holding an inf or NaN, whose codes are then 0).
#[inline]
pub(crate) fn int8_block(x: &[f32], out: &mut [i8]) -> f32 {
    let m = absmax_bits(x);
    if m >= NON_FINITE {
        out.fill(0);
        return NAN_SCALE;
    }
    let scale = scale_of(m, 127.0);
    if scale == 0.0 {
        out.fill(0);
    } else if let Some(r) = reciprocal(scale) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = code_mul(v, r) as i8;
        }
    } else {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = code_div(v, scale, 127.0) as i8;
        }
    }
    scale
}

/// Two INT4 codes in one byte: `lo` (element 2i) in bits 0..4, `hi` (element 2i+1) in bits
/// 4..8, each as 4-bit two's complement.
#[inline(always)]
pub(crate) fn pack(lo: i32, hi: i32) -> u8 {
    ((lo as u8) & 0x0f) | ((hi as u8) << 4)
}

/// Inverse of [`pack`]: (element 2i, element 2i+1), sign-extended.
#[inline(always)]
pub(crate) fn unpack(b: u8) -> (i8, i8) {
    (((b << 4) as i8) >> 4, (b as i8) >> 4)
}

/// INT4-quantise one block of even length into `out` (half its length); returns its scale
/// ([`NAN_SCALE`] for a block holding an inf or NaN, whose codes are then 0).
#[inline]
pub(crate) fn int4_block(x: &[f32], out: &mut [u8]) -> f32 {
    debug_assert_eq!(x.len(), 2 * out.len());
    let m = absmax_bits(x);
    if m >= NON_FINITE {
        out.fill(0);
        return NAN_SCALE;
    }
    let scale = scale_of(m, 7.0);
    if scale == 0.0 {
        out.fill(0);
    } else if let Some(r) = reciprocal(scale) {
        for (o, p) in out.iter_mut().zip(x.chunks_exact(2)) {
            *o = pack(code_mul(p[0], r), code_mul(p[1], r));
        }
    } else {
        for (o, p) in out.iter_mut().zip(x.chunks_exact(2)) {
            *o = pack(code_div(p[0], scale, 7.0), code_div(p[1], scale, 7.0));
        }
    }
    scale
}

/// Quantises `x` block by block with `quantise_block` (one of [`int8_block`], [`int4_block`])
/// into `out`, `out_block` codes a block, and returns the scales.
#[inline]
pub(crate) fn quantize_blocks<T>(
    x: &[f32],
    block: usize,
    out: &mut [T],
    out_block: usize,
    quantise_block: impl Fn(&[f32], &mut [T]) -> f32,
) -> Vec<f32> {
    x.chunks(block)
        .zip(out.chunks_mut(out_block))
        .map(|(xc, oc)| quantise_block(xc, oc))
        .collect()
}

/// Dequantise one INT4 block: `out` has twice the length of `packed`.
#[inline]
pub(crate) fn int4_deq_block(packed: &[u8], scale: f32, out: &mut [f32]) {
    for (o, &b) in out.chunks_exact_mut(2).zip(packed) {
        let (lo, hi) = unpack(b);
        o[0] = lo as f32 * scale;
        o[1] = hi as f32 * scale;
    }
}

#[cfg(test)]
pub(crate) mod rng {
    //! The tests' random numbers.

    /// SplitMix64 (the tests' generator).
    pub(crate) fn next(s: &mut u64) -> u64 {
        *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A finite f32 of random bits, any exponent (subnormals and near f32::MAX included).
    pub(crate) fn any_finite(s: &mut u64) -> f32 {
        loop {
            let v = f32::from_bits(next(s) as u32);
            if v.is_finite() {
                return v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rng::next;
    use super::*;

    #[test]
    fn round_half_away_equals_f32_round() {
        // Every half-integer and its f32 neighbours in [-130, 130], plus a dense sweep.
        for k in -260..=260 {
            let h = k as f32 * 0.5;
            let mut v = h;
            for _ in 0..4 {
                v = v.next_down();
            }
            for _ in 0..9 {
                assert_eq!(round_half_away(v), v.round() as i32, "{v}");
                v = v.next_up();
            }
        }
        let mut v = -130.0f32;
        while v < 130.0 {
            assert_eq!(round_half_away(v), v.round() as i32, "{v}");
            v += 0.000_731;
        }
        for v in [
            0.0f32,
            -0.0,
            0.49999997,
            -0.49999997,
            1e-30,
            -1e-30,
            f32::from_bits(1),
        ] {
            assert_eq!(round_half_away(v), v.round() as i32, "{v}");
        }
    }

    /// (sign, integer significand, exponent) of a finite f32: |v| = m * 2^e.
    fn parts(v: f32) -> (bool, i128, i32) {
        let b = v.to_bits();
        let (e, m) = ((b >> 23) & 0xff, b & 0x7f_ffff);
        let (m, e) = if e == 0 {
            (m, -149)
        } else {
            (m | 0x80_0000, e as i32 - 150)
        };
        (b >> 31 == 1, m as i128, e)
    }

    /// The integer nearest v * r (reals, r an f32), ties to even, in exact integer arithmetic.
    fn nearest_even(v: f32, r: f32) -> i64 {
        let ((sv, mv, ev), (sr, mr, er)) = (parts(v), parts(r));
        let (n, e) = (mv * mr, ev + er); // |v r| = n * 2^e, n < 2^48
        let q = if e >= 0 {
            n << e
        } else if e < -100 {
            0 // n * 2^e < 2^-52
        } else {
            let k = -e;
            let (fl, rem, half) = (n >> k, n & ((1 << k) - 1), 1i128 << (k - 1));
            fl + (rem > half || (rem == half && fl % 2 == 1)) as i128
        };
        (if sv != sr { -q } else { q }) as i64
    }

    #[test]
    fn code_mul_is_the_nearest_integer_ties_to_even() {
        let mut s = 1u64;
        // Random v and finite r = fl(1 / scale) over the whole exponent range, |v r| < 2^20.
        let mut n = 0;
        while n < 2_000_000 {
            let scale = f32::from_bits(next(&mut s) as u32 & 0x7fff_ffff);
            let Some(r) = (scale > 0.0).then(|| reciprocal(scale)).flatten() else {
                continue;
            };
            let v = f32::from_bits(next(&mut s) as u32);
            if !v.is_finite() || (v as f64 * r).abs() >= (1 << 20) as f64 {
                // Keep |v r| small: v = u * scale, u in (-2^10, 2^10).
                let u = (next(&mut s) >> 40) as f32 / (1u64 << 13) as f32 - 1024.0;
                let v = u * scale;
                if v.is_finite() {
                    assert_eq!(code_mul(v, r) as i64, nearest_even(v, r as f32), "{v} {r}");
                    n += 1;
                }
                continue;
            }
            assert_eq!(code_mul(v, r) as i64, nearest_even(v, r as f32), "{v} {r}");
            n += 1;
        }
        // Exact ties: r = m 2^j (m odd), v = t 2^(-1-j) (t odd) gives v r = m t / 2, a
        // half-integer; with m = 1 these are the power-of-two scales.
        for _ in 0..200_000 {
            let m = (next(&mut s) % 256) as i32 * 2 + 1;
            let j = (next(&mut s) % 200) as i32 - 100;
            let t = (next(&mut s) % 128) as i32 * 2 + 1;
            let (r, v) = (m as f64 * 2f64.powi(j), t as f64 * 2f64.powi(-1 - j));
            let v = if next(&mut s).is_multiple_of(2) {
                v
            } else {
                -v
            };
            let (r32, v32) = (r as f32, v as f32);
            assert_eq!((r32 as f64, v32 as f64), (r, v));
            let h = v * r; // exact: m t / 2
            assert_eq!(h.fract().abs(), 0.5);
            let even = if (h - 0.5).rem_euclid(2.0) == 0.0 {
                h - 0.5
            } else {
                h + 0.5
            };
            assert_eq!(code_mul(v32, r) as f64, even, "{v32} * {r32}");
            assert_eq!(nearest_even(v32, r32) as f64, even);
        }
        for (v, q) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-2.5, -2),
            (-3.5, -4),
        ] {
            assert_eq!(code_mul(v, 1.0), q, "{v}");
        }
    }

    /// Checks the codes of ±a (and of every value of a block whose absmax is a) against
    /// `qmax`; returns whether the block took the division fallback.
    fn absmax_codes(a: f32, qmax: f32) -> bool {
        let scale = scale_of(a.to_bits(), qmax);
        if scale == 0.0 {
            return false;
        }
        assert!((scale * qmax).is_finite(), "{a}");
        let q = qmax as i32;
        match reciprocal(scale) {
            Some(r) => {
                assert_eq!(
                    (code_mul(a, r), code_mul(-a, r)),
                    (q, -q),
                    "{a} qmax {qmax}"
                );
                // Every |v| <= a stays within [-qmax, qmax] (no clamp), the largest below a too.
                let b = a.next_down();
                assert!(
                    code_mul(b, r).abs() <= q && code_mul(-b, r).abs() <= q,
                    "{a}"
                );
                false
            }
            None => {
                // Division rule: ±qmax wherever the subnormal scale resolves a / scale to
                // within half a step, a >= qmax (qmax - 1/2) 2^-149 (module doc).
                let (c, d) = (code_div(a, scale, qmax), code_div(-a, scale, qmax));
                assert_eq!(c, -d);
                assert!(c <= q);
                if a >= qmax * (qmax - 0.5) * f32::from_bits(1) {
                    assert_eq!(c, q, "{a} qmax {qmax}");
                }
                true
            }
        }
    }

    #[test]
    fn absmax_gives_qmax() {
        for qmax in [7.0f32, 127.0] {
            // Every significand of [1, 2) and of the top binade (the overflow case of
            // scale_of), every subnormal absmax.
            let mut fallback = 0u32;
            for bits in (1.0f32.to_bits()..2.0f32.to_bits())
                .chain(2f32.powi(127).to_bits()..=f32::MAX.to_bits())
                .chain(1..0x80_0000u32)
            {
                fallback += absmax_codes(f32::from_bits(bits), qmax) as u32;
            }
            assert!(fallback > 0);
            // Random absmax over every binade.
            let mut s = 7u64;
            for _ in 0..1_000_000 {
                let a = f32::from_bits(next(&mut s) as u32 % 0x7f80_0000);
                absmax_codes(a, qmax);
            }
            // Around the threshold where 1 / scale overflows.
            let edge = qmax * 2f32.powi(-128);
            let mut a = edge;
            for _ in 0..100_000 {
                a = a.next_down();
            }
            let mut seen = [false; 2];
            for _ in 0..200_000 {
                seen[absmax_codes(a, qmax) as usize] = true;
                a = a.next_up();
            }
            assert_eq!(
                seen,
                [true, true],
                "qmax {qmax}: both rules near the threshold"
            );
        }
    }

    #[test]
    fn pack_unpack_all_codes() {
        for lo in -7..=7 {
            for hi in -7..=7 {
                assert_eq!(unpack(pack(lo, hi)), (lo as i8, hi as i8));
            }
        }
        assert_eq!(pack(1, -1), 0xF1);
        assert_eq!(pack(-7, 7), 0x79);
        assert_eq!(pack(0, 0), 0x00);
    }

    #[test]
    fn absmax_bits_orders_like_abs() {
        let x = [1.0f32, -3.5, 2.0, 0.0, -0.0, 3.25, 1e-40];
        assert_eq!(f32::from_bits(absmax_bits(&x)), 3.5);
        let mut y = vec![0.5f32; 37];
        y[33] = f32::NEG_INFINITY;
        assert!(absmax_bits(&y) >= NON_FINITE);
        y[33] = f32::NAN;
        assert!(absmax_bits(&y) >= NON_FINITE);
        y[33] = f32::MAX;
        assert!(absmax_bits(&y) < NON_FINITE);
        assert_eq!(absmax_bits(&[]), 0);
    }
}
