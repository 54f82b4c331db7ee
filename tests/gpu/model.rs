//! The whole model on the GPU (bf16, every fused kernel composed) against the CPU reference
//! (f32) on the same bf16-rounded parameters: loss and every unit's gradient. Each kernel has
//! its own test file; this one catches what only shows when they are chained (layouts handed
//! from one kernel to the next, saved state, the recomputation path).

use candle_core::{DType, Device, Tensor};
use model::{init_unit_range, KernelPlan, Model, ModelConfig, ModelLayout, ParamInit};

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

/// `||a - b|| / ||b||` over all elements.
fn relative_error(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_dtype(DType::F64).unwrap();
    let b = b.to_dtype(DType::F64).unwrap();
    let diff = (&a - &b).unwrap().sqr().unwrap().sum_all().unwrap();
    let norm = b.sqr().unwrap().sum_all().unwrap();
    (diff.to_scalar::<f64>().unwrap() / norm.to_scalar::<f64>().unwrap().max(1e-300)).sqrt()
}

fn check(cfg: ModelConfig, b: usize, recompute: bool) {
    check_with(cfg, b, recompute, false)
}

/// With `strict`, the GPU side runs under the shape's enforced kernel plan (a layer whose kernel
/// declines is an error, as in training), and the norm weights and biases start moved off
/// their 1 and 0 (up to 0.25), so that a bias added in a GEMM's epilogue, or q's and k's norm
/// weights swapped, shows in the loss.
fn check_with(cfg: ModelConfig, b: usize, recompute: bool, strict: bool) {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let layout = ModelLayout::new(&cfg);
    let cpu_params: Vec<Tensor> = layout
        .units
        .iter()
        .map(|u| {
            let mut buf = vec![0f32; u.numel];
            init_unit_range(&cfg, u, 7, 0, &mut buf);
            if strict {
                let moves = crate::common::uniform(u.numel, 13, 0.25);
                for p in &u.params {
                    if !matches!(p.init, ParamInit::Normal { .. }) {
                        let range = p.offset..p.offset + p.numel;
                        buf[range.clone()]
                            .iter_mut()
                            .zip(&moves[range])
                            .for_each(|(x, m)| *x += m);
                    }
                }
            }
            // Round to bf16 so that both sides start from the same values.
            Tensor::from_vec(buf, u.numel, &Device::Cpu)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
        })
        .collect();
    let gpu_params: Vec<Tensor> = cpu_params
        .iter()
        .map(|p| p.to_dtype(DType::BF16).unwrap().to_device(&gpu).unwrap())
        .collect();
    let t = cfg.seq_len;
    let seq = tokens(b * (t + 1), cfg.vocab_size, 11);
    let inputs: Vec<u32> = (0..b)
        .flat_map(|i| seq[i * (t + 1)..i * (t + 1) + t].to_vec())
        .collect();
    let targets: Vec<u32> = (0..b)
        .flat_map(|i| seq[i * (t + 1) + 1..(i + 1) * (t + 1)].to_vec())
        .collect();
    let on = |d: &Device| {
        (
            Tensor::from_slice(&inputs, (b, t), d).unwrap(),
            Tensor::from_slice(&targets, (b, t), d).unwrap(),
        )
    };
    let (ti, tt) = on(&Device::Cpu);
    let (cpu_loss, cpu_grads) = Model::new(cfg.clone())
        .unwrap()
        .loss_and_grads(&cpu_params, &ti, &tt, recompute)
        .unwrap();
    let (gi, gt) = on(&gpu);
    let enforced = strict.then(|| {
        KernelPlan::resolve(&cfg, DType::BF16, &gpu)
            .expect("a kernel plan")
            .expect("a GPU plan")
            .enforce()
    });
    let (gpu_loss, gpu_grads) = Model::new(cfg.clone())
        .unwrap()
        .loss_and_grads(&gpu_params, &gi, &gt, recompute)
        .unwrap();
    drop(enforced);
    let family = cfg.family().name();
    assert!(
        (gpu_loss - cpu_loss).abs() / cpu_loss < 5e-3,
        "{family} (recompute {recompute}): loss: gpu {gpu_loss} cpu {cpu_loss}"
    );
    for (u, (g, c)) in gpu_grads.iter().zip(&cpu_grads).enumerate() {
        assert_eq!(g.dtype(), DType::BF16, "unit {u}: gradient dtype");
        let g = g.to_device(&Device::Cpu).unwrap();
        let unit = &layout.units[u];
        for p in &unit.params {
            let e = relative_error(&p.view(&g).unwrap(), &p.view(c).unwrap());
            assert!(e < 3e-2, "{family}: {}: relative error {e:.3e}", p.name);
        }
    }
}

#[test]
fn model_on_the_gpu_follows_the_cpu_reference() {
    // hs = 64, T not a multiple of 64, V % 8 == 0.
    let cfg = ModelConfig::gpt2(2, 128, 2, 96, 320);
    check(cfg.clone(), 3, false);
    check(cfg, 2, true);
}

#[test]
fn tiny_on_the_gpu_follows_the_cpu_reference() {
    // The `tiny` preset: hs = 16, the shape the GPU parity run trains.
    let cfg = model::preset("tiny").unwrap();
    check(cfg, 4, false);
}

/// The Llama family on the GPU (its layers on the candle reference path, bf16) against the CPU
/// reference: tied and untied heads, grouped-query attention, with and without recomputation.
#[test]
fn llama_on_the_gpu_follows_the_cpu_reference() {
    for tied in [true, false] {
        let cfg = ModelConfig::llama(2, 128, 4, 2, 320, 96, 320, tied);
        check(cfg.clone(), 3, false);
        check(cfg, 2, true);
    }
}

/// Qwen3 (each query and key head normalised, `qk_norm.cu`; a head width of its own, 128
/// where n_embd / n_head is 32) and Qwen2 (q, k and v biases, added in the projection GEMM's
/// epilogue, their gradient from `bias_grad`) on the GPU against the CPU reference, under
/// their enforced kernel plans, with and without recomputation.
#[test]
fn qwen_families_on_the_gpu_follow_the_cpu_reference() {
    let qwen3 = model::qwen3::QWEN3.shape(2, 128, 4, 2, 128, 320, 96, 320, true);
    let qwen2 = model::qwen2::QWEN2.shape(2, 128, 4, 2, 32, 320, 96, 320, false);
    for cfg in [qwen3, qwen2] {
        check_with(cfg.clone(), 3, false, true);
        check_with(cfg, 2, true, true);
    }
}
