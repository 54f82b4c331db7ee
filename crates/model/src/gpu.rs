//! What every layer's CUDA launcher needs (feature `cuda`): device pointers of candle tensors,
//! fresh outputs, and our kernels from the `kernels` crate.
//!
//! Launchers pass raw device pointers (u64 kernel arguments) and queue everything on the
//! tensor's device stream, so stream order alone keeps inputs alive and outputs written before
//! any later use on that stream. Work on another stream (the NCCL backend's) is ordered by
//! the events that backend records itself.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaStream, DeviceRepr, LaunchConfig,
};
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Device, Shape, Storage, Tensor};

use crate::error::{ModelError, Result};

/// The CUDA device of `t` (an error for a CPU tensor).
pub(crate) fn device(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        _ => Err(candle_core::Error::Msg("expected a CUDA tensor".into()).into()),
    }
}

/// Device address of the first element of `t`, which must be contiguous (any offset).
pub(crate) fn ptr(t: &Tensor) -> Result<u64> {
    Ok(kernels::place::address(t)?)
}

/// A fresh tensor whose contents are undefined: the caller's kernel writes every element
/// before anything reads it.
pub(crate) fn uninit<S: Into<Shape>>(shape: S, dtype: DType, dev: &CudaDevice) -> Result<Tensor> {
    let shape = shape.into();
    let n = shape.elem_count().max(1);
    // SAFETY: documented contract: every element is written by a kernel before any read.
    let slice = unsafe {
        match dtype {
            DType::BF16 => CudaStorageSlice::BF16(dev.alloc(n)?),
            DType::F32 => CudaStorageSlice::F32(dev.alloc(n)?),
            DType::U32 => CudaStorageSlice::U32(dev.alloc(n)?),
            d => return Err(candle_core::Error::UnsupportedDTypeForOp(d, "uninit").into()),
        }
    };
    let st = CudaStorage {
        slice,
        device: dev.clone(),
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(st),
        shape,
        BackpropOp::none(),
        false,
    ))
}

/// A loaded kernel and the stream its launches queue on (the device's).
#[derive(Clone)]
pub(crate) struct Kernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl std::ops::Deref for Kernel {
    type Target = CudaFunction;
    fn deref(&self) -> &CudaFunction {
        &self.func
    }
}

/// Key of a loaded kernel: stream, file, defines, name.
type KernelKey = (usize, &'static str, Vec<kernels::Define>, String);

thread_local! {
    /// Kernels this thread has loaded, so that a launch costs no module lookup.
    static KERNELS: std::cell::RefCell<std::collections::HashMap<KernelKey, Kernel>> =
        Default::default();
}

/// Kernel `name` of `src` compiled with `defines` (fast flavour), loaded on `dev`; kept per
/// thread after the first call.
pub(crate) fn function(
    dev: &CudaDevice,
    src: &kernels::Source,
    defines: &[kernels::Define],
    name: &str,
) -> Result<Kernel> {
    let stream = dev.cuda_stream();
    let key: KernelKey = (
        stream.cu_stream() as usize,
        src.file,
        defines.to_vec(),
        name.to_string(),
    );
    if let Some(k) = KERNELS.with(|m| m.borrow().get(&key).cloned()) {
        return Ok(k);
    }
    let k = Kernel {
        func: kernels::loader::function(dev, src, defines, kernels::Flavour::Fast, name)?,
        stream,
    };
    KERNELS.with(|m| m.borrow_mut().insert(key, k.clone()));
    Ok(k)
}

/// Queues `func` on its device's stream with `cfg` and `args` (each a kernel parameter by
/// value: device addresses as u64, sizes as i32/i64, scalars as f32).
///
/// # Safety
/// `args` must match the kernel's parameter list, and every address must point to memory of
/// the size the kernel reads or writes.
pub(crate) unsafe fn launch(func: &Kernel, cfg: LaunchConfig, args: &[&dyn Arg]) -> Result<()> {
    let mut b = func.stream.launch_builder(&func.func);
    for a in args {
        a.push(&mut b);
    }
    b.launch(cfg)
        .map_err(|e| ModelError::Candle(candle_core::Error::wrap(e)))?;
    Ok(())
}

/// A kernel argument passed by value.
pub(crate) trait Arg {
    fn push<'a>(&'a self, b: &mut candle_core::cuda_backend::cudarc::driver::LaunchArgs<'a>);
}

impl<T: DeviceRepr> Arg for T {
    fn push<'a>(&'a self, b: &mut candle_core::cuda_backend::cudarc::driver::LaunchArgs<'a>) {
        use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
        b.arg(self);
    }
}
