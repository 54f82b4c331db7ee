//! Incremental decoding (model::decode) on the GPU against the CPU: the same parameters
//! (rounded to bf16 so that every side starts from the same values) decoded by a prefill of a
//! prompt and then one token a forward, in f32 on the CPU (the reference), in f32 on the GPU
//! (candle's CUDA ops: the logits within 1e-4, the greedy tokens the same) and in bf16 on the
//! GPU (the fused kernels: the logits within 3e-2 of the reference, or twice the distance of the
//! CPU's own bf16 decoding where bf16's rounding alone moves a step's logits further), for GPT-2,
//! Llama with grouped-query attention, Qwen3 and Qwen2.

use candle_core::{DType, Device, Tensor};
use model::decode::{Decoder, Sampling};
use model::{init_unit_range, ModelConfig, ModelLayout, ParamInit};

/// Each unit's parameters (`init_unit_range`, seed 7, the matrices times 10 so that the
/// logits are far from uniform and greedy picks are not near-ties), bf16-rounded, as f32 on
/// the CPU.
fn units(cfg: &ModelConfig) -> Vec<Tensor> {
    ModelLayout::new(cfg)
        .units
        .iter()
        .map(|u| {
            let mut buf = vec![0f32; u.numel];
            init_unit_range(cfg, u, 7, 0, &mut buf);
            for p in u
                .params
                .iter()
                .filter(|p| matches!(p.init, ParamInit::Normal { .. }))
            {
                buf[p.offset..p.offset + p.numel]
                    .iter_mut()
                    .for_each(|x| *x *= 10.0);
            }
            Tensor::from_vec(buf, u.numel, &Device::Cpu)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
        })
        .collect()
}

/// The logits of the prompt's last position, then of each of `next` fed one at a time.
fn logits(dec: &Decoder, prompt: &[u32], next: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = dec.cache(dec.config().seq_len).unwrap();
    let mut out = vec![dec.forward(prompt, &mut cache).unwrap()];
    for &t in next {
        out.push(dec.forward(&[t], &mut cache).unwrap());
    }
    out
}

fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (diff / norm.max(1e-300)).sqrt()
}

fn check(name: &str, cfg: ModelConfig) {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let cpu_units = units(&cfg);
    let on = |device: &Device, dtype: DType| {
        let units = cpu_units
            .iter()
            .map(|u| u.to_dtype(dtype).unwrap().to_device(device).unwrap())
            .collect();
        Decoder::new(cfg.clone(), units).unwrap()
    };
    let cpu = on(&Device::Cpu, DType::F32);
    let cpu_bf16 = on(&Device::Cpu, DType::BF16);
    let gpu_f32 = on(&gpu, DType::F32);
    let gpu_bf16 = on(&gpu, DType::BF16);
    let prompt: Vec<u32> = (0..13)
        .map(|i| (i * 37 + 5) % cfg.vocab_size as u32)
        .collect();
    let next: Vec<u32> = (0..8)
        .map(|i| (i * 101 + 3) % cfg.vocab_size as u32)
        .collect();
    let want = logits(&cpu, &prompt, &next);
    // bf16's own distance from the reference at each step: with weights this large a step's
    // logits can move 7e-2 (Qwen2's third on the CPU), which a bf16 kernel cannot beat.
    let floor: Vec<f64> = logits(&cpu_bf16, &prompt, &next)
        .iter()
        .zip(&want)
        .map(|(g, w)| relative_error(g, w))
        .collect();
    for (dtype, dec, bound) in [("f32", &gpu_f32, 1e-4), ("bf16", &gpu_bf16, 3e-2)] {
        let got = logits(dec, &prompt, &next);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let e = relative_error(g, w);
            let bound = match dtype {
                "bf16" => f64::max(bound, 2.0 * floor[i]),
                _ => bound,
            };
            assert!(
                e < bound,
                "{name} {dtype}: step {i}: relative error {e:.3e} (bound {bound:.3e})"
            );
        }
    }
    let greedy = Sampling::greedy(24);
    let want = cpu.generate(&prompt, &greedy, |_| true).unwrap();
    let got = gpu_f32.generate(&prompt, &greedy, |_| true).unwrap();
    assert_eq!(got, want, "{name}: greedy tokens, GPU f32 vs CPU");
}

#[test]
fn decoding_on_the_gpu_follows_the_cpu() {
    check("gpt2", ModelConfig::gpt2(2, 128, 2, 64, 320));
    check(
        "llama gqa",
        ModelConfig::llama(2, 128, 4, 2, 256, 64, 320, false),
    );
    // Qwen3's per-head q/k norm (qk_norm.cu on bf16) at a head width of its own, and Qwen2's
    // q, k and v biases.
    check(
        "qwen3",
        model::qwen3::QWEN3.shape(2, 128, 4, 2, 128, 256, 64, 320, true),
    );
    check(
        "qwen2",
        model::qwen2::QWEN2.shape(2, 128, 4, 2, 32, 256, 64, 320, false),
    );
}
