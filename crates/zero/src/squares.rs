//! The sum of squares of a gradient shard in f64: the per-rank part of the global gradient
//! norm that clipping needs (`Engine::step`).
//!
//! On the CPU, candle ops: cast to f64, square, sum. On a CUDA device, the two-stage kernel of
//! `crates/kernels/cuda/gradnorm.cu` (one pass over the f32 shard at memory speed, then a sum
//! of `GRID` partials): candle's `sum_all` reduces a whole tensor in one CTA, which for a
//! 350M-element model took 200 ms a step on the H200.

use candle_core::{DType, Tensor};

use crate::Result;

/// `sum(x^2)` of a 1-D f32 tensor, as a 0-D f64 tensor on its device (no host read).
/// Deterministic: the same input gives the same bits on a given device.
pub fn sum_of_squares(x: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && x.dtype() == DType::F32 && x.is_contiguous() {
        return Ok(cuda::sum_of_squares(x)?);
    }
    Ok(x.to_dtype(DType::F64)?.sqr()?.sum_all()?)
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, Result, Storage, Tensor};

    /// CTAs of the first stage (`GRID` in the source): a few a SM on the H200's 132.
    const GRID: usize = 1024;
    const DEFINES: [kernels::Define; 1] = [("GRID", GRID as i64)];

    pub(super) fn sum_of_squares(x: &Tensor) -> Result<Tensor> {
        let (st, layout) = x.storage_and_layout();
        let Storage::Cuda(cs) = &*st else {
            candle_core::bail!("sum_of_squares: not a CUDA tensor")
        };
        let dev = cs.device.clone();
        let o = layout.start_offset();
        let n = x.elem_count();
        let view: CudaView<f32> = cs.as_cuda_slice::<f32>()?.slice(o..o + n);
        if (o * 4) % 16 != 0 {
            // The kernel reads float4s: an unaligned view takes the candle path.
            drop(st);
            return x.to_dtype(candle_core::DType::F64)?.sqr()?.sum_all();
        }
        let f = kernels::loader::function(
            &dev,
            &kernels::GRADNORM,
            &DEFINES,
            kernels::Flavour::Fast,
            "sum_squares_f64",
        )
        .map_err(candle_core::Error::wrap)?;
        let stream = dev.cuda_stream();
        // SAFETY: the kernel writes all GRID partials.
        let mut partials = unsafe { stream.alloc::<f64>(GRID) }.w()?;
        let n64 = n as i64;
        let mut b = stream.launch_builder(&f);
        b.arg(&view).arg(&n64).arg(&mut partials);
        let cfg = LaunchConfig {
            grid_dim: (GRID as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (const float*, long long, double*) as in the source; n elements are readable.
        unsafe { b.launch(cfg) }.w()?;
        drop(st);
        let partials = Tensor::from_storage(
            Storage::Cuda(CudaStorage {
                slice: CudaStorageSlice::F64(partials),
                device: dev,
            }),
            GRID,
            BackpropOp::none(),
            false,
        );
        partials.sum_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn cpu_sum_of_squares_is_exact_for_small_integers() {
        let x = Tensor::new(&[1f32, -2.0, 3.0, 0.5], &Device::Cpu).unwrap();
        let s = sum_of_squares(&x).unwrap().to_scalar::<f64>().unwrap();
        assert_eq!(s, 14.25);
    }

    /// Needs only libnvrtc, no GPU.
    #[cfg(feature = "cuda")]
    #[test]
    fn nvrtc_compiles_the_gradnorm_kernel() {
        let ptx = kernels::loader::ptx(
            &kernels::GRADNORM,
            &[("GRID", 1024)],
            kernels::Flavour::Fast,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(ptx.contains(".entry sum_squares_f64("));
    }
}
