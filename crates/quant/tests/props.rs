//! Property tests of the quantisers over seeded random inputs, plus hand-checked examples.
//! Sizes: L elements, blocks of B, W = N x D slices of S.

use quant::*;

/// SplitMix64: a seeded generator, so every failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// L values in blocks of B, each block of one kind: zeros, a constant, random at a random
/// magnitude from 1e-38 to 1e38 (some subnormal entries), or random with zeros and ties.
fn gen(rng: &mut Rng, len: usize, block: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(len);
    while x.len() < len {
        let n = block.min(len - x.len());
        let mag = 2f32.powi(rng.below(250) as i32 - 125);
        match rng.below(6) {
            0 => x.extend(std::iter::repeat_n(0.0, n)),
            1 => {
                let c = rng.unit() * mag;
                x.extend(std::iter::repeat_n(c, n));
            }
            2 => x.extend((0..n).map(|_| {
                if rng.below(3) == 0 {
                    0.0
                } else {
                    rng.unit() * mag
                }
            })),
            3 => x.extend((0..n).map(|_| (rng.below(15) as f32 - 7.0) * 0.5 * mag)),
            _ => x.extend((0..n).map(|_| rng.unit() * mag)),
        }
    }
    x
}

fn check_bound(
    x: &[f32],
    y: &[f32],
    s: &[f32],
    block: usize,
    bound: fn(f32) -> f32,
    worst: &mut f64,
) {
    assert_eq!(x.len(), y.len());
    for (i, (a, b)) in x.iter().zip(y).enumerate() {
        let sc = s[i / block];
        let err = (a - b).abs();
        assert!(err <= bound(sc), "element {i}: x {a} deq {b} scale {sc}");
        if sc > f32::MIN_POSITIVE * 128.0 {
            *worst = worst.max(err as f64 / (0.5 * sc as f64));
        }
    }
}

#[test]
fn int8_round_trip_within_half_a_step() {
    let mut rng = Rng(1);
    let mut worst = 0f64;
    for _ in 0..2000 {
        let block = 1 + rng.below(100);
        let len = rng.below(600);
        let x = gen(&mut rng, len, block);
        let (q, s) = quantize_int8(&x, block).unwrap();
        assert_eq!((q.len(), s.len()), (len, len.div_ceil(block)));
        assert!(q.iter().all(|&c| (-127..=127).contains(&c)));
        let y = dequantize_int8(&q, &s, block);
        check_bound(&x, &y, &s, block, int8_bound, &mut worst);
    }
    println!("INT8 worst error / (scale/2) = {worst}");
    assert!(worst <= 1.0 + 1e-4);
}

#[test]
fn int4_round_trip_within_half_a_step() {
    let mut rng = Rng(2);
    let mut worst = 0f64;
    for _ in 0..2000 {
        let block = 2 * (1 + rng.below(50));
        let len = 2 * rng.below(300);
        let x = gen(&mut rng, len, block);
        let (p, s) = quantize_int4(&x, block).unwrap();
        assert_eq!((p.len(), s.len()), (len / 2, len.div_ceil(block)));
        let y = dequantize_int4(&p, &s, block);
        check_bound(&x, &y, &s, block, int4_bound, &mut worst);
    }
    println!("INT4 worst error / (scale/2) = {worst}");
    assert!(worst <= 1.0 + 1e-5);
}

#[test]
fn blocks_are_independent() {
    let mut rng = Rng(3);
    for _ in 0..500 {
        let block = 2 * (1 + rng.below(20));
        let nb = 1 + rng.below(10);
        let len = block * nb
            - if rng.below(2) == 0 {
                0
            } else {
                2 * rng.below(block / 2)
            };
        let x = gen(&mut rng, len, block);
        let b = rng.below(len.div_ceil(block));
        let mut x2 = x.clone();
        let end = ((b + 1) * block).min(len);
        let y = gen(&mut rng, end - b * block, block);
        x2[b * block..end].copy_from_slice(&y);
        let (q8, s8) = quantize_int8(&x, block).unwrap();
        let (r8, t8) = quantize_int8(&x2, block).unwrap();
        let (q4, s4) = quantize_int4(&x, block).unwrap();
        let (r4, t4) = quantize_int4(&x2, block).unwrap();
        for o in (0..s8.len()).filter(|&o| o != b) {
            let (lo, hi) = (o * block, ((o + 1) * block).min(len));
            assert_eq!(s8[o].to_bits(), t8[o].to_bits());
            assert_eq!(q8[lo..hi], r8[lo..hi]);
            assert_eq!(s4[o].to_bits(), t4[o].to_bits());
            assert_eq!(q4[lo / 2..hi / 2], r4[lo / 2..hi / 2]);
        }
    }
}

#[test]
fn zero_blocks_are_exact() {
    let x = [0.0f32, 0.0, 0.0, -0.0, 1.0, -2.0, 0.0, 0.0];
    let (q, s) = quantize_int8(&x, 4).unwrap();
    assert_eq!(s[0], 0.0);
    assert_eq!(&q[..4], &[0, 0, 0, 0]);
    assert_eq!(&dequantize_int8(&q, &s, 4)[..4], &[0.0; 4]);
    let (p, s) = quantize_int4(&x, 4).unwrap();
    assert_eq!(s[0], 0.0);
    assert_eq!(&p[..2], &[0, 0]);
    assert_eq!(&dequantize_int4(&p, &s, 4)[..4], &[0.0; 4]);
    // Zeros inside a nonzero block come back as exact zeros too.
    assert_eq!(dequantize_int4(&p, &s, 4)[6], 0.0);
}

/// Constant c across a block: q = ±qmax, deq = qmax * fl(|c| / qmax), sign restored.
/// Exhaustive over the binade [1, 2) (the result depends only on the significand while
/// c / qmax stays normal): exact for every significand below 1.75 (INT4) / 127/64 (INT8),
/// and for part of the rest.
#[test]
fn constant_block_exactness() {
    fn exact(c: f32, int4: bool) -> bool {
        let x = [c, c, -c, -c];
        let y = if int4 {
            let (p, s) = quantize_int4(&x, 2).unwrap();
            dequantize_int4(&p, &s, 2)
        } else {
            let (q, s) = quantize_int8(&x, 2).unwrap();
            dequantize_int8(&q, &s, 2)
        };
        y.iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits())
    }
    for (int4, limit) in [(true, 1.75f32), (false, 127.0 / 64.0)] {
        let (mut above, mut above_exact) = (0u32, 0u32);
        for bits in 1.0f32.to_bits()..2.0f32.to_bits() {
            let c = f32::from_bits(bits);
            let e = exact(c, int4);
            if c < limit {
                assert!(e, "int4 {int4}: constant {c} not exact");
            } else {
                above += 1;
                above_exact += e as u32;
            }
        }
        println!(
            "{}: exact for all significands < {limit}; above: {above_exact}/{above} = {:.3}",
            if int4 { "INT4" } else { "INT8" },
            above_exact as f64 / above as f64
        );
        // The rule carries over to other binades while c / qmax is normal.
        let mut rng = Rng(4);
        for _ in 0..20000 {
            let m = 1.0 + rng.unit().abs() * (limit - 1.0);
            let e = rng.below(240) as i32 - 118;
            let c = m * 2f32.powi(e);
            assert!(exact(c, int4), "int4 {int4}: {c}");
        }
    }
    // Powers of two, and the values the trainer tests use.
    for c in [
        1.0f32,
        0.5,
        0.1,
        -0.3,
        1.5e-3,
        1e-6,
        3.0,
        2f32.powi(100),
        2f32.powi(-100),
    ] {
        assert!(exact(c, true) && exact(c, false), "{c}");
    }
}

/// The qgZ data path of docs/design.md section 3 on one process, W = N x D ranks all holding the
/// same constant gradient c: quantise swizzled, hop 1 sum + requantise, hop 2 sum, divide by W.
/// Each piece dequantises to 7 fl(c / 7) = c + e, |e| <= ulp(c) / 2; the fused sums round in
/// the scale domain (`fused.rs`), where the bias 8 sum_j s_j is taken out by the first fma, so
/// the partial sums are larger than the result and the outcome is no longer exact for every
/// significand (as it was for significands below 4/3 with the earlier rule of plain fmas of
/// the codes): every result is within 2 ulps of c, and most are exact (the test prints the
/// share; 95.6% of the cases here).
#[test]
fn qgz_constant_gradient_reduces_within_two_ulps() {
    let mut rng = Rng(8);
    let (mut worst, mut exact, mut total) = (0i64, 0usize, 0usize);
    for (n, d) in [(2, 2), (2, 4), (4, 2), (4, 4)] {
        let w = n * d;
        let limit = if w == 4 { 1.75f32 } else { 4.0 / 3.0 };
        // By hand (significands 1, 1.2, 1.28, 1.6, 1.536), then random ones below the
        // limit at random exponents.
        let fixed = [1.0f32, -0.3, 1.25e-3, 0.1, 1.5e-3];
        let random: Vec<f32> = (0..40)
            .map(|_| {
                let m = 1.0 + rng.unit().abs() * (limit - 1.0);
                m * 2f32.powi(rng.below(120) as i32 - 60)
            })
            .collect();
        let significand = |c: f32| f32::from_bits((c.to_bits() & 0x007f_ffff) | 0x3f80_0000);
        for c in fixed.into_iter().chain(random) {
            if significand(c) >= limit {
                continue;
            }
            let s = 8; // slice length
            let block = 4;
            let grads: Vec<Vec<f32>> = (0..w).map(|_| vec![c; w * s]).collect();
            let sent: Vec<_> = grads
                .iter()
                .map(|g| quantize_int4_swizzled(g, n, d, block).unwrap())
                .collect();
            // Hop 1: rank (nn, dd) gets chunk dd (N slices) from every local peer.
            let chunk = n * s;
            let mut hop1 = vec![];
            for r in 0..w {
                let (nn, dd) = (r / d, r % d);
                let pieces: Vec<(&[u8], &[f32])> = (0..d)
                    .map(|peer| {
                        let (p, sc) = &sent[nn * d + peer];
                        (
                            &p[dd * chunk / 2..(dd + 1) * chunk / 2],
                            &sc[dd * chunk / block..(dd + 1) * chunk / block],
                        )
                    })
                    .collect();
                hop1.push(dequantize_sum_requantize_int4(&pieces, block).unwrap());
            }
            // Hop 2: rank (nn, dd) gets from each node n' the slice for itself.
            for r in 0..w {
                let (nn, dd) = (r / d, r % d);
                let pieces: Vec<(&[u8], &[f32])> = (0..n)
                    .map(|src_node| {
                        let (p, sc) = &hop1[src_node * d + dd];
                        (
                            &p[nn * s / 2..(nn + 1) * s / 2],
                            &sc[nn * s / block..(nn + 1) * s / block],
                        )
                    })
                    .collect();
                let sum = dequantize_sum_int4(&pieces, block).unwrap();
                for v in sum {
                    let ulps = ((v / w as f32).to_bits() as i64 - c.to_bits() as i64).abs();
                    worst = worst.max(ulps);
                    exact += (ulps == 0) as usize;
                    total += 1;
                    assert!(ulps <= 2, "N {n} D {d} c {c}: {} ulps", ulps);
                }
            }
        }
    }
    println!("constant gradients: worst {worst} ulps, exact {exact}/{total}");
}

/// The scale of a block holding an inf or NaN: the GPU kernels' quiet NaN.
const NAN_SCALE_BITS: u32 = 0x7fc0_0000;

/// `x` with the blocks of `block` elements that hold an inf or NaN zeroed, and which blocks those
/// were.
fn without_bad_blocks(x: &[f32], block: usize) -> (Vec<f32>, Vec<bool>) {
    let bad: Vec<bool> = x
        .chunks(block)
        .map(|c| c.iter().any(|v| !v.is_finite()))
        .collect();
    let mut clean = x.to_vec();
    for (c, &b) in clean.chunks_mut(block).zip(&bad) {
        if b {
            c.fill(0.0);
        }
    }
    (clean, bad)
}

/// Before issue 15 the CPU reference refused a non-finite input with an error (and the GPU gave
/// it a NaN scale), so a NaN gradient failed a qgZ run on the CPU instead of skipping the step.
/// Now both give a non-finite block scale NaN and codes 0: it dequantises to NaN, and every
/// other block is quantised exactly as if the bad one were zeros.
#[test]
fn non_finite_blocks_dequantise_to_nan_and_leave_the_others_alone() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.03125).collect();
        x[37] = bad;
        x[50] = f32::INFINITY;
        for block in [8, 64, 5] {
            let (clean, is_bad) = without_bad_blocks(&x, block);
            let (q, s) = quantize_int8(&x, block).unwrap();
            let (cq, cs) = quantize_int8(&clean, block).unwrap();
            let y = dequantize_int8(&q, &s, block);
            for (b, &nonfinite) in is_bad.iter().enumerate() {
                let r = b * block..((b + 1) * block).min(x.len());
                if nonfinite {
                    assert_eq!(s[b].to_bits(), NAN_SCALE_BITS, "{bad} block {block}");
                    assert!(q[r.clone()].iter().all(|&c| c == 0));
                    assert!(y[r].iter().all(|v| v.is_nan()), "{bad} block {block}");
                } else {
                    assert_eq!(s[b].to_bits(), cs[b].to_bits(), "{bad} block {block}");
                    assert_eq!(q[r.clone()], cq[r.clone()]);
                    assert!(y[r].iter().all(|v| v.is_finite()));
                }
            }
        }
        for block in [8, 64, 6] {
            let (clean, is_bad) = without_bad_blocks(&x, block);
            let (p, s) = quantize_int4(&x, block).unwrap();
            let (cp, cs) = quantize_int4(&clean, block).unwrap();
            let y = dequantize_int4(&p, &s, block);
            for (b, &nonfinite) in is_bad.iter().enumerate() {
                let r = b * block..((b + 1) * block).min(x.len());
                let pr = r.start / 2..r.end / 2;
                if nonfinite {
                    assert_eq!(s[b].to_bits(), NAN_SCALE_BITS);
                    assert!(p[pr].iter().all(|&c| c == 0));
                    assert!(y[r].iter().all(|v| v.is_nan()), "{bad} block {block}");
                } else {
                    assert_eq!((s[b].to_bits(), &p[pr.clone()]), (cs[b].to_bits(), &cp[pr]));
                }
            }
        }
        // Swizzled (N = 2, D = 4, S = 8): the NaN scales move with their slices.
        let (clean, _) = without_bad_blocks(&x, 4);
        let (p, s) = quantize_int4_swizzled(&x, 2, 4, 4).unwrap();
        let (ep, es) = quantize_int4(&swizzle(&x, 2, 4), 4).unwrap();
        assert_eq!((bits(&s), &p), (bits(&es), &ep));
        let (cp, cs) = quantize_int4_swizzled(&clean, 2, 4, 4).unwrap();
        let nan_blocks: Vec<usize> = (0..s.len()).filter(|&b| s[b].is_nan()).collect();
        // Elements 37 and 50: slices 4 and 6 (offsets 5 and 2), at positions 1 and 5, so
        // swizzled blocks 2 x 1 + 1 and 2 x 5 + 0.
        assert_eq!(nan_blocks, vec![3, 10]);
        for b in (0..s.len()).filter(|b| !nan_blocks.contains(b)) {
            assert_eq!(s[b].to_bits(), cs[b].to_bits());
            assert_eq!(p[2 * b..2 * b + 2], cp[2 * b..2 * b + 2]);
        }
    }
    // The requantiser: a NaN piece scale, or a sum that overflows, gives that block a NaN scale
    // and codes 0; the other blocks are as without it.
    let (p, s) = quantize_int4(&[1.0, 1.0, 1.0, 1.0, 0.5, -0.5], 2).unwrap();
    let nan_scale = [1.0 / 7.0, f32::NAN, s[2]];
    let pieces = [(&p[..], &s[..]), (&p[..], &nan_scale[..])];
    let sum = dequantize_sum_int4(&pieces, 2).unwrap();
    assert!(sum[2].is_nan() && sum[3].is_nan(), "{sum:?}");
    assert!(sum[..2].iter().chain(&sum[4..]).all(|v| v.is_finite()));
    let (q, qs) = dequantize_sum_requantize_int4(&pieces, 2).unwrap();
    assert_eq!(qs[1].to_bits(), NAN_SCALE_BITS);
    assert_eq!(q[1], 0);
    assert!(qs[0].is_finite() && qs[2].is_finite());
    assert_eq!(dequantize_int4(&q, &qs, 2)[..2], sum[..2]);
    let big = quantize_int4(&[f32::MAX, 0.0, 0.0, f32::MAX], 2).unwrap();
    let pieces = [(&big.0[..], &big.1[..]), (&big.0[..], &big.1[..])];
    let sum = dequantize_sum_int4(&pieces, 2).unwrap();
    assert!(sum[0].is_infinite());
    let (q, qs) = dequantize_sum_requantize_int4(&pieces, 2).unwrap();
    assert_eq!(bits(&qs), vec![NAN_SCALE_BITS; 2]);
    assert_eq!(q, vec![0, 0]);
}

#[test]
fn bad_arguments_are_refused() {
    assert_eq!(quantize_int8(&[1.0], 0), Err(QuantError::ZeroBlock));
    assert_eq!(quantize_int4(&[1.0, 2.0], 0), Err(QuantError::ZeroBlock));
    assert_eq!(quantize_int4(&[1.0, 2.0], 3), Err(QuantError::OddBlock));
    assert!(matches!(
        quantize_int4(&[1.0, 2.0, 3.0], 2),
        Err(QuantError::BadLength { got: 3, .. })
    ));
    let x = vec![1.0f32; 48];
    // W = 8, S = 6, block 4: a block would straddle slices.
    assert!(matches!(
        quantize_int4_swizzled(&x, 2, 4, 4),
        Err(QuantError::BadLength {
            got: 6,
            expected: 8,
            ..
        })
    ));
    assert!(matches!(
        quantize_int4_swizzled(&x, 5, 1, 2),
        Err(QuantError::BadLength { got: 48, .. })
    ));
    assert!(matches!(
        quantize_int4_swizzled(&x, 0, 4, 2),
        Err(QuantError::BadLength { .. })
    ));
    assert_eq!(
        quantize_int4_swizzled(&x, 2, 4, 3),
        Err(QuantError::OddBlock)
    );
    let (p, s) = quantize_int4(&x, 4).unwrap();
    let short = &p[..4];
    assert!(matches!(
        dequantize_sum_int4(&[(&p, &s), (short, &s)], 4),
        Err(QuantError::BadLength {
            got: 4,
            expected: 24,
            ..
        })
    ));
    assert!(matches!(
        dequantize_sum_int4(&[(&p, &s[..3])], 4),
        Err(QuantError::BadLength {
            got: 3,
            expected: 12,
            ..
        })
    ));
    assert_eq!(
        dequantize_sum_requantize_int4(&[(&p, &s)], 0),
        Err(QuantError::ZeroBlock)
    );
    assert_eq!(dequantize_sum_int4(&[], 4), Ok(vec![]));
    assert_eq!(dequantize_sum_requantize_int4(&[], 4), Ok((vec![], vec![])));
}

#[test]
fn nibble_packing_by_hand() {
    // Block [1, -1, 7, -7, 0, 3, -4, 2]: absmax 7, scale 1, codes as written.
    // Byte i holds element 2i in bits 0..4 and element 2i+1 in bits 4..8, two's complement:
    // (1, -1) -> 0xF1; (7, -7) -> 0x97; (0, 3) -> 0x30; (-4, 2) -> 0x2C.
    let x = [1.0f32, -1.0, 7.0, -7.0, 0.0, 3.0, -4.0, 2.0];
    let (p, s) = quantize_int4(&x, 8).unwrap();
    assert_eq!(s, vec![1.0]);
    assert_eq!(p, vec![0xF1, 0x97, 0x30, 0x2C]);
    assert_eq!(dequantize_int4(&p, &s, 8), x.to_vec());
    // [1, -1] alone: scale 1/7, codes 7, -7 -> 0x97.
    let (p, s) = quantize_int4(&[1.0, -1.0], 2).unwrap();
    assert_eq!((p, s), (vec![0x97], vec![1.0 / 7.0]));
    // Ties round to even (scale 1, so x * fl(1 / scale) = x exactly): 0.5, -2.5, 1.5, -3.5
    // steps give 0, -2, 2, -4.
    let (p, _) = quantize_int4(&[0.5, -2.5, 7.0, 0.0, 1.5, -3.5], 6).unwrap();
    assert_eq!(p, vec![0xE0, 0x07, 0xC2]); // 0, -2 | 7, 0 | 2, -4
    let (q, _) = quantize_int8(&[0.5, -2.5, 127.0, 1.5, -3.5], 5).unwrap();
    assert_eq!(q, vec![0, -2, 127, 2, -4]);
}

#[test]
fn swizzle_matches_the_formula_by_hand() {
    // N = 2, D = 4, S = 1: slice p -> (p % 4) * 2 + p / 4. Position q holds slice
    // (q % 2) * 4 + q / 2: [0, 4, 1, 5, 2, 6, 3, 7]; chunk d (2 slices) = slices {d, 4 + d}.
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    assert_eq!(
        swizzle(&x, 2, 4),
        vec![0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]
    );
    // N = 3, D = 2, S = 2: slice p -> (p % 2) * 3 + p / 2; positions hold slices
    // [0, 2, 4, 1, 3, 5].
    let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let want: Vec<f32> = [0, 2, 4, 1, 3, 5]
        .iter()
        .flat_map(|&p| [2.0 * p as f32, 2.0 * p as f32 + 1.0])
        .collect();
    assert_eq!(swizzle(&x, 3, 2), want);
    assert_eq!(unswizzle(&want, 3, 2), x);
}

#[test]
fn swizzle_and_unswizzle_invert() {
    let mut rng = Rng(5);
    for _ in 0..300 {
        let (n, d, s) = (1 + rng.below(5), 1 + rng.below(5), rng.below(7));
        let x: Vec<f32> = (0..n * d * s).map(|_| rng.unit()).collect();
        let y = swizzle(&x, n, d);
        assert_eq!(unswizzle(&y, n, d), x);
        assert_eq!(swizzle(&unswizzle(&x, n, d), n, d), x);
        for p in 0..n * d {
            let q = (p % d) * n + p / d;
            assert_eq!(y[q * s..(q + 1) * s], x[p * s..(p + 1) * s]);
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn fused_quantize_swizzled_equals_composition() {
    let mut rng = Rng(6);
    for _ in 0..500 {
        let (n, d) = (1 + rng.below(4), 1 + rng.below(8));
        let block = 2 * (1 + rng.below(8));
        let s = block * rng.below(5);
        let x = gen(&mut rng, n * d * s, block);
        let (p, sc) = quantize_int4_swizzled(&x, n, d, block).unwrap();
        let (p2, sc2) = quantize_int4(&swizzle(&x, n, d), block).unwrap();
        assert_eq!(p, p2);
        assert_eq!(bits(&sc), bits(&sc2));
    }
}

/// INT4 code of element i of a packed buffer (the layout of the module doc of int4.rs).
fn code(packed: &[u8], i: usize) -> i8 {
    let b = packed[i / 2];
    if i.is_multiple_of(2) {
        ((b << 4) as i8) >> 4
    } else {
        (b as i8) >> 4
    }
}

/// INT4 scale of block b of piece j.
fn piece_scale(pieces: &[(&[u8], &[f32])], j: usize, b: usize) -> f32 {
    pieces[j].1[b]
}

/// The fused sum is within the bound of the module doc of `fused.rs` (31 P 2^-24 sum_j |s_j|,
/// plus 2^-127 max_j |s_j| a rounding in the domain's subnormal range, plus the last rounding
/// to f32) of the exact sum (f64: exact here, as every product q s is, and the f64 sum of at
/// most 8 of them errs far below the bound); with one piece it is `dequantize_int4` wherever
/// that is normal; and the requantised sum is `quantize_int4` of the sum block by block, the
/// scale always, the codes wherever the block of the sum holds no subnormal value.
#[test]
fn fused_sums_within_the_bound_and_requantise_as_quantize() {
    let mut rng = Rng(7);
    let (mut worst, mut skipped) = (0f64, 0usize);
    for _ in 0..500 {
        let block = 2 * (1 + rng.below(40));
        let len = 2 * rng.below(400);
        let k = 1 + rng.below(8);
        let q: Vec<_> = (0..k)
            .map(|_| quantize_int4(&gen(&mut rng, len, block), block).unwrap())
            .collect();
        let pieces: Vec<(&[u8], &[f32])> = q.iter().map(|(p, s)| (&p[..], &s[..])).collect();
        let sum = dequantize_sum_int4(&pieces, block).unwrap();
        for (i, &v) in sum.iter().enumerate() {
            let b = i / block;
            let ss: Vec<f64> = (0..k).map(|j| piece_scale(&pieces, j, b) as f64).collect();
            let exact: f64 = (0..k).map(|j| code(pieces[j].0, i) as f64 * ss[j]).sum();
            let (sum_s, max_s) = (
                ss.iter().sum::<f64>(),
                ss.iter().fold(0f64, |a, &b| a.max(b)),
            );
            let half_ulp = if v.is_finite() {
                (v.abs().next_up() - v.abs()) as f64 / 2.0
            } else {
                0.0
            };
            let bound = 31.0 * k as f64 * 2f64.powi(-24) * sum_s
                + 2.0 * k as f64 * 2f64.powi(-127) * max_s
                + half_ulp;
            if exact.abs() < f32::MAX as f64 {
                assert!(
                    (v as f64 - exact).abs() <= bound,
                    "{i}: {v} {exact} {bound}"
                );
                if sum_s > 0.0 {
                    worst = worst.max((v as f64 - exact).abs() / (2f64.powi(-24) * max_s));
                }
            }
        }
        if k == 1 {
            let d = dequantize_int4(pieces[0].0, pieces[0].1, block);
            for (a, b) in sum.iter().zip(&d) {
                if !b.is_subnormal() {
                    assert_eq!(a.to_bits(), b.to_bits());
                }
            }
        }
        match dequantize_sum_requantize_int4(&pieces, block) {
            Ok((p, s)) => {
                for (b, sb) in sum.chunks(block).enumerate() {
                    let (p2, s2) = quantize_int4(sb, block).unwrap();
                    assert_eq!(s[b].to_bits(), s2[0].to_bits(), "block {b}");
                    let pb = &p[b * block / 2..b * block / 2 + p2.len()];
                    if sb.iter().any(|v| v.is_subnormal()) {
                        skipped += (pb != &p2[..]) as usize;
                    } else {
                        assert_eq!(pb, &p2[..], "block {b}");
                    }
                }
            }
            Err(e) => assert_eq!(Err(e), quantize_int4(&sum, block).map(|_| ())),
        }
    }
    println!(
        "worst error {worst:.2} 2^-24 max |s_j|; subnormal blocks with other codes: {skipped}"
    );
}

#[test]
fn extreme_magnitudes() {
    // Largest finite values: scale MAX / 7 and the products stay finite.
    for x in [
        [f32::MAX, -f32::MAX, 1.0, 0.0],
        [f32::MAX, f32::MAX, f32::MAX, f32::MAX],
    ] {
        let (p, s) = quantize_int4(&x, 4).unwrap();
        let y = dequantize_int4(&p, &s, 4);
        assert!(y.iter().all(|v| v.is_finite()), "{y:?}");
        let (q, s) = quantize_int8(&x, 4).unwrap();
        let y = dequantize_int8(&q, &s, 4);
        assert!(y.iter().all(|v| v.is_finite()), "{y:?}");
    }
    // Subnormal blocks: scale may underflow to 0 (codes 0); the bound still holds.
    for x in [
        [f32::from_bits(1), 0.0],
        [f32::from_bits(7), -f32::from_bits(3)],
        [f32::MIN_POSITIVE, 1e-40],
    ] {
        let (p, s) = quantize_int4(&x, 2).unwrap();
        let y = dequantize_int4(&p, &s, 2);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= int4_bound(s[0]), "{x:?} {y:?} {s:?}");
        }
        let (q, s) = quantize_int8(&x, 2).unwrap();
        let y = dequantize_int8(&q, &s, 2);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= int8_bound(s[0]), "{x:?} {y:?} {s:?}");
        }
    }
}
