//! What the GPU backends' jobs share (feature `cuda`): buffers for a place, the fence that makes
//! the compute stream wait for a job and keeps the job's buffers alive until then, the timed
//! events behind [`JobClock`](crate::JobClock), raw device copies, and the local backend's
//! f32 piece sum.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::cuda_backend::cudarc::driver::{
    result as driver, CudaEvent, CudaStream, DriverError,
};
use candle_core::cuda_backend::CudaDevice;
use candle_core::{DType, Tensor};
use kernels::launch::{self, Kernel, Module};
use kernels::place::Place;

use crate::job_time::{JobTime, JobTimes};
use crate::{CommError, Result};

pub(crate) fn cuda_error(op: &'static str, e: DriverError) -> CommError {
    CommError::Cuda {
        op,
        source: Arc::new(e),
    }
}

/// `n` elements of `dtype` on `dev`, allocated on `place`'s stream (contents undefined).
pub(crate) fn uninit(place: &Place, dev: &CudaDevice, dtype: DType, n: usize) -> Result<Tensor> {
    // SAFETY: the contents are undefined until a job's kernel or copy writes them, which the
    // job contract requires before any read.
    unsafe { launch::uninit(place, dev, dtype, n) }.map_err(|e| kernel_error("job buffer", e))
}

/// A kernel toolkit error of `op` (`kernels::launch`).
pub(crate) fn kernel_error(op: &'static str, e: kernels::KernelError) -> CommError {
    CommError::Kernel {
        op,
        source: Arc::new(e),
    }
}

/// A timed event (timing enabled) recorded on `stream` now.
pub(crate) fn timer(stream: &CudaStream) -> std::result::Result<CudaEvent, DriverError> {
    stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
}

/// The timed events of one communicator's jobs: each job's span on the communication stream
/// (busy) and each wait of the compute stream for one (exposed), added up per label once they
/// have run.
#[derive(Default)]
pub(crate) struct EventLog {
    busy: VecDeque<(&'static str, CudaEvent, CudaEvent)>,
    exposed: VecDeque<(&'static str, CudaEvent, CudaEvent)>,
    times: JobTimes,
}

/// Pairs kept before the completed ones are added up (bounds the events held between reads).
const FOLD_AT: usize = 1024;

impl EventLog {
    pub(crate) fn busy(&mut self, label: &'static str, start: CudaEvent, end: CudaEvent) {
        self.busy.push_back((label, start, end));
        if self.busy.len() >= FOLD_AT {
            let _ = self.fold(false);
        }
    }

    pub(crate) fn exposed(&mut self, label: &'static str, before: CudaEvent, after: CudaEvent) {
        self.exposed.push_back((label, before, after));
        if self.exposed.len() >= FOLD_AT {
            let _ = self.fold(false);
        }
    }

    /// Adds up the pairs that have run (all of them, blocking, with `block`).
    fn fold(&mut self, block: bool) -> std::result::Result<(), DriverError> {
        fn drain(
            q: &mut VecDeque<(&'static str, CudaEvent, CudaEvent)>,
            block: bool,
            mut add: impl FnMut(&'static str, f64),
        ) -> std::result::Result<(), DriverError> {
            while let Some((label, a, b)) = q.front() {
                if block {
                    b.synchronize()?;
                } else if !b.is_complete() {
                    break;
                }
                add(label, f64::from(a.elapsed_ms(b)?) * 1e-3);
                q.pop_front();
            }
            Ok(())
        }
        let times = &mut self.times;
        drain(&mut self.busy, block, |l, s| times.add_busy(l, s))?;
        drain(&mut self.exposed, block, |l, s| times.add_exposed(l, s))
    }

    /// Every label's times so far, waiting for the recorded events.
    pub(crate) fn read(&mut self) -> Result<Vec<JobTime>> {
        self.fold(true)
            .map_err(|e| cuda_error("reading the job clock", e))?;
        Ok(self.times.0.clone())
    }
}

pub(crate) fn lock_log(log: &Mutex<EventLog>) -> MutexGuard<'_, EventLog> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The compute stream's side of a job in flight: [`Fence::release`] makes the compute stream
/// wait for the job's `done` event (timed where the communicator times its jobs), and only then
/// are the job's inputs and outputs let go, so that no buffer the job uses is freed (in compute
/// order) before the job is done with it. A fence dropped unreleased still makes the compute
/// stream wait first.
pub(crate) struct Fence {
    pub(crate) label: &'static str,
    pub(crate) compute: Arc<CudaStream>,
    pub(crate) done: Arc<CudaEvent>,
    /// The job's inputs and outputs, only kept alive: dropped after the wait.
    #[allow(dead_code)]
    pub(crate) held: Vec<Tensor>,
    pub(crate) log: Option<Arc<Mutex<EventLog>>>,
    pub(crate) released: bool,
}

impl Fence {
    /// Orders the compute stream after the job; the held buffers go after that.
    pub(crate) fn release(mut self) -> Result<()> {
        let cuda = |e| cuda_error("waiting for a job", e);
        let before = match &self.log {
            Some(_) => Some(timer(&self.compute).map_err(cuda)?),
            None => None,
        };
        self.compute.wait(&self.done).map_err(cuda)?;
        self.released = true;
        if let (Some(before), Some(log)) = (before, &self.log) {
            let after = timer(&self.compute).map_err(cuda)?;
            lock_log(log).exposed(self.label, before, after);
        }
        Ok(())
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        if !self.released {
            // Nothing better to do with a driver error in a drop; the buffers must not go first.
            let _ = self.compute.wait(&self.done);
        }
    }
}

/// Queues a copy of `bytes` bytes from device address `src` to `dst` on `stream`.
///
/// # Safety
/// Both ranges must be device memory of `stream`'s context that stays allocated until the copy
/// has run, and nothing may write `dst` or `src` meanwhile.
pub(crate) unsafe fn copy(stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| cuda_error("copy", e))?;
    // SAFETY: the caller vouches for both ranges.
    unsafe { driver::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
        .map_err(|e| cuda_error("copy", e))
}

/// Pieces one launch of `sum_pieces_f32` adds (`MAX_PIECES` in collectives.cu).
const MAX_PIECES: usize = 16;
/// CTAs at most (`GRID` in the source).
const GRID: usize = 2048;

/// The kernel's `Pieces` parameter.
#[repr(C)]
#[derive(Clone, Copy)]
struct Pieces {
    p: [u64; MAX_PIECES],
    count: i32,
}

// SAFETY: plain #[repr(C)] data with the layout of the kernel's struct Pieces.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for Pieces {}

/// Queues on `stream`: `out[i] = pieces[0][i] + pieces[1][i] + ...` for `i < n`, in piece
/// order (the CPU's `sum_in_order`: f32, or bf16 rounding every partial sum), as
/// `sum_pieces_*` launches of at most [`MAX_PIECES`].
///
/// # Safety
/// Every address must hold `n` elements of `dtype` of `stream`'s context, allocated until the
/// kernels have run.
pub(crate) unsafe fn sum_pieces(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    dtype: DType,
    pieces: &[u64],
    out: u64,
    n: usize,
) -> Result<()> {
    let name = match dtype {
        DType::F32 => "sum_pieces_f32",
        DType::BF16 => "sum_pieces_bf16",
        dtype => {
            return Err(CommError::UnsupportedDType {
                op: "reduction on the GPU's communication stream",
                dtype,
                takes: "F32 or BF16",
            })
        }
    };
    if n == 0 || pieces.is_empty() {
        return Ok(());
    }
    let defines = [("MAX_PIECES", MAX_PIECES as i64), ("GRID", GRID as i64)];
    let module = Module::new(&kernels::COLLECTIVES, &defines, kernels::Flavour::Exact);
    let func = Kernel::load(dev, module, name)
        .map_err(|e| kernel_error("reduce_scatter", e))?
        .on(stream.clone());
    let cfg = launch::spread(n, 256, GRID);
    for (k, chunk) in pieces.chunks(MAX_PIECES).enumerate() {
        let mut arg = Pieces {
            p: [0; MAX_PIECES],
            count: chunk.len() as i32,
        };
        arg.p[..chunk.len()].copy_from_slice(chunk);
        let (n64, accumulate) = (n as i64, i32::from(k > 0));
        // SAFETY: (Pieces, T*, long long, int) as in the source; the caller vouches for the
        // addresses.
        unsafe { func.launch(cfg, &[&arg, &out, &n64, &accumulate]) }
            .map_err(|e| kernel_error("reduce_scatter", e))?;
    }
    Ok(())
}
