//! The scale domain of a block of summed INT4 pieces: the exact decode of a nibble, the one
//! shift of every piece's scale, and the sum of the pieces, one fma a piece ([`int4_sum_block`]),
//! which the fused GPU kernels repeat operation for operation.

use super::ABS;

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

#[cfg(test)]
mod tests {
    use super::super::rng::{any_finite, next};
    use super::super::unpack;
    use super::*;

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
}
