//! The AdamW kernel equals `AdamW::update` bitwise over several steps, decay ranges included.

use candle_core::{Device, Tensor};
use zero::{AdamW, DecayRanges};

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if i % 97 == 5 {
                0.0
            } else {
                u * scale * 2f32.powi((s % 9) as i32 - 4)
            }
        })
        .collect()
}

fn check(n: usize, decay: DecayRanges) {
    let opt = AdamW::default();
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let mut p = values(n, 1, 0.05);
    let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
    let mut tp = Tensor::new(p.as_slice(), &gpu).unwrap();
    let mut tm = Tensor::new(m.as_slice(), &gpu).unwrap();
    let mut tv = Tensor::new(v.as_slice(), &gpu).unwrap();
    for t in 1..=3u64 {
        let g = values(n, 10 + t, 1.0);
        let (coef, lr) = (1.0 / 48.0, 3e-4 * t as f64);
        opt.update(&mut p, &g, &mut m, &mut v, &decay, coef, lr, t);
        let tg = Tensor::new(g.as_slice(), &gpu).unwrap();
        (tp, tm, tv) = opt
            .update_tensors(&tp, &tg, &tm, &tv, &decay, coef, lr, t)
            .unwrap();
        let bits = |x: &Tensor| -> Vec<u32> {
            x.to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|f| f.to_bits())
                .collect()
        };
        let hb = |x: &[f32]| -> Vec<u32> { x.iter().map(|f| f.to_bits()).collect() };
        assert_eq!(bits(&tp), hb(&p), "param, step {t}, n {n}");
        assert_eq!(bits(&tm), hb(&m), "exp_avg, step {t}, n {n}");
        assert_eq!(bits(&tv), hb(&v), "exp_avg_sq, step {t}, n {n}");
    }
}

#[test]
#[allow(clippy::single_range_in_vec_init)]
fn adamw_kernel_equals_the_cpu_update() {
    check(
        10_000,
        DecayRanges(vec![100..3000, 5000..5001, 6000..10_000]),
    );
    check(777, DecayRanges(vec![]));
    check(1, DecayRanges(vec![0..1]));
}

#[test]
fn adamw_kernel_with_more_ranges_than_one_launch_carries() {
    // 300 ranges: several launches over element spans.
    let ranges = (0..300).map(|i| 37 * i + 3..37 * i + 20).collect();
    check(37 * 300 + 50, DecayRanges(ranges));
}

/// The gradient norm's sum of squares on the GPU (two-stage f64 kernel) against the CPU's f64
/// sum, with a tail that is not a whole float4 and an unaligned view; and bitwise repeatable.
#[test]
fn sum_of_squares_kernel_equals_the_cpu_sum() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    for n in [1usize, 7, 1027, 3_000_001] {
        let v = values(n, 5 + n as u64, 3.0);
        let cpu: f64 = v.iter().map(|x| *x as f64 * *x as f64).sum();
        let t = Tensor::new(v.as_slice(), &gpu).unwrap();
        let got = zero::sum_of_squares(&t)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(
            (got - cpu).abs() <= 1e-12 * cpu,
            "n {n}: gpu {got} cpu {cpu}"
        );
        let again = zero::sum_of_squares(&t)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(got.to_bits(), again.to_bits(), "n {n}: not repeatable");
        if n > 2 {
            let view = t.narrow(0, 1, n - 1).unwrap();
            let want: f64 = cpu - v[0] as f64 * v[0] as f64;
            let got = zero::sum_of_squares(&view)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
            assert!((got - want).abs() <= 1e-12 * want.max(1e-30), "n {n} view");
        }
    }
}
