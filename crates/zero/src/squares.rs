//! The sum of squares of a gradient shard in f64: the per-rank part of the global gradient
//! norm that clipping needs (`Engine::step`).
//!
//! On the CPU, candle ops: widen to f32, scale, cast to f64, square, sum. On a CUDA device,
//! the two-stage kernel of `crates/kernels/cuda/gradnorm.cu` (one pass over the f32 or bf16
//! values at memory speed, then a sum of `GRID` partials): candle's `sum_all` reduces a whole
//! tensor in one CTA, which for a 350M-element model took 200 ms a step on the H200.

use candle_core::{DType, Tensor};

use crate::{GradShard, Result};

/// `sum((scale x)^2)` of a gradient shard (its values 1-D, f32 or bf16; each scaled in f32,
/// then squared and summed in f64), as a 0-D f64 tensor on its device (no host read).
/// Deterministic: the same input gives the same bits on a given device.
pub fn sum_of_squares(g: &GradShard) -> Result<Tensor> {
    let (x, scale) = (g.values(), g.scale());
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && matches!(x.dtype(), DType::F32 | DType::BF16) && x.is_contiguous() {
        if let Some(s) = cuda::sum_of_squares(x, scale)? {
            return Ok(s);
        }
    }
    let x = x.to_dtype(DType::F32)?;
    let x = match scale == 1.0 {
        true => x,
        false => (x * scale as f64)?,
    };
    Ok(x.to_dtype(DType::F64)?.sqr()?.sum_all()?)
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
    use candle_core::{DType, Result, Storage, Tensor};
    use kernels::launch::{self, Kernel, Module};

    /// CTAs of the first stage (`GRID` in the source): a few a SM on the H200's 132.
    const GRID: usize = 1024;
    const DEFINES: [kernels::Define; 1] = [("GRID", GRID as i64)];

    /// The kernel's sum, or `None` where the values' view is not 16-byte aligned (the kernel
    /// reads 16 bytes at a time; the caller takes the candle path).
    pub(super) fn sum_of_squares(x: &Tensor, scale: f32) -> Result<Option<Tensor>> {
        let (st, layout) = x.storage_and_layout();
        let Storage::Cuda(cs) = &*st else {
            candle_core::bail!("sum_of_squares: not a CUDA tensor")
        };
        let dev = cs.device.clone();
        let o = layout.start_offset();
        let n = x.elem_count();
        if !(o * x.dtype().size_in_bytes()).is_multiple_of(16) {
            return Ok(None);
        }
        let bf16 = x.dtype() == DType::BF16;
        let name = match bf16 {
            true => "sum_squares_bf16_f64",
            false => "sum_squares_f64",
        };
        let module = Module::new(&kernels::GRADNORM, &DEFINES, kernels::Flavour::Fast);
        let f = Kernel::load(&dev, module, name).map_err(candle_core::Error::wrap)?;
        let stream = f.stream();
        // SAFETY: the kernel writes all GRID partials.
        let partials = unsafe { stream.alloc::<f64>(GRID) }.w()?;
        let n64 = n as i64;
        // The address of the values' view, of the kernel's element type.
        let x = match bf16 {
            true => launch::addr(&cs.as_cuda_slice::<half::bf16>()?.slice(o..o + n), stream),
            false => launch::addr(&cs.as_cuda_slice::<f32>()?.slice(o..o + n), stream),
        };
        let out = launch::addr(&partials, stream);
        // SAFETY: (const float* or const bf16*, long long, float, double*) as in the source; n
        // elements of the kernel's type are readable at the view's address, GRID written.
        unsafe { f.launch(launch::grid(GRID, 256), &[&x, &n64, &scale, &out]) }
            .map_err(candle_core::Error::wrap)?;
        drop(st);
        let partials = launch::from_slice(CudaStorageSlice::F64(partials), &dev, GRID);
        partials.sum_all().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn cpu_sum_of_squares_is_exact_for_small_integers() {
        let x = Tensor::new(&[1f32, -2.0, 3.0, 0.5], &Device::Cpu).unwrap();
        let s = sum_of_squares(&GradShard::f32(x.clone()))
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(s, 14.25);
        // Scaled (by a power of two: exact) and in bf16 (these values are exact in bf16 too).
        let half = GradShard::scaled(x.to_dtype(DType::BF16).unwrap(), 0.5);
        let s = sum_of_squares(&half).unwrap().to_scalar::<f64>().unwrap();
        assert_eq!(s, 14.25 / 4.0);
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
        assert!(ptx.contains(".entry sum_squares_bf16_f64("));
    }
}
