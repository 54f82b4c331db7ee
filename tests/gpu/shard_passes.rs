//! The engine's own passes (`zero::shard_passes`, `crates/kernels/cuda/shard_passes.cu`), queued on a second
//! stream of the GPU as a job queues them, equal the CPU's values: the master shard cast into a
//! slot of the gathered buffer, the gradient cast, scaled and padded (an odd length, bf16 and
//! f32, into f32 and into bf16: `zero.reduce_dtype`), the add into the gradient shard (of an f32
//! and of a bf16 slice), the widening of a bf16 slice, and slice copies.

use candle_core::{DType, Device, Tensor};
use kernels::place::Place;
use zero::shard_passes;

use crate::common::{f32_values, uniform};

/// GPU 0, and a second stream of it that waits for everything queued on the first so far.
fn gpu_and_stream() -> (Device, Place) {
    let dev = candle_core::cuda_backend::CudaDevice::new_with_stream(0).expect("GPU 0");
    let compute = dev.cuda_stream();
    let side = compute.context().new_stream().expect("a second stream");
    (Device::Cuda(dev), Place::Stream(side))
}

/// Orders `place`'s stream after the compute stream's work so far.
fn after_compute(device: &Device, place: &Place) {
    let (Device::Cuda(dev), Place::Stream(side)) = (device, place) else {
        unreachable!("a GPU and a stream")
    };
    let ready = dev.cuda_stream().record_event(None).expect("event");
    side.wait(&ready).expect("wait");
}

/// Waits for `place`'s stream, so that the compute stream may read what it wrote.
fn finish(place: &Place) {
    let Place::Stream(side) = place else {
        unreachable!("a stream")
    };
    side.synchronize().expect("sync");
}

fn on(device: &Device, values: &[f32], dtype: DType) -> Tensor {
    Tensor::from_vec(values.to_vec(), values.len(), device)
        .and_then(|t| t.to_dtype(dtype))
        .expect("a tensor")
}

#[test]
fn shard_passes_on_a_second_stream_equal_the_cpu() {
    let (gpu, side) = gpu_and_stream();
    let cpu = Device::Cpu;
    let master = uniform(4 * 64, 1, 3.0);
    // An odd length, below the padded 1024.
    let grad = uniform(1000 - 13, 2, 0.5);
    let shard = uniform(512, 3, 1.0);
    let run = |device: &Device, place: &Place| -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        let zeros = |dtype, n| Tensor::zeros(n, dtype, device).expect("zeros");
        for dtype in [DType::BF16, DType::F32] {
            let gathered = zeros(dtype, 1024);
            let m = on(device, &master, DType::F32);
            let g = on(device, &grad, dtype);
            let padded = zeros(DType::F32, 1024);
            let scaled = zeros(DType::F32, 1024);
            let acc = on(device, &shard, DType::F32);
            let part = zeros(dtype, 128);
            if !place.is_own() {
                after_compute(device, place);
            }
            shard_passes::cast_into(place, &m, &gathered, 512).unwrap();
            shard_passes::scale_pad_into(place, &g, 1.0, &padded).unwrap();
            shard_passes::scale_pad_into(place, &g, 0.125, &scaled).unwrap();
            shard_passes::add_into(place, &acc, &padded.narrow(0, 0, 512).unwrap()).unwrap();
            shard_passes::copy_into(place, &gathered, 512 + 64, 128, &part, 0).unwrap();
            // zero.reduce_dtype = "bf16": the gradient scaled into bf16, a bf16 slice added into
            // the f32 shard and widened into a new one.
            let scaled16 = zeros(DType::BF16, 1024);
            let acc16 = on(device, &shard, DType::F32);
            let widened = zeros(DType::F32, 512);
            shard_passes::scale_pad_into(place, &g, 0.125, &scaled16).unwrap();
            let slice16 = scaled16.narrow(0, 0, 512).unwrap();
            shard_passes::add_into(place, &acc16, &slice16).unwrap();
            shard_passes::widen_into(place, &slice16, &widened).unwrap();
            if !place.is_own() {
                finish(place);
            }
            for t in [
                gathered, padded, scaled, acc, part, scaled16, acc16, widened,
            ] {
                out.push(f32_values(&t));
            }
        }
        out
    };
    let (want, got) = (run(&cpu, &Place::Own), run(&gpu, &side));
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        // `==` on f32: a zero's sign may differ (candle's affine adds +0.0).
        assert!(
            w.iter().zip(g).all(|(a, b)| a == b),
            "pass {i}: {w:?} vs {g:?}"
        );
    }
}
