//! The local backend and the ZeRO++ engine on the GPU against the same code on the CPU.

use candle_core::{DType, Device, Tensor};
use comm::{run_local, Communicator, Group, Topology};
use model::ModelConfig;
use zero::{Engine, EngineOptions, ZeroConfig};

/// GPU 0 on one stream of its own, as the trainer opens it for ranks that share the GPU.
fn gpu() -> Device {
    Device::Cuda(candle_core::cuda_backend::CudaDevice::new_with_stream(0).expect("GPU 0"))
}

/// Every collective of W = 8 (2 x 4) ranks sharing one GPU equals the same collective on the
/// CPU, for each group and dtype: device-to-device copies and in-order sums.
#[test]
fn local_backend_on_one_gpu_equals_the_cpu() {
    let topology = Topology::new(8, 4).unwrap();
    let run = |device: Device| {
        run_local(
            topology,
            move |c| -> Result<Vec<Vec<f32>>, Box<dyn std::error::Error + Send + Sync>> {
                let r = c.rank() as f32;
                let values: Vec<f32> = (0..64)
                    .map(|i| (i as f32 * 0.37 + r).sin() * (1.0 + r))
                    .collect();
                let x = Tensor::from_vec(values, 64, &device)?;
                let mut out = Vec::new();
                for group in [Group::World, Group::IntraNode, Group::InterNode] {
                    for dtype in [DType::F32, DType::BF16] {
                        let x = x.to_dtype(dtype)?;
                        let results = [
                            c.all_gather(group, x.clone()).wait()?,
                            c.all_to_all(group, x.clone()).wait()?,
                            c.reduce_scatter(group, x.clone()).wait()?,
                            c.all_reduce(group, x.clone()).wait()?,
                            c.broadcast(
                                group,
                                1.min(topology.members(group, 0).len() - 1),
                                x.clone(),
                            )
                            .wait()?,
                        ];
                        for t in results {
                            assert!(t.device().same_device(&device));
                            out.push(t.to_dtype(DType::F32)?.to_vec1::<f32>()?);
                        }
                    }
                    let codes = x
                        .affine(10.0, 128.0)?
                        .clamp(0.0, 255.0)?
                        .to_dtype(DType::U8)?;
                    let gathered = c.all_gather(group, codes).wait()?;
                    out.push(gathered.to_dtype(DType::F32)?.to_vec1::<f32>()?);
                }
                Ok(out)
            },
        )
        .unwrap()
    };
    assert_eq!(run(gpu()), run(Device::Cpu));
}

/// A GPU device as the trainer opens it: its own stream, CUDA event tracking off (the trainer's
/// `config::cuda_device`; the jobs' ordering must not lean on cudarc's events).
fn trainer_gpu() -> Device {
    let dev = candle_core::cuda_backend::CudaDevice::new_with_stream(0).expect("GPU 0");
    // SAFETY: the tests order work across streams with the backends' own events, as the trainer.
    unsafe { dev.disable_event_tracking() };
    Device::Cuda(dev)
}

/// Jobs on the local backend's communication stream, W = 8 (2 x 4) ranks and a world of 20 (a
/// reduction of more pieces than one kernel launch sums) sharing one GPU: every collective and
/// kernel of a job gives the exact values of the CPU, and the same as the CPU backend's jobs.
#[test]
fn local_backend_jobs_on_one_gpu_equal_the_cpu() {
    for (w, d) in [(8, 4), (20, 10)] {
        let topology = Topology::new(w, d).unwrap();
        let run = |device: Device| {
            run_local(topology, move |c| {
                crate::nccl::multi::exercise_jobs(&c, &device)
            })
            .unwrap()
        };
        assert_eq!(run(trainer_gpu()), run(Device::Cpu), "W = {w}");
    }
}

fn tiny() -> ModelConfig {
    ModelConfig::gpt2(2, 64, 4, 32, 512)
}

fn batch(rank: usize, step: usize) -> (Vec<u32>, Vec<u32>) {
    let seq: Vec<u32> = (0..2 * 32 + 1)
        .map(|i| ((i * 31 + rank * 7 + step * 13) % 512) as u32)
        .collect();
    (seq[..64].to_vec(), seq[1..65].to_vec())
}

/// Losses of 5 steps of ZeRO++ (qwZ + hpZ + qgZ) at W = 8 (2 x 4) in fp32 on `device`.
fn zeropp_losses(device: Device) -> Vec<f64> {
    let topology = Topology::new(8, 4).unwrap();
    let opts = EngineOptions {
        zero: ZeroConfig {
            quantized_weights: true,
            hpz_partition_size: 4,
            quantized_gradients: true,
            weight_quant_block: 64,
            grad_quant_block: 32,
            ..Default::default()
        },
        total_steps: 5,
        seed: 3,
        device,
        ..Default::default()
    };
    let per_rank = run_local(topology, |c| -> zero::Result<Vec<f64>> {
        let rank = c.rank();
        let mut e = Engine::new(tiny(), opts.clone(), Box::new(c))?;
        let mut losses = Vec::new();
        for step in 0..5 {
            let (x, y) = batch(rank, step);
            let loss = e.forward_backward(&x, &y, 1.0)?;
            losses.push(e.mean_over_world(loss)?);
            e.step(1e-2)?;
        }
        Ok(losses)
    })
    .unwrap();
    per_rank[0].clone()
}

/// Losses of 4 steps of plain ZeRO-3 at W = 4 (2 x 2), 2 micro-batches a rank, with the
/// reduce-scatter in `dtype`, in fp32 on `device`.
fn reduced_losses(device: Device, dtype: zero::ReduceDtype) -> Vec<f64> {
    let opts = EngineOptions {
        zero: ZeroConfig {
            reduce_dtype: dtype,
            ..Default::default()
        },
        total_steps: 4,
        seed: 3,
        device,
        ..Default::default()
    };
    let per_rank = run_local(
        Topology::new(4, 2).unwrap(),
        |c| -> zero::Result<Vec<f64>> {
            let rank = c.rank();
            let mut e = Engine::new(tiny(), opts.clone(), Box::new(c))?;
            let mut losses = Vec::new();
            for step in 0..4 {
                let mut loss = 0.0;
                for m in 0..2 {
                    let (x, y) = batch(2 * rank + m, step);
                    loss += e.forward_backward(&x, &y, 0.5)?;
                }
                losses.push(e.mean_over_world(loss / 2.0)?);
                e.step(1e-2)?;
            }
            Ok(losses)
        },
    )
    .unwrap();
    per_rank[0].clone()
}

/// `zero.reduce_dtype = "bf16"` on the GPU (the bf16 scale-pad, the job's bf16 reduce-scatter,
/// the widening and the add into the f32 shard) follows the CPU's bf16 run and the fp32 one.
#[test]
fn a_bf16_reduction_on_the_gpu_follows_the_cpu() {
    let cpu = reduced_losses(Device::Cpu, zero::ReduceDtype::Bf16);
    let gpu16 = reduced_losses(gpu(), zero::ReduceDtype::Bf16);
    let gpu32 = reduced_losses(gpu(), zero::ReduceDtype::Fp32);
    for (step, ((c, g), f)) in cpu.iter().zip(&gpu16).zip(&gpu32).enumerate() {
        assert!(
            (c - g).abs() <= 1e-3 * c.abs() && (f - g).abs() <= 5e-3 * f.abs(),
            "step {step}: cpu bf16 {c}, gpu bf16 {g}, gpu fp32 {f}"
        );
    }
}

/// The whole ZeRO++ step on the GPU (quantisation kernels, AdamW kernel, device collectives)
/// follows the CPU run: fp32 on both, so only the order of floating-point sums differs.
#[test]
fn zeropp_engine_on_the_gpu_follows_the_cpu() {
    let cpu = zeropp_losses(Device::Cpu);
    let gpu = zeropp_losses(gpu());
    for (step, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        assert!(
            (c - g).abs() <= 1e-3 * c.abs(),
            "step {step}: cpu {c} gpu {g}"
        );
    }
    assert!(cpu[4] < cpu[0], "training lowers the loss: {cpu:?}");
}

/// Divergence on the GPU: rank 5's master shard of block 0 holds a NaN. With qwZ its INT8 block
/// gets a NaN scale, every rank computes a NaN loss, qgZ carries the NaN gradient through both
/// hops, the device sum of squares is NaN, and every rank skips the step with its state bitwise
/// unchanged; the state is then refused for a checkpoint on every rank, naming the tensor.
#[test]
fn a_nan_weight_on_one_rank_skips_the_step_on_every_rank_on_the_gpu() {
    let topology = Topology::new(8, 4).unwrap();
    let device = gpu();
    let opts = EngineOptions {
        zero: ZeroConfig {
            quantized_weights: true,
            hpz_partition_size: 4,
            quantized_gradients: true,
            weight_quant_block: 64,
            grad_quant_block: 32,
            ..Default::default()
        },
        total_steps: 5,
        seed: 3,
        device,
        ..Default::default()
    };
    let out = run_local(topology, |c| -> zero::Result<_> {
        let rank = c.rank();
        let mut e = Engine::new(tiny(), opts.clone(), Box::new(c))?;
        let mut state = e.state()?;
        let bad = state
            .iter()
            .position(|s| s.name.ends_with(".master") && s.name != state[0].name)
            .expect("a block's master");
        if rank == 5 {
            state[bad].data[7] = f32::NAN;
        }
        let saved: std::collections::HashMap<String, Vec<f32>> =
            state.into_iter().map(|s| (s.name, s.data)).collect();
        e.restore(0, &|n| saved.get(n).cloned())?;
        let bits = |e: &Engine| -> zero::Result<Vec<Vec<u32>>> {
            Ok(e.state()?
                .into_iter()
                .map(|s| s.data.iter().map(|v| v.to_bits()).collect())
                .collect())
        };
        let before = bits(&e)?;
        let (x, y) = batch(rank, 0);
        let loss = e.forward_backward(&x, &y, 1.0)?;
        let stats = e.step(1e-2)?;
        assert_eq!(bits(&e)?, before, "rank {rank}: state changed");
        let refused = e.check_finite_state(&e.state()?).map_err(|e| e.to_string());
        Ok((loss, stats, refused))
    })
    .unwrap();
    for (rank, (loss, stats, refused)) in out.iter().enumerate() {
        assert!(loss.is_nan(), "rank {rank}: loss {loss}");
        assert!(
            stats.skipped && stats.grad_norm.is_nan(),
            "rank {rank}: {stats:?}"
        );
        let e = refused.as_ref().unwrap_err();
        assert!(
            e.contains(".master holds a non-finite value on rank 5"),
            "{e}"
        );
    }
}
