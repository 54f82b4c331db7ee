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
//! - dequantised value = q as f32 * scale.
//! - a sum of dequantised INT4 pieces (the fused kernels), elementwise in piece order:
//!   acc = fl(q_0 * s_0), then acc = fma(q_j, s_j, acc) for j >= 1, a fused multiply-add
//!   with one rounding ([`int4_deq_fma_block`]): one GPU instruction a piece and value
//!   where a multiply then an add take two.

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

/// Index of the first inf or NaN, if any (error path only).
pub(crate) fn first_non_finite(x: &[f32]) -> Option<usize> {
    x.iter().position(|v| !v.is_finite())
}

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

/// INT8-quantise one block into `out` (same length). Err(local index of the first non-finite).
#[inline]
pub(crate) fn int8_block(x: &[f32], out: &mut [i8]) -> Result<f32, usize> {
    let m = absmax_bits(x);
    if m >= NON_FINITE {
        return Err(first_non_finite(x).expect("absmax_bits saw a non-finite"));
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
    Ok(scale)
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

/// INT4-quantise one block of even length into `out` (half its length).
/// Err(local index of the first non-finite).
#[inline]
pub(crate) fn int4_block(x: &[f32], out: &mut [u8]) -> Result<f32, usize> {
    debug_assert_eq!(x.len(), 2 * out.len());
    let m = absmax_bits(x);
    if m >= NON_FINITE {
        return Err(first_non_finite(x).expect("absmax_bits saw a non-finite"));
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
    Ok(scale)
}

/// 2^e as an f32, for e in [-126, 127] (a normal power of two).
#[inline(always)]
pub(crate) fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e), "2^{e}");
    f32::from_bits(((e + 127) as u32) << 23)
}

/// x * 2^t correctly rounded (one rounding), for t in [-126, 253]: (x * 2^a) * 2^(t - a) with
/// a = min(t, 127). Where t <= 127 the second factor is 1; where t > 127 both factors scale up,
/// which is exact until an overflow, and an overflow of either step means |x 2^t| >= 2^128,
/// which rounds to inf too. Both paths (CPU, GPU) compute it this way.
#[inline(always)]
pub(crate) fn mul_pow2(x: f32, t: i32) -> f32 {
    let a = t.min(127);
    x * pow2(a) * pow2(t - a)
}

/// 8 * 2^-149 (subnormal): the bias of a decoded nibble at position 0 ([`int4_sum_block`]).
pub(crate) const BIAS0: f32 = f32::from_bits(8);

/// Shift k of a block's scale domain ([`int4_sum_block`]): E = the largest exponent field of
/// the pieces' scales (of |s|; 255 for inf or NaN), k = 254 - clamp(E, 1, 254), so that every
/// S_j = s_j 2^k is exact and below 2^128, the largest in [2^127, 2^128) (for E >= 1).
#[inline(always)]
pub(crate) fn domain_shift(scales: impl Iterator<Item = f32>) -> i32 {
    let e = scales.map(|s| (s.to_bits() & ABS) >> 23).max().unwrap_or(0);
    254 - e.clamp(1, 254) as i32
}

/// Position p (the bit offset of its nibble in the decode, 0, 4, 8 or 12) of element i of a
/// block: 4 (i % 4).
#[inline(always)]
pub(crate) fn nibble_pos(i: usize) -> i32 {
    4 * (i % 4) as i32
}

/// Exponent t_p of the true value of the domain value at position p: true = v 2^(149 - k - p),
/// in [-116, 149] ([`mul_pow2`] takes it).
#[inline(always)]
pub(crate) fn true_shift(k: i32, p: i32) -> i32 {
    149 - k - p
}

/// The sum of the INT4 pieces `(packed, scales)` over block `b` (packed bytes `lo..` of each
/// piece, `acc.len()` elements) in the block's scale domain; returns its shift k.
///
/// The rule (the GPU kernels do the same operations): let k = [`domain_shift`] of the block's
/// piece scales s_j and S_j = s_j 2^k ([`mul_pow2`], exact). Element i (position
/// p = 4 (i % 4)) with code q_j in piece j is decoded as F_j = (q_j + 8) 2^(p - 149), the
/// subnormal f32 whose bits are (q_j + 8) << p (one mask of the nibble at its own position on
/// the GPU, exact). The bias B_0 = 2^-146 S_0 (rounded), then B_0 = fma(2^-146, S_j, B_0) for
/// j >= 1 (so B_0 ~ 8 2^-149 sum_j S_j), and B_p = B_0 2^p (exact). Then
/// v = fma(F_0, S_0, -B_p), v = fma(F_j, S_j, v) for j >= 1, one rounding a piece. The true sum
/// sum_j q_j s_j is then v 2^(149 - k - p) up to those roundings ([`true_shift`]).
/// Every product F_j S_j = (q_j + 8) s_j 2^(k + p - 149) enters its fma exact.
///
/// Error: the partial sums are at most 23 sum_j |s_j| (true units) in magnitude and the bias
/// at most 8 sum_j |s_j|, so with u = 2^-24 the 2P roundings (P pieces) leave
/// |v 2^(149 - k - p) - sum_j q_j s_j| <= 31 P u sum_j |s_j| (plus, where a partial sum is
/// subnormal in the domain, 2^-150 a rounding there, i.e. below 2^-127 max_j |s_j| each: a
/// piece whose scale is below about 2^-127 of the block's largest is summed at that absolute
/// resolution and may vanish). The
/// largest S_j is at least 2^127, so the domain never underflows where it matters and never
/// overflows (|v| < (P + 1) 2^-5). Zero scales give exact zeros (+0); a NaN or inf scale gives
/// a NaN or inf sum.
///
/// `f32::mul_add` is correctly rounded on every target; where the CPU has FMA (detected at run
/// time) the loop is compiled with the feature (vfmadd) instead of a libm call an element.
#[inline]
pub(crate) fn int4_sum_block(
    pieces: &[(&[u8], &[f32])],
    b: usize,
    lo: usize,
    acc: &mut [f32],
) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked just above).
        return unsafe { int4_sum_x86(pieces, b, lo, acc) };
    }
    int4_sum_portable(pieces, b, lo, acc)
}

/// [`int4_sum_portable`] compiled with FMA instructions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
pub(crate) unsafe fn int4_sum_x86(
    pieces: &[(&[u8], &[f32])],
    b: usize,
    lo: usize,
    acc: &mut [f32],
) -> i32 {
    int4_sum_portable(pieces, b, lo, acc)
}

/// Decoded nibble (code + 8 in `x`'s low 4 bits, after the xor with 8) at position p.
#[inline(always)]
fn nib_f(x: u8, p: u32) -> f32 {
    f32::from_bits(((x & 0x0f) as u32) << p)
}

/// The loop of [`int4_sum_block`], with whatever `mul_add` the caller's target features give.
#[inline(always)]
pub(crate) fn int4_sum_portable(
    pieces: &[(&[u8], &[f32])],
    b: usize,
    lo: usize,
    acc: &mut [f32],
) -> i32 {
    let k = domain_shift(pieces.iter().map(|p| p.1[b]));
    let mut bias = 0f32;
    for (j, &(_, s)) in pieces.iter().enumerate() {
        let sj = mul_pow2(s[b], k);
        bias = if j == 0 {
            BIAS0 * sj
        } else {
            BIAS0.mul_add(sj, bias)
        };
    }
    let nb = [-bias, -bias * 16.0, -bias * 256.0, -bias * 4096.0];
    let n = acc.len();
    for (j, &(p, s)) in pieces.iter().enumerate() {
        let sj = mul_pow2(s[b], k);
        let bytes = &p[lo..lo + n / 2];
        let mut quads = acc.chunks_exact_mut(4);
        let mut pairs = bytes.chunks_exact(2);
        for (o, w) in (&mut quads).zip(&mut pairs) {
            let (x0, x1) = (w[0] ^ 0x88, w[1] ^ 0x88);
            let f = [
                nib_f(x0, 0),
                nib_f(x0 >> 4, 4),
                nib_f(x1, 8),
                nib_f(x1 >> 4, 12),
            ];
            for i in 0..4 {
                o[i] = if j == 0 {
                    f[i].mul_add(sj, nb[i])
                } else {
                    f[i].mul_add(sj, o[i])
                };
            }
        }
        // A block of length 2 mod 4 ends with one byte: positions 0 and 4.
        for (o, &w) in quads
            .into_remainder()
            .chunks_exact_mut(2)
            .zip(pairs.remainder())
        {
            let x = w ^ 0x88;
            let f = [nib_f(x, 0), nib_f(x >> 4, 4)];
            for i in 0..2 {
                o[i] = if j == 0 {
                    f[i].mul_add(sj, nb[i])
                } else {
                    f[i].mul_add(sj, o[i])
                };
            }
        }
    }
    if pieces.is_empty() {
        acc.fill(0.0);
    }
    k
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
mod tests {
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

    /// SplitMix64 (the tests' generator).
    fn next(s: &mut u64) -> u64 {
        *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
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

    /// A finite f32 of random bits, any exponent (subnormals and near f32::MAX included).
    fn any_finite(s: &mut u64) -> f32 {
        loop {
            let v = f32::from_bits(next(s) as u32);
            if v.is_finite() {
                return v;
            }
        }
    }

    /// fma(c, s, acc) correctly rounded for f32 c, s, acc with c * s exact in f64 (c has at
    /// most 4 significant bits here), by an independent route: rounding the f64 sum to odd
    /// (TwoSum gives its exact error), then to f32 (24 <= 53 - 2 bits).
    fn fma_ref32(c: f32, s: f32, acc: f32) -> f32 {
        let (p, a) = (c as f64 * s as f64, acc as f64);
        let sum = p + a;
        let bb = sum - p;
        let err = (p - (sum - bb)) + (a - bb);
        let odd = if err == 0.0 || sum.to_bits() & 1 == 1 {
            sum
        } else if err > 0.0 {
            sum.next_up()
        } else {
            sum.next_down()
        };
        odd as f32
    }

    #[test]
    fn scale_domain_sums_follow_the_rule() {
        let mut s = 11u64;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for round in 0..20_000 {
            let np = 1 + (next(&mut s) % 8) as usize;
            let n = 1 + (next(&mut s) % 40) as usize; // bytes a block
            let packed: Vec<Vec<u8>> = (0..np)
                .map(|_| (0..n).map(|_| next(&mut s) as u8).collect())
                .collect();
            // Scales of every magnitude (near f32::MAX / 7, subnormal, 0), or of one binade.
            let scales: Vec<Vec<f32>> = (0..np)
                .map(|_| {
                    vec![match next(&mut s) % 5 {
                        0 => any_finite(&mut s).abs().min(f32::MAX / 7.0),
                        1 => f32::from_bits(next(&mut s) as u32 & 0x007f_ffff),
                        2 => 0.0,
                        _ => f32::from_bits(0x3f80_0000 | (next(&mut s) as u32 >> 9)),
                    }]
                })
                .collect();
            let pieces: Vec<(&[u8], &[f32])> = packed
                .iter()
                .zip(&scales)
                .map(|(p, s)| (&p[..], &s[..]))
                .collect();
            // The rule, with the reference fma.
            let k = domain_shift(scales.iter().map(|s| s[0]));
            let sj: Vec<f32> = scales.iter().map(|s| mul_pow2(s[0], k)).collect();
            let mut bias = BIAS0 * sj[0];
            for &x in &sj[1..] {
                bias = fma_ref32(BIAS0, x, bias);
            }
            let mut want = vec![0f32; 2 * n];
            for (j, p) in packed.iter().enumerate() {
                for (i, w) in want.iter_mut().enumerate() {
                    let q = if i % 2 == 0 {
                        unpack(p[i / 2]).0
                    } else {
                        unpack(p[i / 2]).1
                    };
                    let pos = nibble_pos(i);
                    let f = f32::from_bits(((q + 8) as u32) << pos);
                    assert_eq!(f as f64, (q + 8) as f64 * 2f64.powi(pos - 149));
                    let prev = if j == 0 { -bias * pow2(pos) } else { *w };
                    *w = fma_ref32(f, sj[j], prev);
                }
            }
            let mut got = vec![0f32; 2 * n];
            assert_eq!(int4_sum_block(&pieces, 0, 0, &mut got), k);
            assert_eq!(bits(&got), bits(&want), "round {round}");
            let mut portable = vec![0f32; 2 * n];
            int4_sum_portable(&pieces, 0, 0, &mut portable);
            assert_eq!(bits(&portable), bits(&want), "round {round}");
            // The bound of int4_sum_block's doc, against the exact sum (f64 here: the error of
            // the f64 sum of 8 terms is far below the bound).
            let sum_s: f64 = scales.iter().map(|s| s[0] as f64).sum();
            for (i, &v) in got.iter().enumerate() {
                let exact: f64 = packed
                    .iter()
                    .zip(&scales)
                    .map(|(p, s)| {
                        let q = if i % 2 == 0 {
                            unpack(p[i / 2]).0
                        } else {
                            unpack(p[i / 2]).1
                        };
                        q as f64 * s[0] as f64
                    })
                    .sum();
                let t = v as f64 * 2f64.powi(true_shift(k, nibble_pos(i)));
                let max_s = scales.iter().map(|s| s[0] as f64).fold(0.0, f64::max);
                let bound = 31.0 * np as f64 * 2f64.powi(-24) * sum_s
                    + 2.0 * np as f64 * 2f64.powi(-127) * max_s;
                assert!(
                    (t - exact).abs() <= bound,
                    "round {round}: {t} {exact} {bound}"
                );
            }
        }
        // Zero scales: +0 sums; a NaN scale: NaN sums.
        let p = [0x9fu8, 0x71];
        let mut a = [1f32; 4];
        int4_sum_block(&[(&p, &[0.0]), (&p, &[0.0])], 0, 0, &mut a);
        assert_eq!(bits(&a), [0; 4]);
        int4_sum_block(&[(&p, &[1.0]), (&p, &[f32::NAN])], 0, 0, &mut a);
        assert!(a.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn mul_pow2_rounds_once() {
        let mut s = 3u64;
        for _ in 0..200_000 {
            let x = any_finite(&mut s);
            let t = (next(&mut s) % 380) as i32 - 126;
            // x 2^t is exact in f64; `as f32` rounds it once (to inf past f32::MAX).
            let want = (x as f64 * 2f64.powi(t)) as f32;
            assert_eq!(mul_pow2(x, t).to_bits(), want.to_bits(), "{x} {t}");
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
