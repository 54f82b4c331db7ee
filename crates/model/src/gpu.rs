//! What every layer's CUDA launcher needs (feature `cuda`): device pointers of candle tensors,
//! fresh outputs, and our kernels from the `kernels` crate, loaded for a [`Precision`] and
//! launched through its toolkit (`kernels::launch`).
//!
//! Launchers pass raw device pointers (u64 kernel arguments) and queue everything on the
//! tensor's device stream, so stream order alone keeps inputs alive and outputs written before
//! any later use on that stream. Work on another stream (the NCCL backend's) is ordered by
//! the events that backend records itself.

use candle_core::cuda_backend::CudaDevice;
use candle_core::{DType, Device, Shape, Tensor};
use kernels::launch::{self, Kernel, Module};
use kernels::place::Place;
use kernels::Precision;

use crate::error::Result;

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
    // SAFETY: documented contract: every element is written by a kernel before any read.
    Ok(unsafe { launch::uninit(&Place::Own, dev, dtype, shape) }?)
}

/// Kernel `name` of the model's family `src` for `precision`, compiled with `defines` (fast
/// flavour), loaded on `dev` and queued on its stream; kept per thread after the first call.
pub(crate) fn function(
    dev: &CudaDevice,
    precision: Precision,
    src: &'static kernels::Source,
    defines: &[kernels::Define],
    name: &str,
) -> Result<Kernel> {
    let mut all = Vec::with_capacity(defines.len() + 1);
    all.push(precision.define());
    all.extend_from_slice(defines);
    Ok(Kernel::load(
        dev,
        Module::new(src, &all, kernels::Flavour::Fast),
        name,
    )?)
}
