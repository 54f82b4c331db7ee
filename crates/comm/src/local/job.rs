//! Jobs on the local backend ([`crate::job`]): the rank's communication thread runs each job in
//! issue order with the rank's collectives, so that the rank's own thread goes on computing.
//!
//! On the CPU the job's kernels run on that thread too and its collectives are the backend's
//! usual ones (new tensors).
//!
//! On a GPU the world's ranks share one *communication stream*, made at the first job: a job
//! waits there for the event its rank recorded on its compute stream at `submit` (after the
//! job's outputs were allocated), queues its kernels there, and moves data between the ranks'
//! buffers with device copies and a piece-sum kernel on that stream; the rank's compute stream
//! waits for the job's `done` event only in [`Pending::wait`], through a [`Fence`] that keeps
//! the job's inputs and outputs alive until then. Every collective of a GPU job ends with a
//! barrier of its group's communication threads, so that every member's copies out of my
//! buffers are queued before I record my `done`: one stream then orders them before anything
//! that waits for it, and nothing of mine is freed while a peer still reads it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use kernels::place::Place;

use super::rendezvous::Payload;
use super::{sum_in_order, Worker};
use crate::job::{buffer, slot, Job, JobClock, JobFn, JobTimes, Lane};
use crate::op::Op;
#[cfg(feature = "cuda")]
use crate::CommError;
use crate::{Group, Result, Topology};

/// A rank's job timing, once [`crate::Communicator::job_clock`] has started it: host seconds
/// on the CPU, CUDA events on a GPU.
#[derive(Default)]
pub(super) struct Timing {
    cpu: JobTimes,
    #[cfg(feature = "cuda")]
    gpu: Arc<Mutex<crate::gpu::EventLog>>,
}

pub(super) type SharedTiming = Arc<Mutex<Option<Timing>>>;

fn lock(t: &SharedTiming) -> std::sync::MutexGuard<'_, Option<Timing>> {
    t.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts the timing of a rank's jobs (if not yet) and returns the clock that reads it.
pub(super) fn clock(timing: &SharedTiming) -> JobClock {
    lock(timing).get_or_insert_with(Timing::default);
    let timing = timing.clone();
    JobClock::new(move || {
        let mut t = lock(&timing);
        let t = t.get_or_insert_with(Timing::default);
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut all = t.cpu.0.clone();
        #[cfg(feature = "cuda")]
        all.extend(crate::gpu::lock_log(&t.gpu).read()?);
        Ok(all)
    })
}

/// Adds `seconds` the host waited for a CPU job of `label` to its exposed time, if timing.
pub(super) fn host_waited(timing: &SharedTiming, label: &'static str, seconds: f64) {
    if let Some(t) = lock(timing).as_mut() {
        t.cpu.add_exposed(label, seconds);
    }
}

/// What a GPU job carries from `submit` to the communication thread.
#[cfg(feature = "cuda")]
pub(super) struct OnGpu {
    dev: candle_core::cuda_backend::CudaDevice,
    compute: Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    /// Recorded on the compute stream after the outputs were allocated.
    ready: candle_core::cuda_backend::cudarc::driver::CudaEvent,
}

/// A job as the communication thread runs it.
pub(super) struct Queued {
    label: &'static str,
    device: Device,
    inputs: Vec<Tensor>,
    outputs: Vec<Tensor>,
    run: JobFn,
    #[cfg(feature = "cuda")]
    gpu: Option<OnGpu>,
    timing: SharedTiming,
}

/// What the communication thread hands back: the results and, on a GPU, the fence to release.
pub(super) struct Finished {
    pub(super) results: Vec<Tensor>,
    #[cfg(feature = "cuda")]
    pub(super) fence: Option<crate::gpu::Fence>,
}

/// The rank thread's half of `submit`: the outputs, and on a GPU the ready event after them.
pub(super) fn prepare(job: Job, timing: SharedTiming) -> Result<Queued> {
    let outputs = job
        .outputs
        .iter()
        .map(|&(dtype, n)| buffer(&Place::Own, &job.device, dtype, n))
        .collect::<Result<Vec<_>>>()?;
    #[cfg(feature = "cuda")]
    let gpu = match &job.device {
        Device::Cuda(dev) => {
            let compute = dev.cuda_stream();
            let ready = compute
                .record_event(None)
                .map_err(|e| crate::gpu::cuda_error("submitting a job", e))?;
            Some(OnGpu {
                dev: dev.clone(),
                compute,
                ready,
            })
        }
        _ => None,
    };
    Ok(Queued {
        label: job.label,
        device: job.device,
        inputs: job.inputs,
        outputs,
        run: job.run,
        #[cfg(feature = "cuda")]
        gpu,
        timing,
    })
}

impl Worker {
    /// Runs a queued job on this communication thread.
    pub(super) fn run_job(&mut self, job: Queued) -> Result<Finished> {
        #[cfg(feature = "cuda")]
        if let Some(gpu) = job.gpu {
            let q = Queued { gpu: None, ..job };
            return self.run_gpu_job(q, gpu);
        }
        let timed = lock(&job.timing).is_some();
        let start = Instant::now();
        let mut lane = LocalLane {
            worker: self,
            place: Place::Own,
            device: job.device,
            #[cfg(feature = "cuda")]
            stream: None,
        };
        let results = (job.run)(&mut lane, &job.inputs, job.outputs);
        if timed {
            if let Some(t) = lock(&job.timing).as_mut() {
                t.cpu.add_busy(job.label, start.elapsed().as_secs_f64());
            }
        }
        Ok(Finished {
            results: results?,
            #[cfg(feature = "cuda")]
            fence: None,
        })
    }

    #[cfg(feature = "cuda")]
    fn run_gpu_job(&mut self, job: Queued, gpu: OnGpu) -> Result<Finished> {
        use crate::gpu::{cuda_error, lock_log, timer, Fence};
        let cuda = |e| cuda_error("running a job", e);
        let stream = self.shared.comm_stream(&gpu.dev)?;
        stream.wait(&gpu.ready).map_err(cuda)?;
        let log = lock(&job.timing).as_ref().map(|t| t.gpu.clone());
        let start = match &log {
            Some(_) => Some(timer(&stream).map_err(cuda)?),
            None => None,
        };
        let mut held = job.inputs.clone();
        held.extend(job.outputs.iter().cloned());
        let mut lane = LocalLane {
            worker: self,
            place: Place::Stream(stream.clone()),
            device: job.device,
            stream: Some((gpu.dev.clone(), stream.clone())),
        };
        let results = (job.run)(&mut lane, &job.inputs, job.outputs);
        // Fenced even on failure: what the job queued may still read the held buffers.
        let done = Arc::new(stream.record_event(None).map_err(cuda)?);
        if let (Some(start), Some(log)) = (start, &log) {
            let end = timer(&stream).map_err(cuda)?;
            lock_log(log).busy(job.label, start, end);
        }
        let fence = Fence {
            label: job.label,
            compute: gpu.compute,
            done,
            held,
            log,
            released: false,
        };
        Ok(Finished {
            results: results?,
            fence: Some(fence),
        })
    }
}

/// A plain collective of a GPU tensor ([`crate::Communicator`]'s methods), on the world's
/// communication stream as a job's collectives are, so that ranks whose tensors live on streams
/// (and candle devices) of their own can exchange them: `out` was allocated on the rank's compute
/// stream before `ready`. The result is `out`, behind the fence.
#[cfg(feature = "cuda")]
pub(super) struct PlainOnGpu {
    pub(super) op: Op,
    pub(super) group: Group,
    pub(super) send: Tensor,
    pub(super) out: Tensor,
    pub(super) gpu: OnGpu,
}

#[cfg(feature = "cuda")]
impl PlainOnGpu {
    /// The rank thread's half: `out` for `op` on `send`, then the ready event.
    pub(super) fn prepare(
        op: Op,
        group: Group,
        send: Tensor,
        topology: Topology,
    ) -> Result<PlainOnGpu> {
        let Device::Cuda(dev) = send.device().clone() else {
            unreachable!("called for GPU tensors")
        };
        let n = topology.group_size(group);
        let len = send.elem_count();
        let out_len = match op {
            Op::AllGather => len * n,
            Op::ReduceScatter => len / n,
            _ => len,
        };
        if matches!(op, Op::AllToAll | Op::ReduceScatter) && !len.is_multiple_of(n) {
            return Err(CommError::Indivisible {
                op: op.name(),
                len,
                parts: n,
            });
        }
        let out = buffer(&Place::Own, send.device(), send.dtype(), out_len)?;
        let compute = dev.cuda_stream();
        let ready = compute
            .record_event(None)
            .map_err(|e| crate::gpu::cuda_error(op.name(), e))?;
        Ok(PlainOnGpu {
            op,
            group,
            send: send
                .contiguous()
                .map_err(|e| CommError::tensor(op.name(), e))?,
            out,
            gpu: OnGpu {
                dev,
                compute,
                ready,
            },
        })
    }
}

#[cfg(feature = "cuda")]
impl Worker {
    /// The communication thread's half of a [`PlainOnGpu`].
    pub(super) fn run_plain_gpu(&mut self, p: PlainOnGpu) -> Result<Finished> {
        use crate::gpu::{copy, cuda_error, sum_pieces, Fence};
        let PlainOnGpu {
            op,
            group,
            send,
            out,
            gpu,
        } = p;
        let cuda = |e| cuda_error(op.name(), e);
        let stream = self.shared.comm_stream(&gpu.dev)?;
        stream.wait(&gpu.ready).map_err(cuda)?;
        let topology = self.shared.topology;
        let (n, me) = (
            topology.group_size(group),
            topology.group_rank(group, self.rank),
        );
        let met = self.meet(group, op, Payload::Tensor(send.clone()));
        let moved = met.and_then(|met| {
            let elem = send.dtype().size_in_bytes();
            let len = send.elem_count();
            let base = address(&out, op)?;
            let at = |p: &Arc<Payload>, elems: usize| -> Result<u64> {
                Ok(address(p.tensor(), op)? + (elems * elem) as u64)
            };
            // SAFETY (each copy and sum): every range lies in a live buffer of this context,
            // held until the barrier below (the peers' by their fences), on the one stream.
            match op {
                Op::AllGather => {
                    for (j, p) in met.iter().enumerate() {
                        unsafe {
                            copy(
                                &stream,
                                base + (j * len * elem) as u64,
                                at(p, 0)?,
                                len * elem,
                            )?
                        };
                    }
                }
                Op::AllToAll => {
                    let chunk = len / n;
                    for (j, p) in met.iter().enumerate() {
                        let dst = base + (j * chunk * elem) as u64;
                        unsafe { copy(&stream, dst, at(p, me * chunk)?, chunk * elem)? };
                    }
                }
                Op::ReduceScatter | Op::AllReduce => {
                    let (from, count) = match op {
                        Op::ReduceScatter => (me * (len / n), len / n),
                        _ => (0, len),
                    };
                    let pieces = met
                        .iter()
                        .map(|p| at(p, from))
                        .collect::<Result<Vec<_>>>()?;
                    unsafe { sum_pieces(&gpu.dev, &stream, send.dtype(), &pieces, base, count)? };
                }
                Op::Broadcast { root } => {
                    unsafe { copy(&stream, base, at(&met[root], 0)?, len * elem)? };
                }
                Op::Barrier => {}
            }
            Ok(())
        });
        // The barrier even after a failed copy: the peers wait for it.
        let barrier = self.meet(group, Op::Barrier, Payload::Empty);
        let done = Arc::new(stream.record_event(None).map_err(cuda)?);
        let fence = Fence {
            label: op.name(),
            compute: gpu.compute,
            done,
            held: vec![send, out.clone()],
            log: None,
            released: false,
        };
        moved?;
        barrier?;
        Ok(Finished {
            results: vec![out],
            fence: Some(fence),
        })
    }
}

/// A job's view of its rank's communication thread.
struct LocalLane<'w> {
    worker: &'w mut Worker,
    place: Place,
    device: Device,
    /// On a GPU: the device and the world's communication stream.
    #[cfg(feature = "cuda")]
    stream: Option<(
        candle_core::cuda_backend::CudaDevice,
        Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    )>,
}

impl LocalLane<'_> {
    fn group_rank(&self, group: Group) -> (usize, usize) {
        let t = self.worker.shared.topology;
        (t.group_size(group), t.group_rank(group, self.worker.rank))
    }
}

impl Lane for LocalLane<'_> {
    fn rank(&self) -> usize {
        self.worker.rank
    }

    fn topology(&self) -> Topology {
        self.worker.shared.topology
    }

    fn place(&self) -> &Place {
        &self.place
    }

    fn alloc(&mut self, dtype: DType, n: usize) -> Result<Tensor> {
        buffer(&self.place, &self.device, dtype, n)
    }

    fn all_gather_in_place(&mut self, group: Group, buf: &Tensor) -> Result<Tensor> {
        let (n, me) = self.group_rank(group);
        if n == 1 {
            return Ok(buf.clone());
        }
        let op = Op::AllGather;
        let mine = slot(buf, n, me, op.name())?;
        #[cfg(feature = "cuda")]
        if let Some((_, stream)) = self.stream.clone() {
            let met = self.worker.meet(group, op, Payload::Tensor(mine))?;
            let elem = buf.dtype().size_in_bytes();
            let len = buf.elem_count() / n;
            let base = address(buf, op)?;
            for (j, p) in met.iter().enumerate().filter(|(j, _)| *j != me) {
                let dst = base + (j * len * elem) as u64;
                // SAFETY: both ranges are `len` elements of live device buffers (the peers'
                // are held by their fences until after the barrier below), on one context.
                unsafe { crate::gpu::copy(&stream, dst, address(p.tensor(), op)?, len * elem)? };
            }
            drop(met);
            self.worker.meet(group, Op::Barrier, Payload::Empty)?;
            return Ok(buf.clone());
        }
        self.worker.run(group, op, Payload::Tensor(mine), |ps, _| {
            let parts: Vec<&Tensor> = ps.iter().map(|p| p.tensor()).collect();
            Tensor::cat(&parts, 0)
        })
    }

    fn all_to_all(&mut self, group: Group, send: &Tensor) -> Result<Tensor> {
        let op = Op::AllToAll;
        #[cfg(feature = "cuda")]
        if let Some((_, stream)) = self.stream.clone() {
            let (n, me) = self.group_rank(group);
            let len = send.elem_count();
            let out = self.alloc(send.dtype(), len)?;
            let met = self.worker.meet(group, op, Payload::Tensor(send.clone()))?;
            let elem = send.dtype().size_in_bytes();
            let chunk = len / n * elem;
            let base = address(&out, op)?;
            for (j, p) in met.iter().enumerate() {
                let src = address(p.tensor(), op)? + (me * chunk) as u64;
                // SAFETY: as in `all_gather_in_place`; `out` is this job's own buffer.
                unsafe { crate::gpu::copy(&stream, base + (j * chunk) as u64, src, chunk)? };
            }
            drop(met);
            self.worker.meet(group, Op::Barrier, Payload::Empty)?;
            return Ok(out);
        }
        self.worker.run(
            group,
            op,
            Payload::Tensor(send.clone()),
            super::all_to_all_result,
        )
    }

    fn reduce_scatter_into(&mut self, group: Group, send: &Tensor, out: &Tensor) -> Result<Tensor> {
        let op = Op::ReduceScatter;
        #[cfg(feature = "cuda")]
        if let Some((dev, stream)) = self.stream.clone() {
            let dtype = send.dtype();
            for t in [send, out] {
                if !matches!(t.dtype(), DType::F32 | DType::BF16) || t.dtype() != dtype {
                    return Err(CommError::UnsupportedDType {
                        op: op.name(),
                        dtype: t.dtype(),
                        takes: "F32 or BF16, send and out alike (a job's reduction on the GPU)",
                    });
                }
            }
            let elem = dtype.size_in_bytes();
            let (n, me) = self.group_rank(group);
            let chunk = send.elem_count() / n;
            if out.elem_count() != chunk {
                return Err(CommError::BadLength {
                    op: op.name(),
                    got: out.elem_count(),
                    expected: chunk,
                });
            }
            let met = self.worker.meet(group, op, Payload::Tensor(send.clone()))?;
            let pieces = met
                .iter()
                .map(|p| Ok(address(p.tensor(), op)? + (me * chunk * elem) as u64))
                .collect::<Result<Vec<u64>>>()?;
            // SAFETY: every piece is `chunk` elements of `dtype` in a live buffer (held until the
            // barrier), and `out` has `chunk` elements of it.
            unsafe {
                crate::gpu::sum_pieces(&dev, &stream, dtype, &pieces, address(out, op)?, chunk)?
            };
            drop(met);
            self.worker.meet(group, Op::Barrier, Payload::Empty)?;
            return Ok(out.clone());
        }
        let _ = out;
        self.worker
            .run(group, op, Payload::Tensor(send.clone()), |ps, me| {
                let chunk = ps[0].len() / ps.len();
                sum_in_order(ps, me * chunk, chunk)
            })
    }
}

#[cfg(feature = "cuda")]
fn address(t: &Tensor, op: Op) -> Result<u64> {
    kernels::place::address(t).map_err(|e| CommError::tensor(op.name(), e))
}
