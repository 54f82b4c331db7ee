//! The one launch toolkit (feature `cuda`): every crate's launchers load, shape and queue their
//! kernels through it, and keep only their kernels' argument lists.
//!
//! - [`Module`]: a kernel family's source, defines (the [`Precision`](crate::Precision) among
//!   them where the family is typed by it) and flavour; [`Kernel::load`] finds a function of it
//!   on a device, compiled and loaded once ([`crate::loader`]) and then kept per thread, so a
//!   launch costs no module lookup.
//! - [`grid`], [`spread`]: the launch shapes the kernels use (CTAs of a fixed thread count; an
//!   elementwise grid over work units, capped where a kernel strides over the rest).
//! - [`Kernel::launch`]: the `unsafe` launch with arguments by value ([`Arg`]: device addresses
//!   as u64, sizes, scalars, `#[repr(C)]` parameter structs), its error a [`KernelError`].
//! - [`uninit`], [`addr`]: fresh outputs a kernel fills, and the address of a cudarc buffer.
//!
//! Kernels queue on the stream of their device, or on the one [`Kernel::on`] names (the
//! communication stream of [`Place::Stream`]); ordering between streams is the caller's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, DeviceRepr, DriverError, LaunchArgs, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Shape, Storage, Tensor};

pub use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

use crate::place::Place;
use crate::{Define, Flavour, KernelError, Result, Source};

/// A kernel family compiled one way: its source, the defines it is compiled with and the
/// flavour. One module is compiled a process and loaded a device per distinct value.
#[derive(Clone, Copy, Debug)]
pub struct Module<'a> {
    pub src: &'static Source,
    pub defines: &'a [Define],
    pub flavour: Flavour,
}

impl<'a> Module<'a> {
    pub fn new(src: &'static Source, defines: &'a [Define], flavour: Flavour) -> Self {
        Module {
            src,
            defines,
            flavour,
        }
    }
}

/// A loaded kernel and the stream its launches queue on.
#[derive(Clone)]
pub struct Kernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
    file: &'static str,
    name: Arc<str>,
}

impl std::ops::Deref for Kernel {
    type Target = CudaFunction;
    fn deref(&self) -> &CudaFunction {
        &self.func
    }
}

/// Key of a loaded kernel: the device's stream, file, flavour, defines, name.
type KernelKey = (usize, &'static str, Flavour, Vec<Define>, String);

thread_local! {
    /// Kernels this thread has loaded, so that a launch costs no module lookup.
    static KERNELS: RefCell<HashMap<KernelKey, Kernel>> = Default::default();
}

impl Kernel {
    /// Kernel `name` of `module` on `dev`, queued on `dev`'s own stream; compiled and loaded
    /// at the first call, kept per thread after it.
    pub fn load(dev: &CudaDevice, module: Module<'_>, name: &str) -> Result<Kernel> {
        let stream = dev.cuda_stream();
        let key: KernelKey = (
            stream.cu_stream() as usize,
            module.src.file,
            module.flavour,
            module.defines.to_vec(),
            name.to_string(),
        );
        if let Some(k) = KERNELS.with(|m| m.borrow().get(&key).cloned()) {
            return Ok(k);
        }
        let func = crate::loader::function(dev, module.src, module.defines, module.flavour, name)?;
        let k = Kernel {
            func,
            stream,
            file: module.src.file,
            name: name.into(),
        };
        KERNELS.with(|m| m.borrow_mut().insert(key, k.clone()));
        Ok(k)
    }

    /// [`Kernel::load`], queued where `place` puts work on `dev`.
    pub fn placed(
        dev: &CudaDevice,
        place: &Place,
        module: Module<'_>,
        name: &str,
    ) -> Result<Kernel> {
        let k = Kernel::load(dev, module, name)?;
        Ok(match place {
            Place::Own => k,
            Place::Stream(s) => k.on(s.clone()),
        })
    }

    /// The same kernel queued on `stream`, a stream of the context it was loaded in.
    pub fn on(mut self, stream: Arc<CudaStream>) -> Kernel {
        self.stream = stream;
        self
    }

    /// The stream its launches queue on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Queues the kernel with `cfg` and `args` (each a kernel parameter by value: device
    /// addresses as u64, sizes as i32/i64, scalars as f32, `#[repr(C)]` structs).
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list, and every address must point to memory
    /// of the size the kernel reads or writes, live until the kernel has run on the stream.
    pub unsafe fn launch(&self, cfg: LaunchConfig, args: &[&dyn Arg]) -> Result<()> {
        let mut b = self.stream.launch_builder(&self.func);
        for a in args {
            a.push(&mut b);
        }
        b.launch(cfg)
            .map(|_| ())
            .map_err(|source| KernelError::Launch {
                file: self.file,
                kernel: self.name.to_string(),
                source,
            })
    }

    /// A driver error of an operation on this kernel (an attribute, an occupancy query).
    pub fn error(&self, source: DriverError) -> KernelError {
        KernelError::Launch {
            file: self.file,
            kernel: self.name.to_string(),
            source,
        }
    }
}

/// A kernel argument passed by value.
pub trait Arg {
    fn push<'a>(&'a self, b: &mut LaunchArgs<'a>);
}

impl<T: DeviceRepr> Arg for T {
    fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(self);
    }
}

/// `ctas` CTAs of `threads` threads, no dynamic shared memory.
pub fn grid(ctas: usize, threads: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (ctas as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The elementwise grid: one thread a work unit (`units`, e.g. 16-byte vectors), CTAs of
/// `threads`, at least one and at most `max_ctas` (the kernel strides over the rest).
pub fn spread(units: usize, threads: usize, max_ctas: usize) -> LaunchConfig {
    grid(units.div_ceil(threads).clamp(1, max_ctas), threads)
}

/// The address of a cudarc buffer (a slice or a view) for a kernel queued on `stream`.
pub fn addr<T, V: DevicePtr<T>>(v: &V, stream: &CudaStream) -> u64 {
    v.device_ptr(stream).0
}

/// A fresh `dtype` tensor of `shape` on `dev`, allocated on `place`'s stream (freed in that
/// stream's order), whose contents are undefined.
///
/// # Safety
/// A kernel must write every element before anything reads it.
pub unsafe fn uninit<S: Into<Shape>>(
    place: &Place,
    dev: &CudaDevice,
    dtype: DType,
    shape: S,
) -> Result<Tensor> {
    let shape = shape.into();
    let n = shape.elem_count();
    let e = |source| KernelError::Alloc { dtype, n, source };
    let slice = match dtype {
        DType::U8 => CudaStorageSlice::U8(place.alloc(dev, n).map_err(e)?),
        DType::U32 => CudaStorageSlice::U32(place.alloc(dev, n).map_err(e)?),
        DType::BF16 => CudaStorageSlice::BF16(place.alloc(dev, n).map_err(e)?),
        DType::F16 => CudaStorageSlice::F16(place.alloc(dev, n).map_err(e)?),
        DType::F32 => CudaStorageSlice::F32(place.alloc(dev, n).map_err(e)?),
        DType::F64 => CudaStorageSlice::F64(place.alloc(dev, n).map_err(e)?),
        dtype => {
            return Err(KernelError::DType {
                dtype,
                op: "uninit",
            })
        }
    };
    Ok(from_slice(slice, dev, shape))
}

/// A tensor of `shape` over a cudarc buffer of `dev` that a kernel filled.
pub fn from_slice<S: Into<Shape>>(slice: CudaStorageSlice, dev: &CudaDevice, shape: S) -> Tensor {
    let st = CudaStorage {
        slice,
        device: dev.clone(),
    };
    Tensor::from_storage(Storage::Cuda(st), shape, BackpropOp::none(), false)
}
