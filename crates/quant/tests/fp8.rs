//! FP8 E4M3 against torch and torchao (the fixture tests/fixtures/fp8_e4m3.json, written by
//! scripts/fp8-fixture.py), then properties of the block quantiser over seeded random inputs.
//! Sizes: L elements, blocks of B.

use quant::*;
use serde_json::Value;

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

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fp8_e4m3.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn uint(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| f32::from_bits(uint(b) as u32))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn decode_equals_torch_bit_for_bit() {
    let f = fixture();
    let want = f32s(&f["decode"]);
    assert_eq!(want.len(), 256);
    for (c, w) in want.iter().enumerate() {
        assert_eq!(
            e4m3_decode(c as u8).to_bits(),
            w.to_bits(),
            "code {c:#04x} (torch {})",
            f["torch"]
        );
    }
}

/// Our encoding is torch's of x.clamp(-448, 448) bit for bit. Of x cast as it is, torch 2.15's
/// too (it saturates); older torch instead gave NaN codes from 464 up (values that round to
/// 480, S.1111.111): where the fixture's cast differs from ours, it is that.
#[test]
fn encode_equals_torch_bit_for_bit() {
    let f = fixture();
    let cases = f["encode"].as_array().unwrap();
    assert!(cases.len() > 1000);
    let (mut ties, mut nan_casts) = (0, 0);
    for case in cases {
        let x = f32::from_bits(uint(&case[0]) as u32);
        let (clamped, cast) = (uint(&case[1]) as u8, uint(&case[2]) as u8);
        let ours = e4m3_encode(x);
        assert_eq!(ours, clamped, "{x} ({:#010x})", x.to_bits());
        if cast != ours {
            assert!(
                x.abs() > 464.0 && cast & 0x7f == 0x7f,
                "{x}: cast {cast:#x}"
            );
            nan_casts += 1;
        }
        // A tie: x halfway between two neighbouring codes (both finite).
        let a = x.abs();
        if a < E4M3_MAX && a != e4m3_decode(clamped & 0x7f) {
            let c = clamped & 0x7f;
            let other = if e4m3_decode(c) < a { c + 1 } else { c - 1 };
            let (d0, d1) = (
                (a as f64 - e4m3_decode(c) as f64).abs(),
                (a as f64 - e4m3_decode(other) as f64).abs(),
            );
            assert!(d0 <= d1, "{x}");
            if d0 == d1 {
                assert_eq!(c % 2, 0, "{x}: a tie goes to the even code");
                ties += 1;
            }
        }
    }
    assert!(ties >= 200, "{ties} ties");
    println!(
        "torch {}: {} encodings, {ties} ties, {nan_casts} NaN casts",
        f["torch"],
        cases.len()
    );
}

/// torchao's dynamic scaling, one scale a row (rowwise; tensorwise for a single row): our
/// codes are its codes and our multiplier its `scale`, bit for bit; our stored scale is
/// fl32(max(amax, 1e-12) / 448). Rows of one matrix are quantised together, `block` = C.
#[test]
fn quantize_equals_torchao_rowwise() {
    let f = fixture();
    let rows = f["rows"].as_array().unwrap();
    let mut i = 0;
    while i < rows.len() {
        let cols = rows[i]["x"].as_array().unwrap().len();
        let n = rows[i..]
            .iter()
            .take_while(|r| r["x"].as_array().unwrap().len() == cols)
            .count();
        let mat = &rows[i..i + n];
        let x: Vec<f32> = mat.iter().flat_map(|r| f32s(&r["x"])).collect();
        let (q, s) = quantize_fp8_e4m3(&x, cols).unwrap();
        for (r, row) in mat.iter().enumerate() {
            let want: Vec<u8> = row["codes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| uint(c) as u8)
                .collect();
            assert_eq!(q[r * cols..(r + 1) * cols], want[..], "row {}", i + r);
            let amax = f32s(&row["x"]).iter().fold(0f32, |m, v| m.max(v.abs()));
            let (scale, m) = fp8_e4m3_scale(amax);
            assert_eq!(
                m.to_bits(),
                uint(&row["multiplier"]) as u32,
                "row {}",
                i + r
            );
            assert_eq!(scale.to_bits(), s[r].to_bits());
            let want_scale = ((amax as f64).max(1e-12) / 448.0) as f32;
            if (want_scale * 448.0).is_finite() {
                assert_eq!(scale, want_scale, "row {}", i + r);
            } else {
                assert_eq!(scale, want_scale.next_down(), "row {}", i + r);
            }
        }
        let y = dequantize_fp8_e4m3(&q, &s, cols);
        for (j, (a, b)) in x.iter().zip(&y).enumerate() {
            assert!((a - b).abs() <= fp8_e4m3_bound(*a, s[j / cols]), "{a} {b}");
        }
        i += n;
    }
    assert!(i >= 16);
}

/// L values in blocks of B, each block of one kind: zeros (some -0), a constant, random at a
/// magnitude from 2^-125 to 2^125, random over a wide dynamic range (e4m3 subnormal codes), or
/// exact ties of the e4m3 grid at a power-of-two scale.
fn gen(rng: &mut Rng, len: usize, block: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(len);
    while x.len() < len {
        let n = block.min(len - x.len());
        let mag = 2f32.powi(rng.below(250) as i32 - 125);
        match rng.below(6) {
            0 => x.extend((0..n).map(|i| if i % 3 == 1 { -0.0 } else { 0.0 })),
            1 => {
                let c = rng.unit() * mag;
                x.extend(std::iter::repeat_n(c, n));
            }
            2 => x.extend((0..n).map(|_| rng.unit() * mag * 2f32.powi(-(rng.below(24) as i32)))),
            3 => {
                // Absmax 448 mag (mag a power of two: multiplier 1 / mag and scale mag, both
                // exact), the others (k + 1/2) 2^-9 mag: exact ties between neighbouring codes
                // at the subnormal step and the first normals.
                let mag = mag.min(2f32.powi(100));
                x.extend((0..n).map(|i| {
                    let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                    if i == 0 {
                        448.0 * mag * sign
                    } else {
                        (rng.below(16) as f32 + 0.5) * 2f32.powi(-9) * mag * sign
                    }
                }))
            }
            _ => x.extend((0..n).map(|_| rng.unit() * mag)),
        }
    }
    x
}

#[test]
fn round_trip_within_the_bound() {
    let mut rng = Rng(40);
    let mut worst = 0f64;
    for _ in 0..3000 {
        let block = 1 + rng.below(100);
        let len = rng.below(600);
        let x = gen(&mut rng, len, block);
        let (q, s) = quantize_fp8_e4m3(&x, block).unwrap();
        assert_eq!((q.len(), s.len()), (len, len.div_ceil(block)));
        assert!(
            q.iter().all(|&c| c & 0x7f != 0x7f),
            "no NaN code from finite input"
        );
        let y = dequantize_fp8_e4m3(&q, &s, block);
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            let sc = s[i / block];
            let err = (a - b).abs();
            assert!(
                err <= fp8_e4m3_bound(*a, sc),
                "element {i}: x {a} deq {b} scale {sc}"
            );
            worst = worst.max(err as f64 / (a.abs() as f64 / 16.0).max(sc as f64 / 1024.0));
        }
    }
    println!("FP8 worst error / max(|x| / 16, scale / 1024) = {worst}");
    // The bound's leading term is reached (a tie of the subnormal step), and only by roundings.
    assert!(worst > 0.99 && worst <= 1.0 + 1e-5, "{worst}");
}

/// Every block whose absmax is at least 1e-12 (and finite) codes it as ±448 (0x7E / 0xFE);
/// below, the multiplier is torchao's fixed 448e12 and the codes stay smaller.
#[test]
fn absmax_codes_448() {
    let mut rng = Rng(41);
    let mut seen = 0;
    for _ in 0..3000 {
        let block = 1 + rng.below(64);
        let x = gen(&mut rng, block, block);
        let (q, s) = quantize_fp8_e4m3(&x, block).unwrap();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(s[0].to_bits(), fp8_e4m3_scale(amax).0.to_bits());
        for (v, c) in x.iter().zip(&q) {
            if (amax as f64) >= 1e-12 && v.abs() == amax {
                assert_eq!(*c, if *v > 0.0 { 0x7e } else { 0xfe }, "{v}");
                seen += 1;
            } else {
                assert!(e4m3_decode(c & 0x7f) <= E4M3_MAX);
            }
        }
        if (amax as f64) < 1e-12 {
            assert!(q.iter().all(|&c| c & 0x7f < 0x7e));
        }
    }
    assert!(seen > 1000);
    // By hand: absmax 1 (scale 1 / 448, multiplier 448), and 448 itself (both 1).
    let (q, s) = quantize_fp8_e4m3(&[1.0, -1.0, 0.5, 448.0, -448.0, 1.0], 3).unwrap();
    assert_eq!(q, vec![0x7e, 0xfe, 0x76, 0x7e, 0xfe, 0x38]);
    assert_eq!(s, vec![1.0 / 448.0, 1.0]);
}

/// All-zero blocks: scale fl32(1e-12 / 448), codes 0 and 0x80 for -0, dequantised bitwise
/// (signs kept). A block whose absmax is below 1e-12 keeps torchao's floor.
#[test]
fn zero_blocks_are_exact() {
    let x = [0.0f32, -0.0, 0.0, -0.0, 1.0, -2.0, 0.0, -0.0];
    let (q, s) = quantize_fp8_e4m3(&x, 4).unwrap();
    assert_eq!(s[0], (1e-12f64 / 448.0) as f32);
    assert_eq!(&q[..4], &[0x00, 0x80, 0x00, 0x80]);
    let y = dequantize_fp8_e4m3(&q, &s, 4);
    assert_eq!(bits(&y), bits(&x));
    // Tiny blocks: 1e-13 x 4.48e14 = 44.8 -> 44 (the codes' grid there is 4).
    let (q, s) = quantize_fp8_e4m3(&[1e-13, -1e-13], 2).unwrap();
    assert_eq!(s[0], (1e-12f64 / 448.0) as f32);
    assert_eq!(e4m3_decode(q[0]), 44.0);
    assert_eq!(q[1], q[0] | 0x80);
}

/// A block holding an inf or NaN: scale NaN (the quiet NaN of INT8's rule), codes 0, every
/// element dequantised to NaN; the other blocks are as if it were zeros.
#[test]
fn non_finite_blocks_dequantise_to_nan_and_leave_the_others_alone() {
    for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        x[37] = bad;
        x[50] = f32::INFINITY;
        for block in [8, 64, 5, 1] {
            let mut clean = x.clone();
            let is_bad: Vec<bool> = x
                .chunks(block)
                .map(|c| c.iter().any(|v| !v.is_finite()))
                .collect();
            for (c, &b) in clean.chunks_mut(block).zip(&is_bad) {
                if b {
                    c.fill(0.0);
                }
            }
            let (q, s) = quantize_fp8_e4m3(&x, block).unwrap();
            let (cq, cs) = quantize_fp8_e4m3(&clean, block).unwrap();
            let y = dequantize_fp8_e4m3(&q, &s, block);
            for (b, &nonfinite) in is_bad.iter().enumerate() {
                let r = b * block..((b + 1) * block).min(x.len());
                if nonfinite {
                    assert_eq!(s[b].to_bits(), 0x7fc0_0000, "{bad} block {block}");
                    assert!(q[r.clone()].iter().all(|&c| c == 0));
                    assert!(y[r].iter().all(|v| v.is_nan()), "{bad} block {block}");
                } else {
                    assert_eq!(s[b].to_bits(), cs[b].to_bits(), "{bad} block {block}");
                    assert_eq!(q[r.clone()], cq[r.clone()]);
                    assert!(y[r].iter().all(|v| v.is_finite()));
                }
            }
        }
    }
    // The element encoder alone keeps a NaN NaN, with its sign.
    assert_eq!(e4m3_encode(f32::NAN), 0x7f);
    assert_eq!(e4m3_encode(-f32::NAN), 0xff);
    assert_eq!(e4m3_encode(f32::INFINITY), 0x7e);
}

/// Near f32::MAX the stored scale is one ulp lower (as INT8's), so 448 x scale stays finite.
#[test]
fn extreme_magnitudes() {
    let x = [f32::MAX, -f32::MAX, 1.0, f32::MAX / 3.0];
    let (q, s) = quantize_fp8_e4m3(&x, 4).unwrap();
    assert_eq!(&q[..2], &[0x7e, 0xfe]);
    assert_eq!(q[2], 0);
    let y = dequantize_fp8_e4m3(&q, &s, 4);
    assert!(y.iter().all(|v| v.is_finite()), "{y:?}");
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b).abs() <= fp8_e4m3_bound(*a, s[0]), "{a} {b}");
    }
    // f32 subnormals: absmax below 1e-12, so multiplier 448e12 and a subnormal code grid.
    let x = [f32::from_bits(1), f32::from_bits(0x7f_ffff), 0.0];
    let (q, s) = quantize_fp8_e4m3(&x, 3).unwrap();
    assert_eq!(q, vec![0, 0, 0]); // 1.2e-38 x 4.5e14 < 2^-10
    assert!(dequantize_fp8_e4m3(&q, &s, 3).iter().all(|&v| v == 0.0));
}

#[test]
fn bad_arguments_are_refused() {
    assert_eq!(quantize_fp8_e4m3(&[1.0], 0), Err(QuantError::ZeroBlock));
    assert_eq!(quantize_fp8_e4m3(&[], 4), Ok((vec![], vec![])));
}

#[test]
#[should_panic(expected = "one scale per block")]
fn dequantize_refuses_a_wrong_scale_count() {
    dequantize_fp8_e4m3(&[0; 5], &[1.0], 4);
}

#[test]
#[should_panic(expected = "block size must be positive")]
fn dequantize_refuses_block_zero() {
    dequantize_fp8_e4m3(&[0; 5], &[1.0; 5], 0);
}
