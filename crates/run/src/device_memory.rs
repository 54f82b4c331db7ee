//! Device memory: free and total, and the peak for `trainer bench` and the metrics: the high-water mark of the CUDA memory pool that
//! candle's stream-ordered allocations come from.

use candle_core::Device;

/// Bytes of device memory in use at the peak since the last [`reset_peak`] (`None` on the CPU).
///
/// This is the default memory pool's `USED_MEM_HIGH`: every tensor candle allocates on the
/// stream, not cuBLAS's workspace or the loaded kernels (a few hundred MB at most).
pub fn peak_bytes(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        return cuda::pool_attribute(dev, cuda::USED_MEM_HIGH, None).ok();
    }
    let _ = device;
    None
}

/// Starts a new peak measurement.
pub fn reset_peak(device: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        // Only 0 may be written to USED_MEM_HIGH; a failure just leaves the older peak.
        let _ = cuda::pool_attribute(dev, cuda::USED_MEM_HIGH, Some(0));
    }
    let _ = device;
}

/// Makes the device's default memory pool, which every candle tensor comes from, keep the memory
/// freed into it instead of handing it back to the driver at each synchronisation (its release
/// threshold, 0 by default, set to the maximum). Without this, each step maps its buffers anew
/// (a few hundred MB for gpt350m, GBs for larger models), and a collective's output buffer is
/// re-mapped every call. A pool that keeps its peak is what PyTorch's caching allocator does
/// too; other processes then see that memory as used. A failure only costs that speed, so it
/// warns and goes on.
#[cfg(feature = "cuda")]
pub fn keep_freed_memory(dev: &candle_core::cuda_backend::CudaDevice) {
    if let Err(e) = cuda::pool_attribute(dev, cuda::RELEASE_THRESHOLD, Some(u64::MAX)) {
        eprintln!("warning: cannot set the CUDA memory pool's release threshold ({e}); freed device memory goes back to the driver at each synchronisation");
    }
}

/// Bytes in use on the whole device now, by every process (total - free), `None` on the CPU.
pub fn device_used_bytes(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let (free, total) = dev.cuda_stream().context().mem_get_info().ok()?;
        return Some((total - free) as u64);
    }
    let _ = device;
    None
}

/// Bytes of device memory free now, `None` on the CPU (or when the driver cannot say).
pub fn device_free_bytes(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let (free, _total) = dev.cuda_stream().context().mem_get_info().ok()?;
        return Some(free as u64);
    }
    let _ = device;
    None
}

/// The device's total memory, `None` on the CPU (or when the driver cannot say).
pub fn device_total_bytes(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let (_free, total) = dev.cuda_stream().context().mem_get_info().ok()?;
        return Some(total as u64);
    }
    let _ = device;
    None
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{sys, DriverError};
    use candle_core::cuda_backend::CudaDevice;

    pub use sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as RELEASE_THRESHOLD;
    pub use sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH as USED_MEM_HIGH;

    /// Reads (or, with `set`, writes) a 64-bit attribute of the device's default memory pool.
    pub fn pool_attribute(
        dev: &CudaDevice,
        attr: sys::CUmemPool_attribute,
        set: Option<u64>,
    ) -> Result<u64, DriverError> {
        let ctx = dev.cuda_stream().context().clone();
        ctx.bind_to_thread()?;
        let mut pool = std::ptr::null_mut();
        let mut value = set.unwrap_or(0);
        // SAFETY: the context is current; `pool` and `value` outlive the calls, and the
        // attributes read or written here are 64-bit (cuuint64_t), as `value` is.
        unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result()?;
            let ptr = &mut value as *mut u64 as *mut std::ffi::c_void;
            match set {
                Some(_) => sys::cuMemPoolSetAttribute(pool, attr, ptr).result()?,
                None => sys::cuMemPoolGetAttribute(pool, attr, ptr).result()?,
            }
        }
        Ok(value)
    }
}
