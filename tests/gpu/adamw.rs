//! The AdamW kernel equals `AdamW::update` bitwise over several steps, decay ranges included,
//! for an f32 shard and for a unit's bf16 gradient with its scale, shorter than the shard.

use candle_core::{DType, Device, Tensor};
use zero::{AdamW, DecayRanges, GradShard};

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
        let got = zero::sum_of_squares(&GradShard::f32(t.clone()))
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(
            (got - cpu).abs() <= 1e-12 * cpu,
            "n {n}: gpu {got} cpu {cpu}"
        );
        let again = zero::sum_of_squares(&GradShard::f32(t.clone()))
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(got.to_bits(), again.to_bits(), "n {n}: not repeatable");
        if n > 2 {
            let view = t.narrow(0, 1, n - 1).unwrap();
            let want: f64 = cpu - v[0] as f64 * v[0] as f64;
            let got = zero::sum_of_squares(&GradShard::f32(view))
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
            assert!((got - want).abs() <= 1e-12 * want.max(1e-30), "n {n} view");
        }
    }
}

/// AdamW and the norm reading a unit's bf16 gradient where it is (W = 1): `scale` x the values,
/// zero past their end, bitwise the CPU's from the same values; the norm within f64 rounding.
#[test]
fn adamw_and_the_norm_read_a_scaled_bf16_gradient() {
    let opt = AdamW::default();
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let (n, len) = (10_000usize, 9_001usize);
    let decay = DecayRanges(vec![100..3000, 6000..10_000]);
    let mut p = values(n, 2, 0.05);
    let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
    let (mut tp, mut tm, mut tv) = (
        Tensor::new(p.as_slice(), &gpu).unwrap(),
        Tensor::new(m.as_slice(), &gpu).unwrap(),
        Tensor::new(v.as_slice(), &gpu).unwrap(),
    );
    for t in 1..=3u64 {
        let g = Tensor::new(values(len, 20 + t, 1.0).as_slice(), &gpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let widened = g.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        let (scale, clip, lr) = (0.375f32, 0.7, 3e-4);
        opt.update_scaled(&mut p, &widened, scale, &mut m, &mut v, &decay, clip, lr, t);
        let shard = GradShard::scaled(g, scale);
        let copy;
        (tp, tm, tv, copy) = opt
            .update_tensors_with_copy(
                &tp,
                &shard,
                &tm,
                &tv,
                &decay,
                clip,
                lr,
                t,
                Some(DType::BF16),
            )
            .unwrap();
        let bits = |x: &Tensor| -> Vec<u32> {
            let x = x.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
            x.iter().map(|f| f.to_bits()).collect()
        };
        let hb = |x: &[f32]| -> Vec<u32> { x.iter().map(|f| f.to_bits()).collect() };
        assert_eq!(bits(&tp), hb(&p), "param, step {t}");
        assert_eq!(bits(&tm), hb(&m), "exp_avg, step {t}");
        assert_eq!(bits(&tv), hb(&v), "exp_avg_sq, step {t}");
        let p16 = tp.to_dtype(DType::BF16).unwrap();
        assert_eq!(
            bits(&copy.expect("a bf16 copy")),
            bits(&p16),
            "copy, step {t}"
        );

        let want: f64 = widened
            .iter()
            .map(|x| (x * scale) as f64 * (x * scale) as f64)
            .sum();
        let got = zero::sum_of_squares(&shard)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(
            (got - want).abs() <= 1e-12 * want,
            "norm: gpu {got} cpu {want}"
        );
    }
}
