//! Per-block kernels shared by every quantiser, so that the fused variants do exactly the
//! arithmetic of the plain ones (their bitwise-equality tests rely on it).
//!
//! Arithmetic, fixed here once:
//! - scale = absmax / qmax (one f32 division, round to nearest even), one ulp lower in the
//!   one case where qmax * scale would overflow to inf (see [`scale_of`]);
//! - q = round(clamp(x / scale, -qmax, qmax)) with round = half away from zero, the rounding
//!   of [`f32::round`]. Clamping before rounding equals clamping after (the bounds are
//!   integers and rounding is monotone). We divide rather than multiply by 1/scale: one
//!   rounding instead of two, so x = ±absmax always gives ±qmax.
//! - scale == 0 (an all-zero block, or absmax so small that absmax/qmax underflows to 0):
//!   every code is 0.
//! - dequantised value = q as f32 * scale.

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

/// Code of one element, given its block's nonzero scale.
#[inline(always)]
pub(crate) fn code(v: f32, scale: f32, qmax: f32) -> i32 {
    round_half_away((v / scale).clamp(-qmax, qmax))
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
    } else {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = code(v, scale, 127.0) as i8;
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
    } else {
        for (o, p) in out.iter_mut().zip(x.chunks_exact(2)) {
            *o = pack(code(p[0], scale, 7.0), code(p[1], scale, 7.0));
        }
    }
    Ok(scale)
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

/// Dequantise one INT4 block and add it into `acc` (same shapes as [`int4_deq_block`]).
#[inline]
pub(crate) fn int4_deq_add_block(packed: &[u8], scale: f32, acc: &mut [f32]) {
    for (o, &b) in acc.chunks_exact_mut(2).zip(packed) {
        let (lo, hi) = unpack(b);
        o[0] += lo as f32 * scale;
        o[1] += hi as f32 * scale;
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
