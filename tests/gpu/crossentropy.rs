//! The fused LM head + cross-entropy against the reference: the GPU runs in bf16 (bf16 logits,
//! f32 soft-max), the reference in f32 on the same bf16-rounded values (on the CPU, or on the
//! GPU in f32 for the gpt350m shape, where the CPU would take minutes).
//!
//! Inputs: x uniform in [-1, 1), wte uniform in [-3/sqrt(C), 3/sqrt(C)), so logits have
//! standard deviation ~1 and the soft-max is far from uniform.
//! Tolerances: the loss 2e-3 relative (bf16 logits move each row's loss by ~|logit| * 2^-9 with
//! random sign, the mean averages that down); dx and dwte 1e-2 of max|cpu| (dlogits in bf16,
//! gradient GEMMs with bf16 outputs, dwte accumulated over chunks in bf16).

use crate::common::{assert_close, uniform};
use candle_core::{DType, Device, Tensor};
use model::layers::{crossentropy_chunked, crossentropy_forward_backward, CE_CHUNK_ELEMS};

/// The same bf16-rounded values as (f32 on `f32_dev`, bf16 on `gpu`).
fn pair(dims: &[usize], seed: u64, scale: f32, f32_dev: &Device, gpu: &Device) -> (Tensor, Tensor) {
    let n = dims.iter().product();
    let t = Tensor::from_vec(uniform(n, seed, scale), dims, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    (
        t.to_dtype(DType::F32).unwrap().to_device(f32_dev).unwrap(),
        t.to_device(gpu).unwrap(),
    )
}

fn check(n: usize, c: usize, v: usize, reference_on_gpu: bool) {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let rdev = if reference_on_gpu {
        gpu.clone()
    } else {
        Device::Cpu
    };
    let (x_r, x_g) = pair(&[n, c], 1, 1.0, &rdev, &gpu);
    let (w_r, w_g) = pair(&[v, c], 2, 3.0 / (c as f32).sqrt(), &rdev, &gpu);
    // Targets over [0, V) with repeats (every 5th row the same id).
    let tgt: Vec<u32> = uniform(n, 3, 1.0)
        .iter()
        .enumerate()
        .map(|(i, u)| {
            if i % 5 == 0 {
                (v / 2) as u32
            } else {
                ((u + 1.0) * 0.5 * v as f32) as u32 % v as u32
            }
        })
        .collect();
    let t_r = Tensor::from_vec(tgt, n, &rdev).unwrap();
    let t_g = t_r.to_device(&gpu).unwrap();
    let shape = format!("(N, C, V) = ({n}, {c}, {v})");

    let (loss_g, grads) = crossentropy_forward_backward(&x_g, &w_g, &t_g, true).unwrap();
    let (dx_g, dw_g) = grads.expect("gradients");
    assert_eq!((dx_g.dtype(), dw_g.dtype()), (DType::BF16, DType::BF16));
    let (loss_r, grads_r) =
        crossentropy_chunked(&x_r, &w_r, &t_r, true, CE_CHUNK_ELEMS.max(1 << 28)).unwrap();
    let (dx_r, dw_r) = grads_r.expect("gradients");
    let (loss_g, loss_r) = (loss_g.value().unwrap(), loss_r.value().unwrap());
    let rel = ((loss_g - loss_r) / loss_r).abs();
    assert!(
        rel < 2e-3,
        "loss {shape}: gpu {loss_g} ref {loss_r} (rel {rel:.3e})"
    );
    assert_close(&format!("dx {shape}"), &dx_g, &dx_r, 1e-2);
    assert_close(&format!("dwte {shape}"), &dw_g, &dw_r, 1e-2);

    // Without gradients: the same loss, no gradients.
    let (loss_ng, none) = crossentropy_forward_backward(&x_g, &w_g, &t_g, false).unwrap();
    assert!(none.is_none());
    let loss_ng = loss_ng.value().unwrap();
    assert!(
        ((loss_ng - loss_g) / loss_g).abs() < 1e-6,
        "loss without grad {loss_ng} vs {loss_g}"
    );
}

#[test]
fn crossentropy_small() {
    check(77, 64, 104, false);
}

#[test]
fn crossentropy_gpt2_vocab() {
    check(300, 128, 50304, false);
}

#[test]
fn crossentropy_gpt350m_shape() {
    // N = 16 * 1024: 4 chunks of 4096 rows of logits, dwte accumulated over them.
    check(16384, 1024, 50304, true);
}

#[test]
fn crossentropy_qwen_vocab() {
    // Qwen's 151,936 tokens at N = 16 * 1024: 4 chunks of 4096 rows (1.16 GiB of logits each),
    // not the 10 of 1664 that the 512 MiB bound alone would give.
    check(16384, 256, 151_936, true);
}
