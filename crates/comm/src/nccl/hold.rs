//! The emulated link's hold: a one-thread kernel that keeps the communication stream busy for
//! the time a collective's cross-node bytes take on the emulated link ([`crate::link`]).

use std::sync::Arc;
use std::time::Duration;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use candle_core::CudaDevice;

use super::cuda_error;
use crate::{CommError, Result};

const HOLD_OP: &str = "emulated link";

/// The kernel of [`hold_stream`] (`crates/kernels/cuda/hold.cu`: one thread that sleeps until
/// `ns` nanoseconds of the global timer have passed since it started) on `device`: compiled once
/// a process, loaded once a device, by [`kernels::loader`].
pub(super) fn hold_function(device: &CudaDevice) -> Result<CudaFunction> {
    kernels::loader::function(
        device,
        &kernels::HOLD,
        &[],
        kernels::Flavour::Exact,
        "hold_stream",
    )
    .map_err(|e| CommError::Kernel {
        op: HOLD_OP,
        source: Arc::new(e),
    })
}

/// Enqueues on `stream` a kernel that keeps it busy for `hold` (the emulated link's transfer).
pub(super) fn hold_stream(
    device: &CudaDevice,
    stream: &Arc<CudaStream>,
    hold: Duration,
) -> Result<()> {
    let func = hold_function(device)?;
    let ns = u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX);
    let mut launch = stream.launch_builder(&func);
    launch.arg(&ns);
    // SAFETY: the kernel takes one u64 and touches no memory.
    unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }.map_err(|e| cuda_error(HOLD_OP, e))?;
    Ok(())
}
