//! The quantisation kernels (`quant::tensor` on CUDA tensors) equal the CPU reference bitwise:
//! codes, scales and dequantised values, on mixed magnitudes, zero blocks, short last blocks,
//! several swizzle topologies and piece counts.

use crate::common::{f32_bits, f32_values};
use candle_core::{DType, Device, Tensor};
use quant::tensor;

fn gpu() -> Device {
    Device::new_cuda(0).expect("a CUDA device")
}

/// Deterministic pseudo-random values over many binades (1e-30 .. 1e30, subnormals), with some
/// all-zero blocks of `zero_block` elements, exact half steps, a few near f32::MAX, blocks of
/// exact ties for the codes (power-of-two scales: INT8 scale 2^-3, INT4 scale 2^-2, values
/// (k + 1/2) scale) and all-subnormal blocks (scales whose reciprocal overflows: the division
/// fallback).
fn mixed(n: usize, seed: u64, zero_block: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut x: Vec<f32> = (0..n)
        .map(|_| {
            let r = next();
            let mant = (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            let exp = ((r >> 8) % 24) as i32 - 12;
            match r % 16 {
                0 => 0.0,
                1 => mant * 1e-30,
                2 => mant * 1e30,
                3 => f32::from_bits((r >> 32) as u32 & 0x007f_ffff), // subnormal
                4 => (((r >> 20) % 15) as f32 - 7.0) * 0.5,          // half steps
                _ => mant * 2f32.powi(exp),
            }
        })
        .collect();
    // Zero every 5th block, and put f32::MAX-scale values into every 7th.
    for (b, c) in x.chunks_mut(zero_block.max(1)).enumerate() {
        if b % 5 == 3 {
            c.fill(0.0);
        }
        if b % 11 == 6 || b % 13 == 9 {
            // absmax 127 * 2^-3 (INT8 scale 2^-3) or 7 * 2^-2 (INT4 scale 2^-2).
            let (q, step) = if b % 11 == 6 { (127, 0.125) } else { (7, 0.25) };
            for v in c.iter_mut() {
                let k = (next() % (2 * q)) as f32 - q as f32;
                *v = (k + 0.5) * step;
            }
            c[0] = q as f32 * step;
        }
        if b % 17 == 10 {
            for v in c.iter_mut() {
                let r = next();
                *v = f32::from_bits((r as u32 & 0x001f_ffff) | ((r >> 63) as u32) << 31);
            }
        }
        if b % 7 == 4 {
            c[0] = f32::MAX;
            if c.len() > 1 {
                c[1] = -f32::MAX;
            }
        }
    }
    x
}

fn bytes(t: &Tensor) -> Vec<u8> {
    t.to_vec1::<u8>().unwrap()
}

fn both(x: &[f32], gpu: &Device) -> (Tensor, Tensor) {
    (
        Tensor::new(x, &Device::Cpu).unwrap(),
        Tensor::new(x, gpu).unwrap(),
    )
}

#[test]
fn int8_quantise_and_dequantise_equal_the_reference() {
    // One device for the whole test: each `Device::new_cuda` is a distinct candle device.
    let gpu = gpu();
    for &(n, block) in &[
        (2048 * 9 + 100, 2048),
        (2048 * 4, 2048),
        (4096 * 3 + 1, 4096),
        (512 * 7 + 33, 512),
        (96 * 11 + 5, 96),
        (32 * 3 + 31, 32),
        (160, 64),
        (2048 * 64 + 4, 2048),
    ] {
        let x = mixed(n, n as u64 + block as u64, block);
        let (cx, gx) = both(&x, &gpu);
        let (cq, cs) = tensor::quantize_int8(&cx, block).unwrap();
        let (gq, gs) = tensor::quantize_int8(&gx, block).unwrap();
        assert_eq!(bytes(&gq), bytes(&cq), "codes n={n} block={block}");
        assert_eq!(f32_bits(&gs), f32_bits(&cs), "scales n={n} block={block}");
        for dtype in [DType::F32, DType::BF16] {
            let cy = tensor::dequantize_int8(&cq, &cs, block, dtype).unwrap();
            let gy = tensor::dequantize_int8(&gq, &gs, block, dtype).unwrap();
            assert_eq!(gy.dtype(), dtype);
            assert_eq!(
                f32_bits(&gy),
                f32_bits(&cy),
                "dequant {dtype:?} n={n} block={block}"
            );
        }
    }
}

#[test]
fn int8_on_an_unaligned_view_equals_the_reference() {
    let gpu = gpu();
    let x = mixed(2048 * 3 + 7, 11, 2048);
    let (cx, gx) = both(&x, &gpu);
    let (cx, gx) = (
        cx.narrow(0, 3, 2048 * 3).unwrap(),
        gx.narrow(0, 3, 2048 * 3).unwrap(),
    );
    let (cq, cs) = tensor::quantize_int8(&cx, 2048).unwrap();
    let (gq, gs) = tensor::quantize_int8(&gx, 2048).unwrap();
    assert_eq!(bytes(&gq), bytes(&cq));
    assert_eq!(f32_bits(&gs), f32_bits(&cs));
    let (cq1, gq1) = (
        cq.narrow(0, 5, 4096).unwrap(),
        gq.narrow(0, 5, 4096).unwrap(),
    );
    let (cs1, gs1) = (cs.narrow(0, 1, 2).unwrap(), gs.narrow(0, 1, 2).unwrap());
    // Codes 5.. are not block-aligned for the reference either: equal all the same.
    let cy = tensor::dequantize_int8(&cq1, &cs1, 2048, DType::F32).unwrap();
    let gy = tensor::dequantize_int8(&gq1, &gs1, 2048, DType::F32).unwrap();
    assert_eq!(f32_bits(&gy), f32_bits(&cy));
}

#[test]
fn int4_swizzled_quantise_equals_the_reference() {
    let gpu = gpu();
    for &(nodes, rpn, s, block) in &[
        (2, 4, 512 * 3, 512),
        (3, 2, 512 * 2, 512),
        (1, 1, 512 * 5, 512),
        (2, 2, 256 * 3, 256),
        (3, 2, 96 * 4, 96),
        (2, 4, 32, 32),
        (1, 8, 2048, 2048),
    ] {
        let x = mixed(nodes * rpn * s, (nodes * 100 + rpn) as u64, block);
        let (cx, gx) = both(&x, &gpu);
        let (cp, cs) = tensor::quantize_int4_swizzled(&cx, nodes, rpn, block).unwrap();
        let (gp, gs) = tensor::quantize_int4_swizzled(&gx, nodes, rpn, block).unwrap();
        let at = format!("{nodes}x{rpn} S={s} block={block}");
        assert_eq!(bytes(&gp), bytes(&cp), "packed {at}");
        assert_eq!(f32_bits(&gs), f32_bits(&cs), "scales {at}");
    }
}

/// `pieces` pieces of `len` elements each (INT4 of mixed data), concatenated, on the CPU.
fn pieces(pieces: usize, len: usize, block: usize) -> (Tensor, Tensor) {
    let mut packed = Vec::new();
    let mut scales = Vec::new();
    for j in 0..pieces {
        let mut x = mixed(len, 1000 + j as u64 * 17 + len as u64, block);
        // Keep the sums finite: no f32::MAX-scale values in the pieces that are summed.
        for v in &mut x {
            if v.abs() > 1e36 {
                *v = v.signum() * 1e36;
            }
        }
        let (p, s) = quant::quantize_int4(&x, block).unwrap();
        packed.extend(p);
        scales.extend(s);
    }
    let (np, ns) = (packed.len(), scales.len());
    (
        Tensor::from_vec(packed, np, &Device::Cpu).unwrap(),
        Tensor::from_vec(scales, ns, &Device::Cpu).unwrap(),
    )
}

#[test]
fn fused_int4_sums_equal_the_reference() {
    // One device for both inputs: each `Device::new_cuda` is a distinct candle device.
    let gpu = gpu();
    for &(k, len, block) in &[
        (4, 512 * 6, 512),
        (4, 512 * 6 + 130, 512),
        (2, 512 * 3 + 2, 512),
        (3, 96 * 5 + 40, 96),
        (8, 256 * 4 + 18, 256),
        (5, 2048 * 2 + 1030, 2048),
        (1, 32 * 7 + 6, 32),
        (6, 64 * 9 + 2, 64),
        (4, 512 * 64, 512),
        (4, 2048 * 16, 2048),
        // 16-byte aligned pieces (the vector path) with more pieces than one load group.
        (8, 512 * 8, 512),
        (6, 2048 * 4, 2048),
        (5, 96 * 32, 96),
        (7, 4096 * 2, 4096),
        // Full blocks, but the last warp has exited lanes (blocks past nb): direct f32 stores.
        (3, 512 * 5, 512),
        (2, 32 * 45, 32),
        // Rounds of 16 full blocks for the persistent requantiser, then the general kernel for
        // what is left: a short last block, or full blocks short of a round.
        (4, 512 * 64 + 130, 512),
        (3, 512 * 40, 512),
        (2, 2048 * 9, 2048),
        (8, 512 * 40 + 130, 512),
        (6, 512 * 16, 512),
    ] {
        let (cp, cs) = pieces(k, len, block);
        let (gp, gs) = (cp.to_device(&gpu).unwrap(), cs.to_device(&gpu).unwrap());
        let at = format!("pieces={k} len={len} block={block}");
        let (cq, cqs) = tensor::dequantize_sum_requantize_int4(&cp, &cs, k, block).unwrap();
        let (gq, gqs) = tensor::dequantize_sum_requantize_int4(&gp, &gs, k, block).unwrap();
        assert_eq!(bytes(&gq), bytes(&cq), "requantised packed {at}");
        assert_eq!(f32_bits(&gqs), f32_bits(&cqs), "requantised scales {at}");
        let cy = tensor::dequantize_sum_int4(&cp, &cs, k, block).unwrap();
        let gy = tensor::dequantize_sum_int4(&gp, &gs, k, block).unwrap();
        assert_eq!(f32_bits(&gy), f32_bits(&cy), "sum {at}");
    }
}

/// The scale domain's extremes (crates/quant/src/block.rs `int4_sum_block`): pieces with random
/// codes (-8 included) and crafted scales per block and piece: f32::MAX / 7, subnormal, zero,
/// the smallest subnormals, any binade, powers of two, one binade; mixed within a block, or the
/// same for every piece. Blocks whose sum overflows get a NaN scale and codes 0 on both.
#[test]
fn fused_int4_sums_at_extreme_scales_equal_the_reference() {
    let gpu = gpu();
    let mut s = 987_654_321u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for case in 0..160 {
        let block = [32usize, 64, 96, 256, 512, 1024, 2048][(next() % 7) as usize];
        let k = 1 + (next() % 8) as usize;
        let nbl = 1 + (next() % 4) as usize;
        let len = if next() % 2 == 0 {
            block * nbl
        } else {
            block * (nbl - 1) + 2 + 2 * (next() as usize % (block / 2 - 1))
        };
        let nb = len.div_ceil(block);
        let mode = case % 6;
        let code = |r: u64| -> u8 {
            if r.is_multiple_of(50) {
                8
            } else {
                ((r % 15) as i32 - 7) as u8 & 15
            }
        };
        let (mut packed, mut scales) = (Vec::new(), Vec::new());
        for j in 0..k {
            for _ in 0..len / 2 {
                let r = next();
                packed.push(code(r) | (code(r >> 20) << 4));
            }
            for b in 0..nb {
                let r = next();
                let v = match (mode + j + b) % 7 {
                    0 => f32::MAX / 7.0,
                    1 => f32::from_bits((r as u32) & 0x007f_ffff),
                    2 => 0.0,
                    3 => f32::from_bits(1 + (r as u32 % 8)),
                    4 => f32::from_bits((r as u32) % 0x7e00_0000),
                    5 => 2f32.powi((r % 250) as i32 - 125),
                    _ => f32::from_bits(0x3f80_0000 | (r as u32 >> 9)) * 1e-3,
                };
                scales.push(if mode == 5 && j > 0 { scales[b] } else { v });
            }
        }
        let at = format!("case {case} pieces={k} len={len} block={block}");
        let (np, ns) = (packed.len(), scales.len());
        let cp = Tensor::from_vec(packed, np, &Device::Cpu).unwrap();
        let cs = Tensor::from_vec(scales, ns, &Device::Cpu).unwrap();
        let (gp, gs) = (cp.to_device(&gpu).unwrap(), cs.to_device(&gpu).unwrap());
        let cy = tensor::dequantize_sum_int4(&cp, &cs, k, block).unwrap();
        let gy = tensor::dequantize_sum_int4(&gp, &gs, k, block).unwrap();
        assert_eq!(f32_bits(&gy), f32_bits(&cy), "sum {at}");
        let (gq, gqs) = tensor::dequantize_sum_requantize_int4(&gp, &gs, k, block).unwrap();
        let (cq, cqs) = tensor::dequantize_sum_requantize_int4(&cp, &cs, k, block).unwrap();
        assert_eq!(bytes(&gq), bytes(&cq), "requantised packed {at}");
        assert_eq!(f32_bits(&gqs), f32_bits(&cqs), "requantised scales {at}");
    }
}

/// The persistent requantisers (`dequantize_sum_requantize_int4_full` at 1 to 4 pieces, `_full8`
/// at 5 to 8) over many rounds a CTA: pieces long enough that every resident CTA loops (2^23
/// elements: 512 rounds of 32 blocks of 512, 4096 rounds of 4 blocks of 2048, against ~260
/// resident CTAs on an H200), at blocks of one, two and more units a thread, each block's
/// scales drawn from the extremes of the domain (subnormal, zero, the smallest subnormals, any
/// binade, powers of two), so that the loads issued a round ahead meet every branch of the
/// requantisation. A short tail block goes to the general kernel.
#[test]
fn fused_int4_requantise_persistent_rounds_equal_the_reference() {
    let gpu = gpu();
    let mut s = 0x5eed_1234_u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for (k, block, tail) in [
        (4usize, 512usize, 130usize),
        (3, 2048, 0),
        (1, 512, 0),
        (2, 64, 0),
        (8, 512, 130),
        (5, 2048, 0),
        (7, 32, 6),
    ] {
        let len = (1 << 23) + tail;
        let nb = len.div_ceil(block);
        let (mut packed, mut scales) = (Vec::with_capacity(k * len / 2), Vec::new());
        for _ in 0..k {
            for _ in 0..len / 2 {
                let r = next();
                packed.push((r & 0xff) as u8);
            }
            for _ in 0..nb {
                let r = next();
                scales.push(match (r >> 40) % 6 {
                    0 => f32::from_bits((r as u32) & 0x007f_ffff),
                    1 => 0.0,
                    2 => f32::from_bits(1 + (r as u32 % 8)),
                    3 => f32::from_bits((r as u32) % 0x7000_0000),
                    4 => 2f32.powi((r % 200) as i32 - 100),
                    _ => f32::from_bits(0x3f80_0000 | (r as u32 >> 9)) * 1e-3,
                });
            }
        }
        let at = format!("pieces={k} len={len} block={block}");
        let (np, ns) = (packed.len(), scales.len());
        let cp = Tensor::from_vec(packed, np, &Device::Cpu).unwrap();
        let cs = Tensor::from_vec(scales, ns, &Device::Cpu).unwrap();
        let (gp, gs) = (cp.to_device(&gpu).unwrap(), cs.to_device(&gpu).unwrap());
        let (cq, cqs) = tensor::dequantize_sum_requantize_int4(&cp, &cs, k, block).unwrap();
        let (gq, gqs) = tensor::dequantize_sum_requantize_int4(&gp, &gs, k, block).unwrap();
        same(
            &f32_bits(&gqs),
            &f32_bits(&cqs),
            &format!("requantised scales {at}"),
        );
        same(
            &bytes(&gq),
            &bytes(&cq),
            &format!("requantised packed {at}"),
        );
    }
}

/// Asserts gpu == cpu, naming the first difference (not printing millions of elements).
fn same<T: PartialEq + std::fmt::Debug>(gpu: &[T], cpu: &[T], at: &str) {
    assert_eq!(gpu.len(), cpu.len(), "{at}: lengths");
    if let Some(i) = (0..gpu.len()).find(|&i| gpu[i] != cpu[i]) {
        panic!(
            "{at}: first difference at {i}: gpu {:?}, cpu {:?}",
            gpu[i], cpu[i]
        );
    }
}

/// The requantiser's fallbacks and the domain's resolution: a huge piece scale whose codes are
/// all 0 beside a small one. At ratios near 2^-125 the sums are subnormal in the domain, so
/// r = 1/scale is finite but r 2^(149 - k) overflows (quantize_int4's code_mul on the true
/// values); past 2^-127 the small piece is below the domain's resolution (zero sums); tiny
/// scales only take the division rule.
#[test]
fn fused_int4_requantise_fallbacks_equal_the_reference() {
    let gpu = gpu();
    for block in [32usize, 512, 2048] {
        for (big, small) in [
            (2f32.powi(100), 2f32.powi(-25)),
            (2f32.powi(100), 3.0 * 2f32.powi(-24)),
            (1e30, 1e-7),
            (2f32.powi(100), 1e-30f32),
            (1e30, 3e-38),
            (f32::MAX / 7.0, 1.0),
            (1e-40, 1e-44),
        ] {
            let len = 2 * block;
            let mut packed = vec![0u8; len / 2]; // piece 0: codes 0
            let mut r = 12345u64;
            for _ in 0..len / 2 {
                r = r
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let c = |x: u64| ((x % 15) as i32 - 7) as u8 & 15;
                packed.push(c(r >> 33) | (c(r >> 45) << 4));
            }
            let scales = vec![big, big, small, small * 3.0];
            let cp = Tensor::from_vec(packed, len, &Device::Cpu).unwrap();
            let cs = Tensor::from_vec(scales, 4, &Device::Cpu).unwrap();
            let (gp, gs) = (cp.to_device(&gpu).unwrap(), cs.to_device(&gpu).unwrap());
            let at = format!("block {block} big {big} small {small}");
            let cy = tensor::dequantize_sum_int4(&cp, &cs, 2, block).unwrap();
            let gy = tensor::dequantize_sum_int4(&gp, &gs, 2, block).unwrap();
            assert_eq!(f32_bits(&gy), f32_bits(&cy), "sum {at}");
            let (cq, cqs) = tensor::dequantize_sum_requantize_int4(&cp, &cs, 2, block).unwrap();
            let (gq, gqs) = tensor::dequantize_sum_requantize_int4(&gp, &gs, 2, block).unwrap();
            assert_eq!(bytes(&gq), bytes(&cq), "requantised packed {at}");
            assert_eq!(f32_bits(&gqs), f32_bits(&cqs), "requantised scales {at}");
        }
    }
}

#[test]
fn gpu_path_refuses_blocks_that_are_not_multiples_of_32() {
    let x = Tensor::zeros(96, DType::F32, &gpu()).unwrap();
    assert!(matches!(
        tensor::quantize_int8(&x, 48),
        Err(quant::QuantError::GpuBlock { block: 48 })
    ));
}

/// Equal bits, except that a NaN need only be a NaN (a dequantised NaN's payload is the GPU's
/// canonical one, `__fmul_rn`, not the CPU's).
fn same_or_nan(gpu: &[u32], cpu: &[u32], at: &str) {
    assert_eq!(gpu.len(), cpu.len(), "{at}: lengths");
    let nan = |b: u32| f32::from_bits(b).is_nan();
    if let Some(i) = (0..gpu.len()).find(|&i| gpu[i] != cpu[i] && !(nan(gpu[i]) && nan(cpu[i]))) {
        panic!(
            "{at}: first difference at {i}: gpu {:?}, cpu {:?}",
            f32::from_bits(gpu[i]),
            f32::from_bits(cpu[i])
        );
    }
}

/// `mixed` data with an inf or NaN put into some blocks: at a block's first, last and a middle
/// element, in the short last block, and two in one block.
fn with_non_finite(n: usize, seed: u64, block: usize) -> Vec<f32> {
    let mut x = mixed(n, seed, block);
    let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    for (b, c) in x.chunks_mut(block).enumerate() {
        let len = c.len();
        match b % 4 {
            1 => c[0] = bad[b % 3],
            2 => c[len - 1] = bad[(b + 1) % 3],
            3 if b % 8 == 3 => {
                c[len / 2] = bad[(b + 2) % 3];
                c[len / 3] = bad[b % 3];
            }
            _ => {}
        }
    }
    let last = x.len() - 1;
    x[last] = f32::NAN;
    x
}

/// A block holding an inf or NaN gets the scale NaN (0x7fc00000) and codes 0 on the GPU as in
/// the CPU reference (block/mod.rs), so it dequantises to NaN, and every other block is
/// quantised as usual: codes and scales bitwise equal, dequantised values equal or both NaN.
#[test]
fn non_finite_blocks_equal_the_reference() {
    let gpu = gpu();
    for &(n, block) in &[
        (2048 * 9 + 100, 2048),
        (512 * 7 + 33, 512),
        (96 * 11 + 5, 96),
        (32 * 9, 32),
    ] {
        let x = with_non_finite(n, n as u64 + 7, block);
        let (cx, gx) = both(&x, &gpu);
        let at = format!("INT8 n={n} block={block}");
        let (cq, cs) = tensor::quantize_int8(&cx, block).unwrap();
        let (gq, gs) = tensor::quantize_int8(&gx, block).unwrap();
        assert_eq!(f32_bits(&gs), f32_bits(&cs), "scales {at}");
        assert_eq!(bytes(&gq), bytes(&cq), "codes {at}");
        let scales = f32_values(&cs);
        assert!(scales.iter().filter(|s| s.is_nan()).count() >= n / block / 4);
        for dtype in [DType::F32, DType::BF16] {
            let cy = tensor::dequantize_int8(&cq, &cs, block, dtype).unwrap();
            let gy = tensor::dequantize_int8(&gq, &gs, block, dtype).unwrap();
            same_or_nan(
                &f32_bits(&gy),
                &f32_bits(&cy),
                &format!("dequant {dtype:?} {at}"),
            );
            for (b, y) in f32_values(&gy).chunks(block).enumerate() {
                assert_eq!(
                    y.iter().all(|v| v.is_nan()),
                    scales[b].is_nan(),
                    "{at} block {b}"
                );
            }
        }
    }
    for &(nodes, rpn, s, block) in &[(2, 4, 512 * 3, 512), (3, 2, 96 * 4, 96), (2, 2, 2048, 2048)] {
        let x = with_non_finite(nodes * rpn * s, (nodes * 10 + rpn) as u64, block);
        let (cx, gx) = both(&x, &gpu);
        let at = format!("INT4 {nodes}x{rpn} S={s} block={block}");
        let (cp, cs) = tensor::quantize_int4_swizzled(&cx, nodes, rpn, block).unwrap();
        let (gp, gs) = tensor::quantize_int4_swizzled(&gx, nodes, rpn, block).unwrap();
        assert_eq!(f32_bits(&gs), f32_bits(&cs), "scales {at}");
        assert_eq!(bytes(&gp), bytes(&cp), "packed {at}");
        // qgZ's hops on that buffer read as `rpn` pieces: the NaN blocks survive the fused
        // requantiser (every path: persistent rounds and the general kernel) and the final sum.
        let at = format!("fused {at}");
        let (cq, cqs) = tensor::dequantize_sum_requantize_int4(&cp, &cs, rpn, block).unwrap();
        let (gq, gqs) = tensor::dequantize_sum_requantize_int4(&gp, &gs, rpn, block).unwrap();
        assert_eq!(f32_bits(&gqs), f32_bits(&cqs), "requantised scales {at}");
        assert_eq!(bytes(&gq), bytes(&cq), "requantised packed {at}");
        assert!(f32_values(&cqs).iter().any(|v| v.is_nan()), "{at}");
        let cy = tensor::dequantize_sum_int4(&cp, &cs, rpn, block).unwrap();
        let gy = tensor::dequantize_sum_int4(&gp, &gs, rpn, block).unwrap();
        same_or_nan(&f32_bits(&gy), &f32_bits(&cy), &format!("sum {at}"));
    }
    // Long pieces, so the persistent requantisers take rounds of blocks with NaN scales in them
    // (every 5th block of every piece, and one whole piece's block 3).
    for (k, block) in [(4usize, 512usize), (8, 512), (2, 2048)] {
        let len = block * 64 * 4;
        let (cp, cs) = pieces(k, len, block);
        let mut scales = cs.to_vec1::<f32>().unwrap();
        let nb = len / block;
        for (i, v) in scales.iter_mut().enumerate() {
            if i % nb % 5 == 2 || i == nb + 3 {
                *v = f32::NAN;
            }
        }
        let cs = Tensor::new(scales.as_slice(), &Device::Cpu).unwrap();
        let (gp, gs) = (cp.to_device(&gpu).unwrap(), cs.to_device(&gpu).unwrap());
        let at = format!("NaN piece scales, pieces={k} block={block}");
        let (cq, cqs) = tensor::dequantize_sum_requantize_int4(&cp, &cs, k, block).unwrap();
        let (gq, gqs) = tensor::dequantize_sum_requantize_int4(&gp, &gs, k, block).unwrap();
        same(
            &f32_bits(&gqs),
            &f32_bits(&cqs),
            &format!("requantised scales {at}"),
        );
        same(
            &bytes(&gq),
            &bytes(&cq),
            &format!("requantised packed {at}"),
        );
        let nan_blocks = f32_values(&cqs).iter().filter(|v| v.is_nan()).count();
        assert_eq!(
            nan_blocks,
            (0..nb).filter(|b| b % 5 == 2 || *b == 3).count(),
            "{at}"
        );
        let cy = tensor::dequantize_sum_int4(&cp, &cs, k, block).unwrap();
        let gy = tensor::dequantize_sum_int4(&gp, &gs, k, block).unwrap();
        same_or_nan(&f32_bits(&gy), &f32_bits(&cy), &format!("sum {at}"));
    }
}
