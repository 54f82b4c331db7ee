//! The emulated link's hold: a one-thread kernel that keeps the communication stream busy for
//! the time a collective's cross-node bytes take on the emulated link ([`crate::link`]).

use std::sync::Arc;
use std::time::Duration;

use candle_core::cuda_backend::cudarc::driver::CudaStream;
use candle_core::CudaDevice;
use kernels::launch::{Kernel, LaunchConfig, Module};

use crate::gpu::kernel_error;
use crate::Result;

const HOLD_OP: &str = "emulated link";

/// The kernel of [`hold_stream`] (`crates/kernels/cuda/hold.cu`: one thread that sleeps until
/// `ns` nanoseconds of the global timer have passed since it started) on `device`: compiled once
/// a process, loaded once a device, by [`kernels::loader`].
pub(super) fn hold_function(device: &CudaDevice) -> Result<Kernel> {
    let module = Module::new(&kernels::HOLD, &[], kernels::Flavour::Exact);
    Kernel::load(device, module, "hold_stream").map_err(|e| kernel_error(HOLD_OP, e))
}

/// Enqueues on `stream` a kernel that keeps it busy for `hold` (the emulated link's transfer).
pub(super) fn hold_stream(
    device: &CudaDevice,
    stream: &Arc<CudaStream>,
    hold: Duration,
) -> Result<()> {
    let func = hold_function(device)?.on(stream.clone());
    let ns = u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX);
    // SAFETY: the kernel takes one u64 and touches no memory.
    unsafe { func.launch(LaunchConfig::for_num_elems(1), &[&ns]) }
        .map_err(|e| kernel_error(HOLD_OP, e))
}
