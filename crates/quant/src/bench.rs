//! Bandwidth of the quantisation kernels against a device-to-device copy, measured in one run
//! on one GPU (`trainer bench --kernels` prints it). A kernel is memory-bound, so the fraction of
//! the copy's bandwidth it reaches says how close it is to the best it could do.
//!
//! Each kernel works on data derived from one f32 input x of `bytes` bytes (n = bytes / 4
//! elements, rounded down to a multiple of 16384): INT8 with block 2048 (weights), INT4 with
//! block 512 (gradients), the swizzle as 2 nodes x 4 ranks, and the fused kernels on 4 pieces,
//! each piece the INT4 of all of x (so their input is 2n bytes and the f32 sum 4n bytes, sizes
//! that do not fit in L2 for the buffers we measure).

use std::time::Instant;

use candle_core::{CudaDevice, DType, Device, Tensor};

use crate::tensor;
use crate::QuantError;

/// One measured kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelRate {
    pub name: &'static str,
    /// Bytes read plus bytes written by one call.
    pub bytes_moved: u64,
    /// Seconds per call (mean over the timed calls).
    pub seconds: f64,
    /// bytes_moved / seconds, in 10^9 bytes per second.
    pub gb_per_s: f64,
}

/// Block of the INT8 (weight) kernels measured.
pub const BENCH_INT8_BLOCK: usize = 2048;
/// Block of the INT4 (gradient) kernels measured.
pub const BENCH_INT4_BLOCK: usize = 512;
/// Pieces of the fused kernels measured.
pub const BENCH_PIECES: usize = 4;

/// Times `iters` calls of `f` after two warm-up calls, synchronising the stream before and
/// after; returns seconds per call.
fn time(
    dev: &CudaDevice,
    iters: usize,
    mut f: impl FnMut() -> Result<(), QuantError>,
) -> Result<f64, QuantError> {
    use candle_core::cuda_backend::WrapErr;
    let stream = dev.cuda_stream();
    for _ in 0..2 {
        f()?;
    }
    stream.synchronize().w()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    stream.synchronize().w()?;
    Ok(t0.elapsed().as_secs_f64() / iters.max(1) as f64)
}

fn rate(name: &'static str, bytes_moved: u64, seconds: f64) -> KernelRate {
    KernelRate {
        name,
        bytes_moved,
        seconds,
        gb_per_s: bytes_moved as f64 / seconds / 1e9,
    }
}

/// Measures, on `device`, a device-to-device copy of `bytes` ("copy", read + write counted)
/// and each quantisation kernel on an f32 input of `bytes` bytes (see the module doc), `iters`
/// timed calls each after a warm-up. Calls go through [`crate::tensor`], output allocation
/// included, as the engine makes them.
pub fn kernel_bandwidth(
    device: &CudaDevice,
    bytes: usize,
    iters: usize,
) -> Result<Vec<KernelRate>, QuantError> {
    use candle_core::cuda_backend::WrapErr;
    let n = (bytes / 4) / 16384 * 16384;
    if n == 0 {
        return Err(QuantError::BadLength {
            what: "benchmark bytes (at least 64 KiB)",
            got: bytes,
            expected: 65536,
        });
    }
    let dev = Device::Cuda(device.clone());
    let x = Tensor::randn(0f32, 1f32, n, &dev)?;
    let n64 = n as u64;
    let mut out = Vec::new();

    // Copy into a preallocated buffer.
    {
        let (st, _) = x.storage_and_layout();
        let candle_core::Storage::Cuda(cs) = &*st else {
            unreachable!("x is on the GPU")
        };
        let src = cs.as_cuda_slice::<f32>()?;
        let mut dst = device.alloc_zeros::<f32>(n)?;
        let stream = device.cuda_stream();
        let s = time(device, iters, || {
            stream.memcpy_dtod(src, &mut dst).w()?;
            Ok(())
        })?;
        out.push(rate("copy", 8 * n64, s));
    }

    let b8 = BENCH_INT8_BLOCK as u64;
    let (q8, s8) = tensor::quantize_int8(&x, BENCH_INT8_BLOCK)?;
    let s = time(device, iters, || {
        tensor::quantize_int8(&x, BENCH_INT8_BLOCK).map(drop)
    })?;
    out.push(rate("quantize_int8", 4 * n64 + n64 + 4 * n64 / b8, s));
    for (name, dtype, width) in [
        ("dequantize_int8_f32", DType::F32, 4),
        ("dequantize_int8_bf16", DType::BF16, 2),
    ] {
        let s = time(device, iters, || {
            tensor::dequantize_int8(&q8, &s8, BENCH_INT8_BLOCK, dtype).map(drop)
        })?;
        out.push(rate(name, n64 + 4 * n64 / b8 + width * n64, s));
    }

    let b4 = BENCH_INT4_BLOCK as u64;
    let s = time(device, iters, || {
        tensor::quantize_int4_swizzled(&x, 2, 4, BENCH_INT4_BLOCK).map(drop)
    })?;
    out.push(rate(
        "quantize_int4_swizzled",
        4 * n64 + n64 / 2 + 4 * n64 / b4,
        s,
    ));

    // BENCH_PIECES pieces, each the INT4 of all of x.
    let (p4, s4) = tensor::quantize_int4_swizzled(&x, 1, 1, BENCH_INT4_BLOCK)?;
    let pieces = BENCH_PIECES;
    let packed = Tensor::cat(&vec![&p4; pieces], 0)?;
    let scales = Tensor::cat(&vec![&s4; pieces], 0)?;
    let k = pieces as u64;
    let read = k * (n64 / 2 + 4 * n64 / b4);
    let s = time(device, iters, || {
        tensor::dequantize_sum_requantize_int4(&packed, &scales, pieces, BENCH_INT4_BLOCK).map(drop)
    })?;
    out.push(rate(
        "dequantize_sum_requantize_int4",
        read + n64 / 2 + 4 * n64 / b4,
        s,
    ));
    let s = time(device, iters, || {
        tensor::dequantize_sum_int4(&packed, &scales, pieces, BENCH_INT4_BLOCK).map(drop)
    })?;
    out.push(rate("dequantize_sum_int4", read + 4 * n64, s));
    Ok(out)
}
