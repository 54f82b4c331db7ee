//! The engine's own passes over a unit, as single kernels on the GPU
//! (`crates/kernels/cuda/shards.cu`): the fp32 master shard cast for a gather, a unit's
//! gradient cast to fp32 with the partition's zero padding, and a reduced slice accumulated
//! into the fp32 gradient shard. On the CPU (and for sizes or alignments the kernels do not
//! take) the same values come from candle ops; the GPU results are bitwise the same.

use candle_core::{DType, Tensor};

use crate::Result;

/// `master` (f32) in `dtype`, for an all-gather.
pub(crate) fn cast_for_gather(master: &Tensor, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if dtype == DType::BF16 {
        if let Some(t) = cuda::cast_f32_bf16(master)? {
            return Ok(t);
        }
    }
    Ok(master.to_dtype(dtype)?)
}

/// `grad` (1-D, any float dtype) as f32, zero-padded to `padded` elements.
pub(crate) fn grad_to_f32_padded(grad: &Tensor, padded: usize) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Some(t) = cuda::cast_pad_bf16_f32(grad, padded)? {
        return Ok(t);
    }
    let numel = grad.elem_count();
    Ok(grad
        .to_dtype(DType::F32)?
        .pad_with_zeros(0, 0, padded - numel)?)
}

/// `acc + coef * x` (f32, same length); with `coef == 1`, `acc + x`.
pub(crate) fn accumulate(acc: &Tensor, x: &Tensor, coef: f32) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Some(t) = cuda::accumulate_f32(acc, x, coef)? {
        return Ok(t);
    }
    let x = if coef == 1.0 {
        x.clone()
    } else {
        x.affine(coef as f64, 0.0)?
    };
    Ok((acc + x)?)
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorageSlice, WrapErr};
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, DType, Result, Storage, Tensor};

    /// CTAs at most (`GRID` in the source): grid-stride beyond that.
    const GRID: usize = 2048;
    const DEFINES: [kernels::Define; 1] = [("GRID", GRID as i64)];

    /// Runs `f` with the CUDA view of `t` when it is a contiguous CUDA tensor of `T` whose start
    /// is 16-byte aligned; `None` otherwise.
    fn with_view<T: CudaDType + DeviceRepr, R>(
        t: &Tensor,
        dtype: DType,
        f: impl FnOnce(&CudaDevice, &CudaView<'_, T>) -> Result<R>,
    ) -> Result<Option<R>> {
        if !t.is_contiguous() || t.dtype() != dtype {
            return Ok(None);
        }
        let (st, layout) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*st else {
            return Ok(None);
        };
        let o = layout.start_offset();
        if !(o * std::mem::size_of::<T>()).is_multiple_of(16) {
            return Ok(None);
        }
        let n = t.elem_count();
        let view = cs.as_cuda_slice::<T>()?.slice(o..o + n);
        Ok(Some(f(&cs.device, &view)?))
    }

    fn grid(units: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (units.div_ceil(256).clamp(1, GRID) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn wrap(slice: CudaStorageSlice, dev: &CudaDevice, n: usize) -> Tensor {
        let st = CudaStorage {
            slice,
            device: dev.clone(),
        };
        Tensor::from_storage(Storage::Cuda(st), n, BackpropOp::none(), false)
    }

    fn func(
        dev: &CudaDevice,
        name: &str,
    ) -> Result<candle_core::cuda_backend::cudarc::driver::CudaFunction> {
        kernels::loader::function(
            dev,
            &kernels::SHARDS,
            &DEFINES,
            kernels::Flavour::Fast,
            name,
        )
        .map_err(candle_core::Error::wrap)
    }

    fn alloc<T: DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every caller's kernel writes all n elements before anything reads them.
        Ok(unsafe { dev.alloc::<T>(n.max(1))? })
    }

    pub(super) fn cast_f32_bf16(master: &Tensor) -> Result<Option<Tensor>> {
        let n = master.elem_count();
        if !n.is_multiple_of(8) || n == 0 {
            return Ok(None);
        }
        with_view::<f32, _>(master, DType::F32, |dev, x| {
            let mut out = alloc::<half::bf16>(dev, n)?;
            let f = func(dev, "cast_f32_bf16")?;
            let stream = dev.cuda_stream();
            let n64 = n as i64;
            let mut b = stream.launch_builder(&f);
            b.arg(x).arg(&mut out).arg(&n64);
            // SAFETY: (const float*, bf16*, long long) as in the source; n elements each.
            unsafe { b.launch(grid(n / 8)) }.w()?;
            Ok(wrap(CudaStorageSlice::BF16(out), dev, n))
        })
    }

    pub(super) fn cast_pad_bf16_f32(grad: &Tensor, padded: usize) -> Result<Option<Tensor>> {
        let n = grad.elem_count();
        if !n.is_multiple_of(8) || !padded.is_multiple_of(8) || padded < n || n == 0 {
            return Ok(None);
        }
        with_view::<half::bf16, _>(grad, DType::BF16, |dev, x| {
            let mut out = alloc::<f32>(dev, padded)?;
            let f = func(dev, "cast_pad_bf16_f32")?;
            let stream = dev.cuda_stream();
            let (n64, p64) = (n as i64, padded as i64);
            let mut b = stream.launch_builder(&f);
            b.arg(x).arg(&n64).arg(&mut out).arg(&p64);
            // SAFETY: (const bf16*, long long, float*, long long); n read, padded written.
            unsafe { b.launch(grid(padded / 8)) }.w()?;
            Ok(wrap(CudaStorageSlice::F32(out), dev, padded))
        })
    }

    pub(super) fn accumulate_f32(acc: &Tensor, x: &Tensor, coef: f32) -> Result<Option<Tensor>> {
        let n = acc.elem_count();
        if !n.is_multiple_of(4) || n == 0 || x.elem_count() != n {
            return Ok(None);
        }
        let r = with_view::<f32, _>(acc, DType::F32, |dev, a| {
            with_view::<f32, _>(x, DType::F32, |_, v| {
                let mut out = alloc::<f32>(dev, n)?;
                let f = func(dev, "accumulate_f32")?;
                let stream = dev.cuda_stream();
                let n64 = n as i64;
                let mut b = stream.launch_builder(&f);
                b.arg(a).arg(v).arg(&coef).arg(&mut out).arg(&n64);
                // SAFETY: (const float*, const float*, float, float*, long long); n each.
                unsafe { b.launch(grid(n / 4)) }.w()?;
                Ok(wrap(CudaStorageSlice::F32(out), dev, n))
            })
        })?;
        Ok(r.flatten())
    }
}
