//! Where a launcher queues its kernels: on its tensors' own device (the device's stream on a GPU,
//! the calling thread on the CPU), or on a second stream of the same GPU, the *communication
//! stream* (`comm`'s jobs: the ZeRO engine's quantisers and copies between collectives, so that
//! the compute stream never runs or waits for them).
//!
//! On a second stream the caller owns the ordering: whoever hands a launcher `Place::Stream`
//! has made that stream wait for the writes of its inputs, and makes the compute stream wait for
//! the stream before reading its outputs (`comm` does both with events). Buffers a launcher
//! allocates there come from the stream itself ([`Place::alloc`]), so that they are freed in that
//! stream's order: use them on that stream only. Outputs the compute stream will read are
//! allocated on the compute stream by the caller and passed in (the `_into` launchers).

#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::CudaDevice;

use crate::profile::{Family, Scope};

/// Where kernels run (see the module doc).
#[derive(Clone, Default)]
pub enum Place {
    /// On the tensors' own device: its stream on a GPU, the calling thread on the CPU.
    #[default]
    Own,
    /// On this stream of the tensors' GPU (the communication stream).
    #[cfg(feature = "cuda")]
    Stream(Arc<CudaStream>),
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Own => f.write_str("Own"),
            #[cfg(feature = "cuda")]
            Place::Stream(_) => f.write_str("Stream"),
        }
    }
}

impl Place {
    /// Whether kernels go to the tensors' own device stream.
    pub fn is_own(&self) -> bool {
        matches!(self, Place::Own)
    }

    /// The stream a kernel on `dev`'s tensors is queued on.
    #[cfg(feature = "cuda")]
    pub fn stream(&self, dev: &CudaDevice) -> Arc<CudaStream> {
        match self {
            Place::Own => dev.cuda_stream(),
            Place::Stream(s) => s.clone(),
        }
    }

    /// `n` elements (at least one) for kernels queued here, allocated on [`Place::stream`]: freed
    /// in that stream's order when dropped, so only work on that stream may use them.
    ///
    /// # Safety
    /// The contents are undefined: a kernel must write every element before any is read.
    #[cfg(feature = "cuda")]
    pub unsafe fn alloc<T: DeviceRepr>(
        &self,
        dev: &CudaDevice,
        n: usize,
    ) -> Result<CudaSlice<T>, candle_core::cuda_backend::cudarc::driver::DriverError> {
        self.stream(dev).alloc::<T>(n.max(1))
    }

    /// A profile span of `family` (see [`crate::profile`]) for work queued here: spans time the
    /// compute stream, so work on another stream gets none (`comm` times its jobs itself).
    pub fn scope(&self, device: &candle_core::Device, family: Family) -> Scope {
        match self {
            Place::Own => crate::profile::scope(device, family),
            #[cfg(feature = "cuda")]
            Place::Stream(_) => crate::profile::scope(&candle_core::Device::Cpu, family),
        }
    }
}

/// Device address of the first element of the contiguous CUDA tensor `t` (its layout's offset
/// included), for kernels and copies that take raw addresses.
#[cfg(feature = "cuda")]
pub fn address(t: &candle_core::Tensor) -> candle_core::Result<u64> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::cuda_backend::CudaStorageSlice as S;
    if !t.is_contiguous() {
        candle_core::bail!("address: the tensor must be contiguous");
    }
    let (st, layout) = t.storage_and_layout();
    let candle_core::Storage::Cuda(cs) = &*st else {
        candle_core::bail!("address: expected a CUDA tensor");
    };
    let stream = cs.device.cuda_stream();
    // Event tracking is off wherever these addresses are used (the trainer turns it off), so
    // the guards record nothing.
    let base = match &cs.slice {
        S::U8(s) => s.device_ptr(&stream).0,
        S::U32(s) => s.device_ptr(&stream).0,
        S::I64(s) => s.device_ptr(&stream).0,
        S::BF16(s) => s.device_ptr(&stream).0,
        S::F16(s) => s.device_ptr(&stream).0,
        S::F32(s) => s.device_ptr(&stream).0,
        S::F64(s) => s.device_ptr(&stream).0,
        _ => candle_core::bail!("address: unsupported dtype {:?}", t.dtype()),
    };
    Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as u64)
}
