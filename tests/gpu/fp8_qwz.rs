//! FP8 qwZ on the GPU (issue 40; zero/src/codec/fp8.rs): each step's kernels of fp8.cu against
//! the codec's CPU steps, bit for bit, and the engine's FP8 qwZ gathers and hpZ on the local
//! backend on one GPU.

use candle_core::{DType, Device, Tensor};
use comm::{run_local, Communicator, Topology};
use kernels::place::Place;
use model::{LinearFormat, ModelConfig, ModelLayout, UnitKind};
use zero::codec::{fp8_steps as steps, LinearLayout};
use zero::{Engine, EngineOptions, ZeroConfig};

/// The models of these tests: 128 wide, FFN 320 (tiles cut at 64 columns), every family's
/// block.
fn shapes() -> Vec<ModelConfig> {
    vec![
        ModelConfig::gpt2(2, 128, 2, 96, 320),
        ModelConfig::llama(2, 128, 4, 2, 320, 96, 320, false),
        model::qwen3::QWEN3.shape(2, 128, 4, 2, 128, 320, 96, 320, true),
        model::qwen2::QWEN2.shape(2, 128, 4, 2, 32, 320, 96, 320, false),
    ]
}

/// A block's values padded to `padded`, rounded to bf16, with a NaN, an inf, an all-zero tile
/// row, values under the amax floor and magnitudes 2^20 apart.
fn hostile(layout: &LinearLayout, padded: usize) -> Vec<f32> {
    let mut v = crate::common::uniform(padded, 29, 0.05);
    for (i, x) in v.iter_mut().enumerate() {
        if i % 11 == 0 {
            *x *= 1e6;
        }
    }
    let (m0, m1) = (&layout.matrices[0], &layout.matrices[1]);
    v[m0.offset + 3 * m0.cols + 5] = f32::NAN;
    v[m1.offset + m1.cols + 1] = f32::NEG_INFINITY;
    // the second tile row of a weight with more than 128 rows: a zero row, a row under the floor
    let tall = layout
        .matrices
        .iter()
        .find(|m| m.rows > 131)
        .expect("an FFN weight");
    for c in 0..tall.cols.min(128) {
        v[tall.offset + 130 * tall.cols + c] = if c % 2 == 0 { 0.0 } else { -0.0 };
        v[tall.offset + 131 * tall.cols + c] = 1e-14 * c as f32;
    }
    let t = Tensor::new(v, &Device::Cpu).unwrap();
    t.to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    let t = t
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    t.to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

fn bytes(t: &Tensor) -> Vec<u8> {
    t.to_device(&Device::Cpu).unwrap().to_vec1::<u8>().unwrap()
}

/// Every step of FP8 qwZ at W = 1, 3 and 8 on the GPU (bf16 shards) and on the CPU (the same
/// values in f32): each rank's slot of the first gather, the resolved header, the codes, the
/// tile scales and the unit's buffer of norms and biases, bit for bit.
#[test]
fn fp8_qwz_steps_on_the_gpu_equal_the_cpu_bit_for_bit() {
    let gpu = Device::new_cuda(0).expect("a CUDA device");
    let own = Place::Own;
    for cfg in shapes() {
        let unit = ModelLayout::new(&cfg).units[1].clone();
        let layout = LinearLayout::of(&unit);
        for w in [1, 3, 8] {
            let what = format!("{}, W = {w}", cfg.arch.name());
            let padded = unit.numel.next_multiple_of(16 * w);
            let shard = padded / w;
            let values = hostile(&layout, padded);
            let cpu = Tensor::new(values.as_slice(), &Device::Cpu).unwrap();
            let dev = cpu.to_dtype(DType::BF16).unwrap().to_device(&gpu).unwrap();
            let slot = layout.slot(w, shard);
            let h = slot.0 + slot.1;
            let on = |d: &Device| {
                let x = if d.is_cuda() { &dev } else { &cpu };
                let headers = Tensor::zeros(w * h, DType::F32, d).unwrap();
                for r in 0..w {
                    let mine = x.narrow(0, r * shard, shard).unwrap();
                    steps::partial_header_into(&own, &layout, slot, &mine, r * shard, &headers, r)
                        .unwrap();
                }
                let resolved = Tensor::zeros(layout.resolved_len(), DType::F32, d).unwrap();
                let map = layout.resolve_map(w, shard);
                steps::resolve_into(&own, &layout, &map, &headers, &resolved).unwrap();
                let codes = Tensor::zeros(padded, DType::U8, d).unwrap();
                for r in 0..w {
                    let mine = x.narrow(0, r * shard, shard).unwrap();
                    steps::encode_into(&own, &layout, &resolved, &mine, r * shard, &codes).unwrap();
                }
                let scales = Tensor::zeros(layout.tiles, DType::F32, d).unwrap();
                let flat = Tensor::zeros(padded, x.dtype(), d).unwrap();
                steps::finish_into(&own, &layout, &resolved, &scales, &flat).unwrap();
                (
                    bits(&headers),
                    bits(&resolved),
                    bytes(&codes),
                    bits(&scales),
                    bits(&flat),
                )
            };
            let (g, c) = (on(&gpu), on(&Device::Cpu));
            assert_eq!(g.0, c.0, "{what}: the first gather's slots");
            assert_eq!(g.1, c.1, "{what}: the resolved absmax and rest");
            assert_eq!(g.2, c.2, "{what}: the codes");
            assert_eq!(g.3, c.3, "{what}: the tile scales");
            assert_eq!(g.4, c.4, "{what}: the norms and biases");
            let nan = g.3.iter().filter(|&&s| f32::from_bits(s).is_nan()).count();
            assert_eq!(nan, 2, "{what}: the NaN's tile and the inf's");
        }
    }
}

/// A GPU device as the trainer opens it (tests/gpu/engine.rs).
fn trainer_gpu() -> Device {
    let dev = candle_core::cuda_backend::CudaDevice::new_with_stream(0).expect("GPU 0");
    // SAFETY: the tests order work across streams with the backends' own events, as the trainer.
    unsafe { dev.disable_event_tracking() };
    Device::Cuda(dev)
}

fn options(z: ZeroConfig) -> EngineOptions {
    EngineOptions {
        zero: z,
        total_steps: 10,
        seed: 5,
        device: trainer_gpu(),
        compute_dtype: DType::BF16,
        linears: LinearFormat::Fp8,
        ..Default::default()
    }
}

/// Rank 0's gathered blocks (as the layers read them, in f32) before training, and its losses
/// and gathered parameters after 3 steps, of a world of 4 ranks as 2 x 2 on one GPU.
fn run(cfg: &ModelConfig, z: ZeroConfig) -> (Vec<Vec<f32>>, Vec<f64>, Vec<Vec<f32>>) {
    let out = run_local(Topology::new(4, 2).unwrap(), |c| -> zero::Result<_> {
        let rank = c.rank();
        let mut e = Engine::new(cfg.clone(), options(z.clone()), Box::new(c))?;
        let gathered = (0..e.num_units())
            .map(|u| e.gather_for_compute(u))
            .collect::<zero::Result<Vec<_>>>()?;
        let mut losses = Vec::new();
        for step in 0..3 {
            let seq: Vec<u32> = (0..cfg.seq_len + 1)
                .map(|i| ((i * 31 + rank * 7 + step * 13) % cfg.vocab_size) as u32)
                .collect();
            let (x, y) = (&seq[..cfg.seq_len], &seq[1..]);
            let loss = e.forward_backward(x, y, 1.0)?;
            losses.push(e.mean_over_world(loss)?);
            e.step(1e-2)?;
        }
        let params = e
            .gathered_parameters()?
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        Ok((gathered, losses, params))
    })
    .unwrap();
    out.into_iter().next().unwrap()
}

/// On one GPU at W = 4 (2 x 2) with FP8 compute, for every family: each block gathered by FP8
/// qwZ is the FP8 quantisation of the exact gather's bf16 weights, bit for bit (and its norms
/// and biases the exact ones); hpZ trains as the world gather (to 1e-5: the GPU's sums may
/// differ from run to run); 3 steps stay within 5% of FP8 compute with exact gathers (the
/// embedding's INT8 codes move them).
#[test]
fn fp8_qwz_on_the_gpu_gathers_the_fp8_weights_and_hpz_changes_nothing() {
    let qwz = ZeroConfig {
        quantized_weights: true,
        weight_quant_block: 64,
        ..Default::default()
    };
    for cfg in shapes() {
        let name = cfg.arch.name();
        let (exact, exact_losses, _) = run(&cfg, ZeroConfig::default());
        let (coded, losses, params) = run(&cfg, qwz.clone());
        for (u, unit) in ModelLayout::new(&cfg).units.iter().enumerate() {
            if !matches!(unit.kind, UnitKind::Block(_)) {
                continue;
            }
            let mut want = exact[u].clone();
            let flat = Tensor::new(want.as_slice(), &Device::Cpu).unwrap();
            for p in unit.linear_weights() {
                let q = model::Fp8Weight::quantize(&p.view(&flat).unwrap()).unwrap();
                let values = q.dequantize().unwrap().flatten_all().unwrap();
                want[p.offset..p.offset + p.numel].copy_from_slice(&values.to_vec1().unwrap());
            }
            let b = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(b(&coded[u]), b(&want), "{name}: {}", unit.name);
        }
        let hpz = ZeroConfig {
            hpz_partition_size: 2,
            ..qwz.clone()
        };
        // hpZ gathers the same codes and scales; the step may still sum another way on the GPU
        // (cuDNN's attention backward need not be deterministic), hence the tolerance.
        let (_, hpz_losses, hpz_params) = run(&cfg, hpz);
        for (a, b) in hpz_losses.iter().zip(&losses) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "{name}: hpZ's loss {a} vs {b}"
            );
        }
        let near = |a: &f32, b: &f32| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
        let same = hpz_params
            .iter()
            .flatten()
            .zip(params.iter().flatten())
            .all(|(a, b)| near(a, b));
        assert!(same, "{name}: hpZ's parameters");
        for (a, b) in losses.iter().zip(&exact_losses) {
            assert!(
                a.is_finite() && (a - b).abs() <= 0.05 * b.abs(),
                "{name}: {a} vs {b}"
            );
        }
    }
}
