//! Both GPU attentions, cuDNN's fused SDPA and our flash kernels
//! (`model::layers::attention_forward_with/backward_with` on bf16 CUDA tensors), against the CPU
//! reference in f32 on the same bf16 values: y, lse, and the q, k, v parts of dqkv, at shapes
//! whose T is and is not a multiple of the 64-row tile, for every head size our kernels take
//! (16, 32, 64, 128), and at the gpt350m shape; and the two mixed (either backward after either
//! forward), as the model may mix them. A failure names the output and the (b, h, t, d) of its
//! largest error. The cuDNN tests require cuDNN to take the shape: the H200 machine has it.
//!
//! Tolerances, as max|gpu - cpu| / max|cpu| of each output: y 2e-2 (bf16 output, P rounded to
//! bf16 before P V as in FlashAttention-2: a few bf16 ulps), lse 1e-3 (f32 throughout; exp2
//! approximation), gradients 3e-2 (bf16 P and dS feed sums over up to T rows).

use crate::common::{gpu, seconds_per_call, uniform};
use candle_core::{DType, Device, Tensor};
use model::layers::{
    attention_backward, attention_backward_with, attention_cudnn_support, attention_forward,
    attention_forward_with, AttentionKernel,
};

/// `(B, T, 3C)`: q and k in [-2, 2) (peaked enough that the softmax is not flat), v in [-1, 1).
fn qkv_values(b: usize, t: usize, c: usize, seed: u64) -> Vec<f32> {
    let qk = uniform(b * t * 2 * c, seed, 2.0);
    let v = uniform(b * t * c, seed + 1, 1.0);
    let mut out = Vec::with_capacity(b * t * 3 * c);
    for row in 0..b * t {
        out.extend_from_slice(&qk[row * 2 * c..(row + 1) * 2 * c]);
        out.extend_from_slice(&v[row * c..(row + 1) * c]);
    }
    out
}

fn to_vec(x: &Tensor) -> Vec<f32> {
    x.to_dtype(DType::F32)
        .and_then(|x| x.flatten_all())
        .and_then(|x| x.to_vec1::<f32>())
        .expect("readable tensor")
}

/// Compares `gpu` with `cpu` (same flat layout); `at(i)` names element i. Panics with the
/// output's name, the worst element and the relative error when it is above `tol`; NaN counts
/// as an infinite error. The error is relative to max|cpu|, or to `floor` when that is larger:
/// an output that is exactly zero in exact arithmetic (dq and dk at T = 1, where the soft-max
/// has one entry) is compared at the scale of its sibling gradient instead.
fn check(
    what: &str,
    shape: &str,
    gpu: &[f32],
    cpu: &[f32],
    tol: f32,
    floor: f32,
    at: impl Fn(usize) -> String,
) {
    assert_eq!(gpu.len(), cpu.len(), "{what} {shape}: lengths");
    let scale = cpu.iter().fold(0f32, |m, v| m.max(v.abs())).max(floor);
    let (mut worst, mut worst_i) = (0f32, 0usize);
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let d = (g - c).abs();
        let d = if d.is_nan() { f32::INFINITY } else { d };
        if d > worst {
            worst = d;
            worst_i = i;
        }
    }
    let rel = worst / scale;
    println!("{shape} {what}: max rel err {rel:.2e} (max |cpu| {scale:.3e})");
    assert!(
        rel <= tol,
        "{what} {shape}: max |gpu - cpu| / max |cpu| = {rel:.3e} > {tol:e} at {} \
         (gpu {}, cpu {}, max |cpu| {scale:.3e})",
        at(worst_i),
        gpu[worst_i],
        cpu[worst_i]
    );
}

/// Forward by `fwd` and backward by `bwd` of one shape `(B, T, NH, hs)`.
fn compare_with(
    fwd: AttentionKernel,
    bwd: AttentionKernel,
    b: usize,
    t: usize,
    nh: usize,
    hs: usize,
) {
    let c = nh * hs;
    let shape = format!("{fwd:?}/{bwd:?} (B, T, NH, hs) = ({b}, {t}, {nh}, {hs})");
    let dev = gpu();
    let seed = (b * 1000 + t * 10 + nh + hs) as u64;
    // bf16 inputs, and the same values in f32 on the CPU.
    let qkv_cpu = Tensor::from_vec(qkv_values(b, t, c, seed), (b, t, 3 * c), &Device::Cpu)
        .and_then(|x| x.to_dtype(DType::BF16))
        .and_then(|x| x.to_dtype(DType::F32))
        .expect("qkv");
    let dy_cpu = Tensor::from_vec(uniform(b * t * c, seed + 7, 1.0), (b, t, c), &Device::Cpu)
        .and_then(|x| x.to_dtype(DType::BF16))
        .and_then(|x| x.to_dtype(DType::F32))
        .expect("dy");
    let qkv_gpu = qkv_cpu
        .to_dtype(DType::BF16)
        .and_then(|x| x.to_device(&dev))
        .expect("qkv");
    let dy_gpu = dy_cpu
        .to_dtype(DType::BF16)
        .and_then(|x| x.to_device(&dev))
        .expect("dy");

    for (kernel, backward) in [(fwd, false), (bwd, true)] {
        if kernel == AttentionKernel::Cudnn {
            let support = attention_cudnn_support(&qkv_gpu, nh, backward).expect("cuDNN query");
            assert_eq!(
                support,
                Ok(()),
                "{shape}: cuDNN takes the shape (backward {backward})"
            );
        }
    }
    let (y_cpu, saved_cpu) = attention_forward(&qkv_cpu, nh).expect("cpu forward");
    let (y_gpu, saved_gpu) = attention_forward_with(fwd, &qkv_gpu, nh)
        .expect("gpu forward")
        .expect("the kernel takes the shape");
    assert_eq!(
        y_gpu.dtype(),
        DType::BF16,
        "{shape}: the GPU path keeps bf16"
    );
    assert_eq!(saved_gpu.lse.dims(), &[b, nh, t], "{shape}: lse shape");

    // (B, T, C) element i -> (b, h, t, d).
    let btc = |i: usize| {
        let (row, col) = (i / c, i % c);
        format!(
            "(b {}, h {}, t {}, d {})",
            row / t,
            col / hs,
            row % t,
            col % hs
        )
    };
    let bht = |i: usize| format!("(b {}, h {}, t {})", i / (nh * t), i / t % nh, i % t);
    check(
        "y",
        &shape,
        &to_vec(&y_gpu),
        &to_vec(&y_cpu),
        2e-2,
        1e-30,
        btc,
    );
    check(
        "lse",
        &shape,
        &to_vec(&saved_gpu.lse),
        &to_vec(&saved_cpu.lse),
        1e-3,
        1e-30,
        bht,
    );

    let dqkv_cpu = attention_backward(&dy_cpu, &saved_cpu).expect("cpu backward");
    let dqkv_gpu = attention_backward_with(bwd, &dy_gpu, &saved_gpu)
        .expect("gpu backward")
        .expect("the kernel takes the shape");
    assert_eq!(dqkv_gpu.dims(), &[b, t, 3 * c], "{shape}: dqkv shape");
    let part = |x: &Tensor, k: usize| to_vec(&x.narrow(2, k * c, c).expect("narrow"));
    // dv = P^T dy is never identically zero: the scale for dq and dk where they are.
    let dv_scale = part(&dqkv_cpu, 2).iter().fold(0f32, |m, v| m.max(v.abs()));
    for (k, name) in ["dq", "dk", "dv"].iter().enumerate() {
        let (g, c_) = (part(&dqkv_gpu, k), part(&dqkv_cpu, k));
        check(name, &shape, &g, &c_, 3e-2, dv_scale, btc);
    }
}

fn compare(kernel: AttentionKernel, b: usize, t: usize, nh: usize, hs: usize) {
    compare_with(kernel, kernel, b, t, nh, hs);
}

use AttentionKernel::{Cudnn, Flash};

#[test]
fn attention_matches_the_cpu_reference_hs64_tail_tile() {
    compare(Flash, 2, 77, 3, 64);
    compare(Cudnn, 2, 77, 3, 64);
}

#[test]
fn attention_matches_the_cpu_reference_hs128() {
    compare(Flash, 1, 200, 2, 128);
    compare(Cudnn, 1, 200, 2, 128);
}

#[test]
fn attention_matches_the_cpu_reference_hs32_whole_tile() {
    compare(Flash, 3, 64, 4, 32);
    compare(Cudnn, 3, 64, 4, 32);
}

#[test]
fn attention_matches_the_cpu_reference_hs16() {
    compare(Flash, 2, 50, 4, 16);
}

#[test]
fn attention_matches_the_cpu_reference_short_rows() {
    // T = 1 (one masked row) and T = 65 (a one-row last tile).
    compare(Flash, 3, 1, 2, 64);
    compare(Flash, 1, 65, 5, 32);
    compare(Cudnn, 1, 65, 5, 32);
}

#[test]
fn attention_matches_the_cpu_reference_gpt350m_heads() {
    compare(Flash, 2, 1024, 16, 64);
    compare(Cudnn, 2, 1024, 16, 64);
}

#[test]
fn attention_cudnn_and_flash_mix() {
    // The model takes cuDNN where it can: its lse must serve our backward and ours its.
    compare_with(Cudnn, Flash, 2, 130, 4, 64);
    compare_with(Flash, Cudnn, 2, 130, 4, 64);
}

/// Timing of cuDNN's and our attention at the gpt350m shape (B, NH, T, hs) = (16, 16, 1024, 64)
/// (and cuDNN at hs 128), printed (`--nocapture`); asserts only that our tunings agree and the
/// outputs are finite. FLOPs counted causal: forward
/// 2*B*NH*T*T*hs, backward 2.5x that.
#[test]
fn attention_timing_h200_shape() {
    let (b, t, nh, hs) = (16usize, 1024usize, 16usize, 64usize);
    let c = nh * hs;
    let dev = gpu();
    let qkv = Tensor::randn(0f32, 1.0, (b, t, 3 * c), &dev)
        .and_then(|x| x.to_dtype(DType::BF16))
        .expect("qkv");
    let dy = Tensor::randn(0f32, 1.0, (b, t, c), &dev)
        .and_then(|x| x.to_dtype(DType::BF16))
        .expect("dy");
    let flops = 2.0 * (b * nh * t * t * hs) as f64;
    let time = |f: &dyn Fn()| seconds_per_call(&dev, f);
    // cuDNN's fused SDPA (what the model runs), then ours with its tunings.
    for hs in [64usize, 128] {
        let nh = c / hs;
        let (_, saved) = attention_forward_with(Cudnn, &qkv, nh)
            .expect("forward")
            .expect("cuDNN takes the shape");
        let tf = time(&|| {
            attention_forward_with(Cudnn, &qkv, nh).expect("forward");
        });
        let tb = time(&|| {
            attention_backward_with(Cudnn, &dy, &saved).expect("backward");
        });
        println!(
            "cuDNN attention (B, NH, T, hs) = ({b}, {nh}, {t}, {hs}): forward {:.1} us = {:.0} \
             TFLOP/s, backward {:.1} us = {:.0} TFLOP/s",
            tf * 1e6,
            flops / tf / 1e12,
            tb * 1e6,
            2.5 * flops / tb / 1e12
        );
    }
    let (y, saved) = attention_forward_with(Flash, &qkv, nh)
        .expect("forward")
        .expect("our kernel takes hs 64");
    let tf = time(&|| {
        attention_forward_with(Flash, &qkv, nh).expect("forward");
    });
    let tf128 = time(&|| {
        model::layers::attention_forward_tiled(&qkv, nh, 128).expect("forward 128");
    });
    let (y128, _) = model::layers::attention_forward_tiled(&qkv, nh, 128)
        .expect("forward 128")
        .expect("the kernel takes hs 64");
    let diff = (y128.to_dtype(DType::F32).unwrap() - y.to_dtype(DType::F32).unwrap())
        .and_then(|d| d.abs())
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .expect("diff");
    assert!(
        diff < 2e-2,
        "128-row tiles give another y: max |diff| {diff}"
    );
    println!(
        "attention forward with 128-row tiles: {:.1} us = {:.0} TFLOP/s",
        tf128 * 1e6,
        flops / tf128 / 1e12
    );
    let tb = time(&|| {
        attention_backward_with(Flash, &dy, &saved).expect("backward");
    });
    println!(
        "our attention (B, NH, T, hs) = ({b}, {nh}, {t}, {hs}): forward {:.1} us = {:.0} TFLOP/s, \
         backward {:.1} us = {:.0} TFLOP/s",
        tf * 1e6,
        flops / tf / 1e12,
        tb * 1e6,
        2.5 * flops / tb / 1e12
    );
    let dqkv = attention_backward_with(Flash, &dy, &saved)
        .expect("backward")
        .expect("our kernel takes hs 64");
    let top = dqkv
        .to_dtype(DType::F32)
        .and_then(|x| x.abs())
        .and_then(|x| x.max_all())
        .and_then(|x| x.to_scalar::<f32>())
        .expect("max");
    for (keys, early_p) in [(64usize, false), (64, true), (128, false), (128, true)] {
        let tk = time(&|| {
            model::layers::attention_backward_tiled(&dy, &saved, keys, early_p)
                .expect("backward tiled");
        });
        let dk = model::layers::attention_backward_tiled(&dy, &saved, keys, early_p)
            .expect("backward tiled")
            .expect("the kernel takes hs 64");
        let diff = (dk.to_dtype(DType::F32).unwrap() - dqkv.to_dtype(DType::F32).unwrap())
            .and_then(|d| d.abs())
            .and_then(|d| d.max_all())
            .and_then(|d| d.to_scalar::<f32>())
            .expect("diff");
        println!(
            "attention backward with {keys} keys a CTA, early P {early_p}: {:.1} us = {:.0} \
             TFLOP/s (max |diff| to the default {diff:.3e})",
            tk * 1e6,
            2.5 * flops / tk / 1e12
        );
        assert!(
            diff <= 1e-2 * top,
            "{keys} keys a CTA, early P {early_p} give another dqkv: max |diff| {diff}, \
             max |dqkv| {top}"
        );
    }
    let tp = time(&|| {
        model::layers::attention_backward_tiled(&dy, &saved, 0, false).expect("pre/post");
    });
    println!(
        "attention backward pre- and post-passes alone (D, zeroing and converting dq): {:.1} us",
        tp * 1e6
    );
    // The other head sizes at the same C and T.
    for hs in [32usize, 128] {
        let nh = c / hs;
        let (_, saved) = attention_forward_with(Flash, &qkv, nh)
            .expect("forward")
            .expect("our kernel takes the head size");
        for (keys, early_p) in [(64usize, false), (64, true), (128, false), (128, true)] {
            let tk = time(&|| {
                model::layers::attention_backward_tiled(&dy, &saved, keys, early_p)
                    .expect("backward");
            });
            println!(
                "attention backward hs {hs} with {keys} keys a CTA, early P {early_p}: {:.1} us \
                 = {:.0} TFLOP/s",
                tk * 1e6,
                2.5 * flops / tk / 1e12
            );
        }
    }
    for (name, x) in [("y", &y), ("dqkv", &dqkv)] {
        let bad = x
            .to_dtype(DType::F32)
            .and_then(|x| x.abs())
            .and_then(|x| x.max_all())
            .and_then(|x| x.to_scalar::<f32>())
            .expect("max");
        assert!(bad.is_finite(), "{name}: non-finite values");
    }
}
