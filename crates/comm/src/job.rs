//! Jobs: work on the communication side of a rank, in issue order with its collectives.
//!
//! A ZeRO++ gather is more than one collective: qwZ quantises the shard, all-gathers the codes
//! and the scales, and dequantises; qgZ quantises, exchanges within the node, requantises and
//! exchanges across nodes. Run on the compute stream, those kernels cost compute time and make
//! compute wait at every hop. A [`Job`] instead runs the whole chain where the rank's
//! collectives run ([`Communicator::submit`]): on the `nccl` backend and the `local` backend on
//! a GPU, on the communication stream, ordered after the compute that wrote the job's inputs by
//! an event, with the compute stream waiting for the job only in [`Pending::wait`]; on the
//! `local` backend on the CPU, on the rank's communication thread. The job's kernels go where
//! [`Lane::place`] says.
//!
//! Buffers:
//! - `inputs` are the tensors the job reads that compute wrote; the backend keeps them alive
//!   until the compute stream has waited for the job (a freed input could otherwise be reused
//!   while the job still reads it).
//! - `outputs` are the buffers the job fills for compute to read: the backend allocates them at
//!   [`Communicator::submit`] on the compute device, before the event the job waits for, and the
//!   job writes them in place (`_into` launchers, [`Lane::all_gather_in_place`]).
//! - everything else the job needs it takes from [`Lane::alloc`]: buffers of the communication
//!   side, which only the job (or a later job) may use.
//!
//! On the CPU, buffers are written functionally: a collective or an `_into` function may return a
//! new tensor instead of the one it was given, so a job always uses what they return.
//!
//! A job's collectives are counted like any other, and must be issued in the same order on every
//! member of their groups, as [`Communicator`] asks.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use kernels::place::Place;

use crate::{CommError, Communicator, Group, Pending, Result, Topology};

/// The communication side as a job sees it: collectives whose results are usable at once by the
/// job's next kernels (queued on [`Lane::place`]), and buffers of its own.
pub trait Lane {
    /// My world rank.
    fn rank(&self) -> usize;
    /// The world's layout.
    fn topology(&self) -> Topology;
    /// Where the job queues its kernels.
    fn place(&self) -> &Place;
    /// `n` elements of `dtype` for the job's own use (contents undefined on a GPU, zero on the
    /// CPU), on the communication side.
    fn alloc(&mut self, dtype: DType, n: usize) -> Result<Tensor>;
    /// `buf` holds my contribution in my group-rank slot (`buf.len() / group size` elements);
    /// fills every other member's slot with theirs and returns the gathered buffer (`buf` on a
    /// GPU; a new tensor on the CPU).
    fn all_gather_in_place(&mut self, group: Group, buf: &Tensor) -> Result<Tensor>;
    /// As [`Communicator::all_to_all`]; the result is a buffer of the communication side.
    fn all_to_all(&mut self, group: Group, send: &Tensor) -> Result<Tensor>;
    /// As [`Communicator::reduce_scatter`] (f32 or bf16; `out` in `send`'s dtype), writing my
    /// slice of the sum into `out` (`len / group size` elements) and returning it (`out` on a
    /// GPU; a new tensor on the CPU).
    fn reduce_scatter_into(&mut self, group: Group, send: &Tensor, out: &Tensor) -> Result<Tensor>;
}

/// What a job does with its lane, the tensors of `inputs` and the allocated `outputs`: it returns
/// its results, the outputs first (as the job wrote them) and then anything it keeps for later
/// jobs (buffers of the communication side).
pub type JobFn =
    Box<dyn FnOnce(&mut dyn Lane, &[Tensor], Vec<Tensor>) -> Result<Vec<Tensor>> + Send>;

/// A job: its label (what [`JobTime`] reports it as), the compute device, what it reads and what
/// it fills (see the module doc), and the work.
pub struct Job {
    pub label: &'static str,
    pub device: Device,
    pub inputs: Vec<Tensor>,
    pub outputs: Vec<(DType, usize)>,
    pub run: JobFn,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("label", &self.label)
            .field("inputs", &self.inputs.len())
            .field("outputs", &self.outputs)
            .finish()
    }
}

impl CommError {
    /// An error of the caller's own work inside job `label` (a kernel, a tensor operation).
    pub fn in_job(
        label: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        CommError::Job {
            label,
            source: Arc::new(source),
        }
    }
}

/// A fresh buffer of `n` elements on `device` for `place`: on a GPU uninitialised, from the
/// place's stream; on the CPU zero.
pub fn buffer(place: &Place, device: &Device, dtype: DType, n: usize) -> Result<Tensor> {
    let op = "job buffer";
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => crate::gpu::uninit(place, dev, dtype, n),
        _ => {
            let _ = place;
            Tensor::zeros(n, dtype, device).map_err(|e| CommError::tensor(op, e))
        }
    }
}

/// Runs `job` at once on the caller's thread, its kernels on the tensors' own device and each
/// collective issued through `comm` and waited: the [`Communicator::submit`] of backends without
/// a communication side of their own (one rank, MPI, test doubles). Blocking, so it overlaps
/// nothing; on one rank every collective is the identity and costs nothing.
pub fn run_direct(comm: &dyn Communicator, job: Job) -> Pending<Vec<Tensor>> {
    let mut lane = Direct {
        comm,
        place: Place::Own,
        device: job.device.clone(),
    };
    let outputs = job
        .outputs
        .iter()
        .map(|&(dtype, n)| buffer(&Place::Own, &job.device, dtype, n))
        .collect::<Result<Vec<_>>>();
    match outputs.and_then(|outputs| (job.run)(&mut lane, &job.inputs, outputs)) {
        Ok(results) => Pending::ready(results),
        Err(e) => Pending::failed(e),
    }
}

/// The lane of [`run_direct`].
struct Direct<'a> {
    comm: &'a dyn Communicator,
    place: Place,
    device: Device,
}

impl Lane for Direct<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn topology(&self) -> Topology {
        self.comm.topology()
    }
    fn place(&self) -> &Place {
        &self.place
    }
    fn alloc(&mut self, dtype: DType, n: usize) -> Result<Tensor> {
        buffer(&self.place, &self.device, dtype, n)
    }
    fn all_gather_in_place(&mut self, group: Group, buf: &Tensor) -> Result<Tensor> {
        let topology = self.comm.topology();
        let n = topology.group_size(group);
        if n == 1 {
            return Ok(buf.clone());
        }
        let mine = slot(
            buf,
            n,
            topology.group_rank(group, self.comm.rank()),
            "all_gather",
        )?;
        self.comm.all_gather(group, mine).wait()
    }
    fn all_to_all(&mut self, group: Group, send: &Tensor) -> Result<Tensor> {
        self.comm.all_to_all(group, send.clone()).wait()
    }
    fn reduce_scatter_into(&mut self, group: Group, send: &Tensor, _: &Tensor) -> Result<Tensor> {
        self.comm.reduce_scatter(group, send.clone()).wait()
    }
}

/// Group rank `me`'s slot of `buf` (one of `n` equal slots), as a tensor of its own.
pub(crate) fn slot(buf: &Tensor, n: usize, me: usize, op: &'static str) -> Result<Tensor> {
    let len = buf.elem_count();
    if !len.is_multiple_of(n) {
        return Err(CommError::Indivisible { op, len, parts: n });
    }
    let s = len / n;
    buf.narrow(0, me * s, s)
        .map_err(|e| CommError::tensor(op, e))
}

pub(crate) use crate::job_time::JobTimes;
pub use crate::job_time::{JobClock, JobTime};
