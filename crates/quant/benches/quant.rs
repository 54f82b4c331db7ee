//! Throughput of the quantisers on 16 Mi f32 elements (bytes = the f32 input, 64 MiB).
//! Run: cargo bench -p quant --bench quant

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;

const L: usize = 16 << 20;
const BLOCK8: usize = 2048;
const BLOCK4: usize = 2048;

fn input(seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..L)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e-2
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let x = input(1);
    let mut g = c.benchmark_group("quant");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Bytes((L * 4) as u64));

    g.bench_function("quantize_int8", |b| {
        b.iter(|| quant::quantize_int8(black_box(&x), BLOCK8).unwrap())
    });
    let (q8, s8) = quant::quantize_int8(&x, BLOCK8).unwrap();
    g.bench_function("dequantize_int8", |b| {
        b.iter(|| quant::dequantize_int8(black_box(&q8), &s8, BLOCK8))
    });
    // W = 2 x 8 = 16 slices of 1 Mi elements.
    g.bench_function("quantize_int4_swizzled", |b| {
        b.iter(|| quant::quantize_int4_swizzled(black_box(&x), 2, 8, BLOCK4).unwrap())
    });
    // 4 pieces of L elements each; bytes counted as one piece's f32 size (the output's).
    let q4: Vec<_> = (0..4)
        .map(|i| quant::quantize_int4(&input(10 + i), BLOCK4).unwrap())
        .collect();
    let pieces: Vec<(&[u8], &[f32])> = q4.iter().map(|(p, s)| (&p[..], &s[..])).collect();
    g.bench_function("dequantize_sum_requantize_int4_x4", |b| {
        b.iter(|| quant::dequantize_sum_requantize_int4(black_box(&pieces), BLOCK4).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
