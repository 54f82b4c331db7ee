//! Bandwidth of the quantisation kernels against a device-to-device copy, measured in one run
//! on one GPU (`trainer bench --kernels` prints it). A kernel is memory-bound, so the fraction of
//! the copy's bandwidth it reaches says how close it is to the best it could do.
//!
//! Each kernel works on data derived from one f32 input x of `bytes` bytes (n = bytes / 4
//! elements, rounded down to a multiple of 16384): INT8 with block 2048 (weights), INT4 with
//! block 512 (gradients), the swizzle as 2 nodes x 4 ranks, and the fused kernels on 4 pieces,
//! each piece the INT4 of all of x (so their input is 2n bytes and the f32 sum 4n bytes, sizes
//! that do not fit in L2 for the buffers we measure); the requantiser also on 8 pieces (qgZ's
//! first hop with 8 GPUs a node; "dequantize_sum_requantize_int4 x8").
//!
//! Timing: every kernel (and the copy) writes into buffers allocated once before timing (the
//! `cuda::*_into` launchers, which the tensor API also calls); `iters` launches go back to back
//! on the device stream after 3 warm-up launches, bracketed by two CUDA events, and the time
//! per call is the events' elapsed time / iters. So neither allocation nor host launch gaps
//! are timed (launches queue faster than they run). GB/s = (bytes read + bytes written by one
//! call, scales included) / time; the copy (`memcpy_dtod` of n f32) counts 8n bytes.

use candle_core::{CudaDevice, Device, Tensor};

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
/// Pieces of the second requantiser measurement (8 GPUs a node).
pub const BENCH_PIECES_WIDE: usize = 8;

/// Times `iters` calls of `f` launched back to back after 3 warm-up calls, with CUDA events
/// recorded on the device stream before and after; returns seconds per call.
fn time(
    dev: &CudaDevice,
    iters: usize,
    mut f: impl FnMut() -> Result<(), QuantError>,
) -> Result<f64, QuantError> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
    use candle_core::cuda_backend::WrapErr;
    let stream = dev.cuda_stream();
    for _ in 0..3 {
        f()?;
    }
    stream.synchronize().w()?;
    let iters = iters.max(1);
    let start = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .w()?;
    for _ in 0..iters {
        f()?;
    }
    let end = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .w()?;
    let ms = start.elapsed_ms(&end).w()?;
    Ok(f64::from(ms) / 1e3 / iters as f64)
}

fn rate(name: &'static str, bytes_moved: u64, seconds: f64) -> KernelRate {
    KernelRate {
        name,
        bytes_moved,
        seconds,
        gb_per_s: bytes_moved as f64 / seconds / 1e9,
    }
}

/// The CUDA slice behind the contiguous tensor `t` (offset 0: the tensors below are fresh).
fn slice<T: candle_core::cuda_backend::CudaDType>(
    t: &Tensor,
    f: impl FnOnce(
        &candle_core::cuda_backend::cudarc::driver::CudaView<'_, T>,
    ) -> Result<(), QuantError>,
) -> Result<(), QuantError> {
    let (st, layout) = t.storage_and_layout();
    let candle_core::Storage::Cuda(cs) = &*st else {
        unreachable!("benchmark tensors are on the GPU")
    };
    let s = cs.as_cuda_slice::<T>()?;
    let o = layout.start_offset();
    f(&s.slice(o..o + t.elem_count()))
}

/// Measures, on `device`, a device-to-device copy of `bytes` ("copy", read + write counted)
/// and each quantisation kernel on an f32 input of `bytes` bytes (see the module doc), `iters`
/// timed calls each, into preallocated outputs, timed with CUDA events.
pub fn kernel_bandwidth(
    device: &CudaDevice,
    bytes: usize,
    iters: usize,
) -> Result<Vec<KernelRate>, QuantError> {
    use crate::cuda::{self, Out};
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
    let stream = device.cuda_stream();

    // Copy into a preallocated buffer.
    let mut dst = device.alloc_zeros::<f32>(n)?;
    slice::<f32>(&x, |src| {
        let s = time(device, iters, || {
            stream.memcpy_dtod(src, &mut dst).w()?;
            Ok(())
        })?;
        out.push(rate("copy", 8 * n64, s));
        Ok(())
    })?;
    drop(dst);

    let (b8, nb8) = (BENCH_INT8_BLOCK as u64, n.div_ceil(BENCH_INT8_BLOCK));
    let (q8, s8) = tensor::quantize_int8(&x, BENCH_INT8_BLOCK)?;
    {
        let mut codes = device.alloc_zeros::<u8>(n)?;
        let mut scales = device.alloc_zeros::<f32>(nb8)?;
        slice::<f32>(&x, |xv| {
            let s = time(device, iters, || {
                cuda::quantize_int8_into(device, xv, &mut codes, &mut scales, BENCH_INT8_BLOCK)
            })?;
            out.push(rate("quantize_int8", 4 * n64 + n64 + 4 * n64 / b8, s));
            Ok(())
        })?;
    }
    slice::<u8>(&q8, |qv| {
        slice::<f32>(&s8, |sv| {
            let mut y = device.alloc_zeros::<f32>(n)?;
            let s = time(device, iters, || {
                cuda::dequantize_int8_into(device, qv, sv, &mut y, BENCH_INT8_BLOCK)
            })?;
            out.push(rate("dequantize_int8_f32", n64 + 4 * n64 / b8 + 4 * n64, s));
            drop(y);
            // bf16 bits, as u16 (the launcher picks the kernel by the element size).
            let mut y = device.alloc_zeros::<u16>(n)?;
            let s = time(device, iters, || {
                cuda::dequantize_int8_into(device, qv, sv, &mut y, BENCH_INT8_BLOCK)
            })?;
            out.push(rate(
                "dequantize_int8_bf16",
                n64 + 4 * n64 / b8 + 2 * n64,
                s,
            ));
            Ok(())
        })
    })?;
    drop((q8, s8));

    let (b4, nb4) = (BENCH_INT4_BLOCK as u64, n / BENCH_INT4_BLOCK);
    {
        let mut packed = device.alloc_zeros::<u8>(n / 2)?;
        let mut scales = device.alloc_zeros::<f32>(nb4)?;
        slice::<f32>(&x, |xv| {
            let s = time(device, iters, || {
                cuda::quantize_int4_swizzled_into(
                    device,
                    xv,
                    &mut packed,
                    &mut scales,
                    2,
                    4,
                    BENCH_INT4_BLOCK,
                )
            })?;
            out.push(rate(
                "quantize_int4_swizzled",
                4 * n64 + n64 / 2 + 4 * n64 / b4,
                s,
            ));
            Ok(())
        })?;
    }

    // BENCH_PIECES pieces, each the INT4 of all of x: the requantiser and the f32 sum; then the
    // requantiser alone on BENCH_PIECES_WIDE pieces.
    let (p4, s4) = tensor::quantize_int4_swizzled(&x, 1, 1, BENCH_INT4_BLOCK)?;
    drop(x);
    for (pieces, name) in [
        (BENCH_PIECES, "dequantize_sum_requantize_int4"),
        (BENCH_PIECES_WIDE, "dequantize_sum_requantize_int4 x8"),
    ] {
        let packed = Tensor::cat(&vec![&p4; pieces], 0)?;
        let scales = Tensor::cat(&vec![&s4; pieces], 0)?;
        let read = pieces as u64 * (n64 / 2 + 4 * n64 / b4);
        slice::<u8>(&packed, |pv| {
            slice::<f32>(&scales, |sv| {
                let mut q = device.alloc_zeros::<u8>(n / 2)?;
                let mut qs = device.alloc_zeros::<f32>(nb4)?;
                let s = time(device, iters, || {
                    let o = Out::Requantized(&mut q, &mut qs);
                    cuda::dequantize_sum_int4_into(device, pv, sv, pieces, BENCH_INT4_BLOCK, o)
                })?;
                out.push(rate(name, read + n64 / 2 + 4 * n64 / b4, s));
                drop((q, qs));
                if pieces != BENCH_PIECES {
                    return Ok(());
                }
                let mut y = device.alloc_zeros::<f32>(n)?;
                let s = time(device, iters, || {
                    let o = Out::Sum(&mut y);
                    cuda::dequantize_sum_int4_into(device, pv, sv, pieces, BENCH_INT4_BLOCK, o)
                })?;
                out.push(rate("dequantize_sum_int4", read + 4 * n64, s));
                Ok(())
            })
        })?;
    }
    Ok(out)
}
