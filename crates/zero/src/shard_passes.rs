//! The engine's own passes over a unit, on the compute stream or (inside a job) on the
//! communication stream, as `place` says: the fp32 master shard cast into its slot of the
//! gathered buffer, a unit's gradient cast to fp32 or bf16 (`zero.reduce_dtype`), scaled and
//! zero-padded for the reduction, a reduced slice (f32 or bf16) widened or added into the fp32
//! gradient shard, and plain copies of a slice. On the GPU
//! each is one kernel of `crates/kernels/cuda/shard_passes.cu` or a device copy; on the CPU the same
//! values come from candle ops, written in place with `slice_set`. Both give the same values.

use candle_core::{DType, Tensor};
use kernels::place::Place;

use crate::{Result, ZeroError};

fn check(what: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<()> {
    match ok {
        true => Ok(()),
        false => Err(ZeroError::ShardBuffer {
            what,
            detail: detail(),
        }),
    }
}

/// `master` (f32 [n]) cast to `out`'s dtype into `out[at..at + n]`.
pub fn cast_into(place: &Place, master: &Tensor, out: &Tensor, at: usize) -> Result<()> {
    let n = master.elem_count();
    check("gather slot", at + n <= out.elem_count(), || {
        format!("{n} elements at {at} in a buffer of {}", out.elem_count())
    })?;
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = out.device() {
        return cuda::cast_into(dev, place, master, out, at);
    }
    let _ = place;
    Ok(out.slice_set(&master.to_dtype(out.dtype())?, 0, at)?)
}

/// `out` (f32 or bf16 [padded]) = `coef` x `grad` (any float dtype, [n <= padded]), multiplied
/// in f32 and rounded once to `out`'s dtype, then zeros.
pub fn scale_pad_into(place: &Place, grad: &Tensor, coef: f32, out: &Tensor) -> Result<()> {
    let (n, padded) = (grad.elem_count(), out.elem_count());
    let to = out.dtype();
    check(
        "gradient",
        n <= padded && matches!(to, DType::F32 | DType::BF16),
        || format!("{n} elements into {padded} of {to:?}"),
    )?;
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = out.device() {
        return cuda::scale_pad(dev, place, grad, coef, out);
    }
    let _ = place;
    let g = grad.to_dtype(DType::F32)?;
    let g = if coef == 1.0 {
        g
    } else {
        g.affine(coef as f64, 0.0)?
    };
    let g = g.pad_with_zeros(0, 0, padded - n)?.to_dtype(to)?;
    Ok(out.slice_set(&g, 0, 0)?)
}

/// `acc += x` (acc f32; x f32 or bf16, widened; same length), in place.
pub fn add_into(place: &Place, acc: &Tensor, x: &Tensor) -> Result<()> {
    check("gradient shard", acc.elem_count() == x.elem_count(), || {
        format!("{} elements plus {}", acc.elem_count(), x.elem_count())
    })?;
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = acc.device() {
        return cuda::add_into(dev, place, acc, x);
    }
    let _ = place;
    Ok(acc.slice_set(&(acc + x.to_dtype(DType::F32)?)?, 0, 0)?)
}

/// `out = x` widened (x bf16, out f32, same length): a slice reduced in bf16 as a new fp32
/// gradient shard.
pub fn widen_into(place: &Place, x: &Tensor, out: &Tensor) -> Result<()> {
    let n = out.elem_count();
    check(
        "gradient shard",
        x.elem_count() == n && x.dtype() == DType::BF16 && out.dtype() == DType::F32,
        || {
            format!(
                "{} of {:?} into {n} of {:?}",
                x.elem_count(),
                x.dtype(),
                out.dtype()
            )
        },
    )?;
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = out.device() {
        return cuda::widen_into(dev, place, x, out);
    }
    let _ = place;
    Ok(out.slice_set(&x.to_dtype(DType::F32)?, 0, 0)?)
}

/// `out = x - y` (f32, same length; `out` may be `x` or `y`).
pub fn sub_into(place: &Place, x: &Tensor, y: &Tensor, out: &Tensor) -> Result<()> {
    let n = out.elem_count();
    check(
        "difference",
        x.elem_count() == n && y.elem_count() == n,
        || format!("{} less {} into {n}", x.elem_count(), y.elem_count()),
    )?;
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = out.device() {
        return cuda::sub_into(dev, place, x, y, out);
    }
    let _ = place;
    Ok(out.slice_set(&(x - y)?, 0, 0)?)
}

/// `out[at..at + len] = src[from..from + len]` (same dtype).
pub fn copy_into(
    place: &Place,
    src: &Tensor,
    from: usize,
    len: usize,
    out: &Tensor,
    at: usize,
) -> Result<()> {
    check(
        "copy",
        from + len <= src.elem_count()
            && at + len <= out.elem_count()
            && src.dtype() == out.dtype(),
        || {
            format!(
                "{len} elements from {from} of {} to {at} of {}",
                src.elem_count(),
                out.elem_count()
            )
        },
    )?;
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = out.device() {
        return cuda::copy(dev, place, src, from, len, out, at);
    }
    let _ = place;
    Ok(out.slice_set(&src.narrow(0, from, len)?.copy()?, 0, at)?)
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{result as driver, LaunchConfig};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{DType, Tensor};
    use kernels::launch::{self, Kernel, Module};
    use kernels::place::{address, Place};

    use crate::{Result, ZeroError};

    /// CTAs at most (`GRID` in the source).
    const GRID: usize = 2048;
    const DEFINES: [kernels::Define; 1] = [("GRID", GRID as i64)];

    fn grid(units: usize) -> LaunchConfig {
        launch::spread(units, 256, GRID)
    }

    /// Kernel `name` of shard_passes.cu, queued where `place` says.
    fn func(dev: &CudaDevice, place: &Place, name: &str) -> Result<Kernel> {
        let module = Module::new(&kernels::SHARD_PASSES, &DEFINES, kernels::Flavour::Fast);
        Ok(Kernel::placed(dev, place, module, name).map_err(candle_core::Error::wrap)?)
    }

    /// The address of `t` plus `at` elements, which must be 16-byte aligned (the kernels' vector
    /// accesses; the engine's partition keeps every slot so).
    fn aligned(t: &Tensor, at: usize, what: &'static str) -> Result<u64> {
        let a = address(t)? + (at * t.dtype().size_in_bytes()) as u64;
        if !a.is_multiple_of(16) {
            return Err(ZeroError::ShardBuffer {
                what,
                detail: format!("address {a:#x} is not 16-byte aligned"),
            });
        }
        Ok(a)
    }

    pub(super) fn cast_into(
        dev: &CudaDevice,
        place: &Place,
        master: &Tensor,
        out: &Tensor,
        at: usize,
    ) -> Result<()> {
        let n = master.elem_count();
        match out.dtype() {
            DType::F32 => copy(dev, place, master, 0, n, out, at),
            DType::BF16 => {
                if !n.is_multiple_of(8) {
                    return Err(ZeroError::ShardBuffer {
                        what: "master shard",
                        detail: format!("{n} elements: the cast takes multiples of 8"),
                    });
                }
                let (x, o) = (
                    aligned(master, 0, "master shard")?,
                    aligned(out, at, "gather slot")?,
                );
                let f = func(dev, place, "cast_f32_bf16")?;
                let n64 = n as i64;
                // SAFETY: (const float*, bf16*, long long); n elements each, in range (checked).
                unsafe { f.launch(grid(n / 8), &[&x, &o, &n64]) }
                    .map_err(candle_core::Error::wrap)?;
                Ok(())
            }
            d => Err(candle_core::Error::UnsupportedDTypeForOp(d, "cast into a gather").into()),
        }
    }

    pub(super) fn scale_pad(
        dev: &CudaDevice,
        place: &Place,
        grad: &Tensor,
        coef: f32,
        out: &Tensor,
    ) -> Result<()> {
        let (n, padded) = (grad.elem_count() as i64, out.elem_count() as i64);
        let (name, per) = match (grad.dtype(), out.dtype()) {
            (DType::BF16, DType::F32) => ("scale_pad_bf16_f32", 8),
            (DType::F32, DType::F32) => ("scale_pad_f32_f32", 4),
            (DType::BF16, DType::BF16) => ("scale_pad_bf16_bf16", 8),
            (DType::F32, DType::BF16) => ("scale_pad_f32_bf16", 8),
            (d, _) => {
                return Err(candle_core::Error::UnsupportedDTypeForOp(d, "gradient cast").into())
            }
        };
        if padded % per != 0 {
            return Err(ZeroError::ShardBuffer {
                what: "padded gradient",
                detail: format!("{padded} elements: not a multiple of {per}"),
            });
        }
        let (x, o) = (
            aligned(grad, 0, "gradient")?,
            aligned(out, 0, "padded gradient")?,
        );
        let f = func(dev, place, name)?;
        // SAFETY: (const T*, long long, float, U*, long long); n read, padded written.
        unsafe {
            f.launch(
                grid(padded as usize / per as usize),
                &[&x, &n, &coef, &o, &padded],
            )
        }
        .map_err(candle_core::Error::wrap)?;
        Ok(())
    }

    pub(super) fn add_into(
        dev: &CudaDevice,
        place: &Place,
        acc: &Tensor,
        x: &Tensor,
    ) -> Result<()> {
        let n = acc.elem_count();
        let (name, per) = match x.dtype() {
            DType::F32 => ("add_f32", 4),
            _ => ("add_bf16_f32", 8),
        };
        if acc.dtype() != DType::F32
            || !matches!(x.dtype(), DType::F32 | DType::BF16)
            || !n.is_multiple_of(per)
        {
            return Err(ZeroError::ShardBuffer {
                what: "gradient shard",
                detail: format!(
                    "{n} elements of {:?} plus {:?}: the add takes f32 plus f32 or bf16, multiples of {per}",
                    acc.dtype(),
                    x.dtype()
                ),
            });
        }
        let (a, v) = (
            aligned(acc, 0, "gradient shard")?,
            aligned(x, 0, "reduced slice")?,
        );
        let f = func(dev, place, name)?;
        let n64 = n as i64;
        // SAFETY: (float*, const T*, long long); n elements each.
        unsafe { f.launch(grid(n / per), &[&a, &v, &n64]) }.map_err(candle_core::Error::wrap)?;
        Ok(())
    }

    pub(super) fn widen_into(
        dev: &CudaDevice,
        place: &Place,
        x: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let n = out.elem_count();
        if !n.is_multiple_of(8) {
            return Err(ZeroError::ShardBuffer {
                what: "gradient shard",
                detail: format!("{n} elements: the widening takes multiples of 8"),
            });
        }
        let (v, o) = (
            aligned(x, 0, "reduced slice")?,
            aligned(out, 0, "gradient shard")?,
        );
        let f = func(dev, place, "cast_bf16_f32")?;
        let n64 = n as i64;
        // SAFETY: (const bf16*, float*, long long); n elements each (checked by the caller).
        unsafe { f.launch(grid(n / 8), &[&v, &o, &n64]) }.map_err(candle_core::Error::wrap)?;
        Ok(())
    }

    pub(super) fn sub_into(
        dev: &CudaDevice,
        place: &Place,
        x: &Tensor,
        y: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let n = out.elem_count();
        if [x, y, out].iter().any(|t| t.dtype() != DType::F32) || !n.is_multiple_of(4) {
            return Err(ZeroError::ShardBuffer {
                what: "difference",
                detail: format!("{n} elements: the difference takes f32, multiples of 4"),
            });
        }
        let (a, b, o) = (
            aligned(x, 0, "minuend")?,
            aligned(y, 0, "subtrahend")?,
            aligned(out, 0, "difference")?,
        );
        let f = func(dev, place, "sub_f32")?;
        let n64 = n as i64;
        // SAFETY: (const float*, const float*, float*, long long); n elements each.
        unsafe { f.launch(grid(n / 4), &[&a, &b, &o, &n64]) }.map_err(candle_core::Error::wrap)?;
        Ok(())
    }

    pub(super) fn copy(
        dev: &CudaDevice,
        place: &Place,
        src: &Tensor,
        from: usize,
        len: usize,
        out: &Tensor,
        at: usize,
    ) -> Result<()> {
        let elem = src.dtype().size_in_bytes();
        let s = address(src)? + (from * elem) as u64;
        let d = address(out)? + (at * elem) as u64;
        let stream = place.stream(dev);
        stream.context().bind_to_thread().w()?;
        if len > 0 {
            // SAFETY: both ranges are in bounds of live buffers of this context (checked by the
            // caller), on the stream whose order the caller keeps.
            unsafe { driver::memcpy_dtod_async(d, s, len * elem, stream.cu_stream()) }.w()?;
        }
        Ok(())
    }
}
