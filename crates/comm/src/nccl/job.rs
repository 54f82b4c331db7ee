//! Jobs on the NCCL backend ([`crate::job`]): run at `submit` on the caller's thread, every
//! kernel and collective of the job queued on the communication stream.
//!
//! `submit` allocates the job's outputs on the compute stream, records `ready` there and makes
//! the communication stream wait for it (the compute that wrote the inputs, and the outputs'
//! allocation, come first), runs the job, and records `done` on the communication stream.
//! [`Pending::wait`] makes the compute stream wait for `done` through a [`Fence`], which holds
//! the inputs and outputs until then. Inside the job, collectives follow each other on the
//! communication stream with no event: the stream orders them after the job's own kernels.
//! Gathers run in place (NCCL's in-place all-gather: my slot of the receive buffer is the send
//! buffer), and all-gathers and all-to-alls move bytes, whatever the dtype. Each collective is
//! counted, held for the emulated link if one is set, and watched by the watchdog like any other.

use std::marker::PhantomData;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use candle_core::cuda_backend::cudarc::driver::sys::CUdeviceptr;
use candle_core::cuda_backend::cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
};
use candle_core::cuda_backend::cudarc::nccl::safe::{group_end, group_start, Comm, ReduceOp};
use candle_core::{DType, Tensor};
use kernels::place::Place;

use super::hold::hold_stream;
use super::{cuda_error, nccl_error, tensor_error, NcclComm};
use crate::gpu::{lock_log, timer, uninit, Fence};
use crate::job::{buffer, Job, Lane};
use crate::op::Op;
use crate::{ByteCounters, CommError, Group, Pending, Result, Topology};

impl NcclComm {
    /// [`crate::Communicator::submit`] (see the module doc).
    pub(super) fn submit_job(&self, job: Job) -> Pending<Vec<Tensor>> {
        match self.run_job(job) {
            Ok((results, fence)) => {
                let shared = self.shared.clone();
                Pending::deferred(move || {
                    shared.check()?;
                    let results = results?;
                    fence.release()?;
                    Ok(results)
                })
            }
            Err(e) => Pending::failed(e),
        }
    }

    /// Queues the job; its results (or its error, still behind the fence: what it queued may
    /// read the held buffers) and the fence.
    fn run_job(&self, job: Job) -> Result<(Result<Vec<Tensor>>, Fence)> {
        let cuda = |e| cuda_error("submitting a job", e);
        self.shared.check()?;
        if !job.device.same_device(&self.home) {
            return Err(CommError::WrongDevice {
                op: "job",
                buffer: job.device.location(),
                comm: self.home.location(),
            });
        }
        let outputs = job
            .outputs
            .iter()
            .map(|&(dtype, n)| buffer(&Place::Own, &self.home, dtype, n))
            .collect::<Result<Vec<_>>>()?;
        let ready = self.compute.record_event(None).map_err(cuda)?;
        self.stream.wait(&ready).map_err(cuda)?;
        let log = self
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let start = match &log {
            Some(_) => Some(timer(&self.stream).map_err(cuda)?),
            None => None,
        };
        let mut held = job.inputs.clone();
        held.extend(outputs.iter().cloned());
        let mut lane = NcclLane {
            nccl: self,
            place: Place::Stream(self.stream.clone()),
        };
        let results = (job.run)(&mut lane, &job.inputs, outputs);
        let done = Arc::new(self.stream.record_event(None).map_err(cuda)?);
        if let (Some(start), Some(log)) = (start, &log) {
            lock_log(log).busy(job.label, start, timer(&self.stream).map_err(cuda)?);
        }
        let fence = Fence {
            label: job.label,
            compute: self.compute.clone(),
            done,
            held,
            log,
            released: false,
        };
        Ok((results, fence))
    }
}

/// A job's view of the communication stream.
struct NcclLane<'a> {
    nccl: &'a NcclComm,
    place: Place,
}

impl NcclLane<'_> {
    /// Runs `call` with `group`'s communicator under the state lock, after the emulated link's
    /// hold for the collective's cross-node bytes; then counts them and watches the collective.
    fn collective(
        &mut self,
        op: Op,
        group: Group,
        sent: ByteCounters,
        call: impl FnOnce(
            &Comm,
        ) -> std::result::Result<
            (),
            candle_core::cuda_backend::cudarc::nccl::result::NcclError,
        >,
    ) -> Result<()> {
        let nccl = self.nccl;
        let hold = match *nccl.link.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(link) => link.hold(sent.inter),
            None => Duration::ZERO,
        };
        let state = nccl.shared.lock();
        let comm = state.comm(group)?;
        nccl.stream
            .context()
            .bind_to_thread()
            .map_err(|e| cuda_error(op.name(), e))?;
        if !hold.is_zero() {
            hold_stream(&nccl.device, &nccl.stream, hold)?;
        }
        let called = call(comm);
        let done = nccl
            .stream
            .record_event(None)
            .map_err(|e| cuda_error(op.name(), e))?;
        nccl.watch.push(op.name(), group, Arc::new(done));
        drop(state);
        called.map_err(|e| nccl_error(op.name(), e))?;
        nccl.counters.add(sent);
        Ok(())
    }

    /// What I send each member of `group` in `op` of `len` elements of `elem` bytes.
    fn sent(&self, op: Op, group: Group, len: usize, elem: usize) -> ByteCounters {
        let t = self.nccl.topology;
        let me = self.nccl.rank;
        let members = t.members(group, me);
        let bytes = op.bytes_per_peer(len, elem, members.len(), t.group_rank(group, me));
        ByteCounters::sent(&t, me, &members, |_| bytes)
    }
}

impl Lane for NcclLane<'_> {
    fn rank(&self) -> usize {
        self.nccl.rank
    }

    fn topology(&self) -> Topology {
        self.nccl.topology
    }

    fn place(&self) -> &Place {
        &self.place
    }

    fn alloc(&mut self, dtype: DType, n: usize) -> Result<Tensor> {
        uninit(&self.place, &self.nccl.device, dtype, n)
    }

    fn all_gather_in_place(&mut self, group: Group, buf: &Tensor) -> Result<Tensor> {
        let op = Op::AllGather;
        let t = self.nccl.topology;
        let (n, me) = (t.group_size(group), t.group_rank(group, self.nccl.rank));
        if n == 1 {
            return Ok(buf.clone());
        }
        let len = buf.elem_count();
        if !len.is_multiple_of(n) {
            return Err(CommError::Indivisible {
                op: op.name(),
                len,
                parts: n,
            });
        }
        let elem = buf.dtype().size_in_bytes();
        let slot = len / n * elem;
        let base = self.address(buf, op)?;
        let stream = self.nccl.stream.clone();
        let sent = self.sent(op, group, len / n, elem);
        self.collective(op, group, sent, |comm| {
            let send = Raw::<u8>::new(base + (me * slot) as u64, slot, &stream);
            let mut recv = Raw::<u8>::new(base, len * elem, &stream);
            comm.all_gather(&send, &mut recv).map(drop)
        })?;
        Ok(buf.clone())
    }

    fn all_to_all(&mut self, group: Group, send: &Tensor) -> Result<Tensor> {
        let op = Op::AllToAll;
        let n = self.nccl.topology.group_size(group);
        let len = send.elem_count();
        if !len.is_multiple_of(n) {
            return Err(CommError::Indivisible {
                op: op.name(),
                len,
                parts: n,
            });
        }
        let out = self.alloc(send.dtype(), len)?;
        let elem = send.dtype().size_in_bytes();
        let chunk = len / n * elem;
        let (src, dst) = (self.address(send, op)?, self.address(&out, op)?);
        let stream = self.nccl.stream.clone();
        let sent = self.sent(op, group, len, elem);
        self.collective(op, group, sent, |comm| {
            group_start()?;
            let mut result = Ok(());
            for j in 0..n {
                let at = (j * chunk) as u64;
                let s = Raw::<u8>::new(src + at, chunk, &stream);
                let mut r = Raw::<u8>::new(dst + at, chunk, &stream);
                result = comm
                    .send(&s, j as i32)
                    .and_then(|()| comm.recv(&mut r, j as i32).map(drop));
                if result.is_err() {
                    break;
                }
            }
            // Closed even after a failed call, or NCCL stays in group mode.
            let ended = group_end();
            result?;
            ended.map(drop)
        })?;
        Ok(out)
    }

    fn reduce_scatter_into(&mut self, group: Group, send: &Tensor, out: &Tensor) -> Result<Tensor> {
        let op = Op::ReduceScatter;
        let dtype = send.dtype();
        for t in [send, out] {
            if !matches!(t.dtype(), DType::F32 | DType::BF16) || t.dtype() != dtype {
                return Err(CommError::UnsupportedDType {
                    op: op.name(),
                    dtype: t.dtype(),
                    takes: "F32 or BF16, send and out alike (a job's reduction)",
                });
            }
        }
        let n = self.nccl.topology.group_size(group);
        let len = send.elem_count();
        if !len.is_multiple_of(n) || out.elem_count() != len / n {
            return Err(CommError::BadLength {
                op: op.name(),
                got: out.elem_count(),
                expected: len / n,
            });
        }
        let (src, dst) = (self.address(send, op)?, self.address(out, op)?);
        let stream = self.nccl.stream.clone();
        let sent = self.sent(op, group, len, dtype.size_in_bytes());
        self.collective(op, group, sent, |comm| match dtype {
            DType::BF16 => {
                let s = Raw::<half::bf16>::new(src, len, &stream);
                let mut r = Raw::<half::bf16>::new(dst, len / n, &stream);
                comm.reduce_scatter(&s, &mut r, &ReduceOp::Sum).map(drop)
            }
            _ => {
                let s = Raw::<f32>::new(src, len, &stream);
                let mut r = Raw::<f32>::new(dst, len / n, &stream);
                comm.reduce_scatter(&s, &mut r, &ReduceOp::Sum).map(drop)
            }
        })?;
        Ok(out.clone())
    }
}

impl NcclLane<'_> {
    fn address(&self, t: &Tensor, op: Op) -> Result<u64> {
        if !t.device().same_device(&self.nccl.home) {
            return Err(CommError::WrongDevice {
                op: op.name(),
                buffer: t.device().location(),
                comm: self.nccl.home.location(),
            });
        }
        kernels::place::address(t).map_err(|e| tensor_error(op.name(), e))
    }
}

/// `len` elements of `T` at a device address, for NCCL's typed calls on memory that candle
/// owns (a slot of a tensor: NCCL's in-place all-gather sends from inside its receive buffer).
/// It records and waits for nothing: the communication stream's order is the job's.
struct Raw<T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<T> Raw<T> {
    fn new(ptr: u64, len: usize, stream: &Arc<CudaStream>) -> Self {
        Raw {
            ptr,
            len,
            stream: stream.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> DeviceSlice<T> for Raw<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for Raw<T> {
    fn device_ptr<'a>(&'a self, _: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for Raw<T> {
    fn device_ptr_mut<'a>(&'a mut self, _: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}
