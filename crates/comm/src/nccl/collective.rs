//! One collective on the communication stream: the checks, the buffers held until the compute
//! stream waits for it, the NCCL call, and the timed waits (see the module doc of `nccl`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::cuda_backend::cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, CudaView, DeviceRepr, DriverError,
};
use candle_core::cuda_backend::cudarc::nccl::result::NcclError;
use candle_core::cuda_backend::cudarc::nccl::safe::{
    group_end, group_start, Comm, NcclType, ReduceOp,
};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Device, Storage, Tensor};

use super::hold::hold_stream;
use super::{cuda_error, nccl_error, tensor_error, NcclComm};
use crate::op::Op;
use crate::{ByteCounters, CommError, Group, Pending, Result};

/// Timed events on the compute stream around each wait for a collective, and the seconds
/// between them already added up.
#[derive(Default)]
pub(super) struct WaitLog {
    /// (before, after) of each wait not yet added up, in record order.
    pub(super) pending: VecDeque<(CudaEvent, CudaEvent)>,
    pub(super) seconds: f64,
}

impl WaitLog {
    /// Pairs kept before the completed ones are added up (bounds the events held between reads).
    pub(super) const FOLD_AT: usize = 1024;

    /// Adds up the recorded waits: all of them, blocking until they have run (`block`), or only
    /// those that have already run.
    pub(super) fn fold(&mut self, block: bool) -> std::result::Result<(), DriverError> {
        while let Some((before, after)) = self.pending.front() {
            if block {
                after.synchronize()?;
            } else if !after.is_complete() {
                break;
            }
            self.seconds += f64::from(before.elapsed_ms(after)?) * 1e-3;
            self.pending.pop_front();
        }
        Ok(())
    }
}

pub(super) fn lock_waits(waits: &Mutex<Option<WaitLog>>) -> MutexGuard<'_, Option<WaitLog>> {
    waits.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The NCCL calls behind the tensor collectives.
#[derive(Clone, Copy, Debug)]
pub(super) enum Call {
    AllGather,
    AllToAll,
    ReduceScatter,
    AllReduce,
    Broadcast { root: usize },
}

impl Call {
    /// The collective this call carries out.
    fn op(self) -> Op {
        match self {
            Call::AllGather => Op::AllGather,
            Call::AllToAll => Op::AllToAll,
            Call::ReduceScatter => Op::ReduceScatter,
            Call::AllReduce => Op::AllReduce,
            Call::Broadcast { root } => Op::Broadcast { root },
        }
    }

    pub(super) fn name(self) -> &'static str {
        self.op().name()
    }

    fn reduces(self) -> bool {
        matches!(self, Call::ReduceScatter | Call::AllReduce)
    }

    /// The same length checks as the local backend, made before anything reaches NCCL.
    fn check(self, len: usize, n: usize) -> Result<()> {
        match self {
            Call::AllToAll | Call::ReduceScatter if !len.is_multiple_of(n) => {
                Err(CommError::Indivisible {
                    op: self.name(),
                    len,
                    parts: n,
                })
            }
            Call::Broadcast { root } if root >= n => Err(CommError::BadRoot { root, size: n }),
            _ => Ok(()),
        }
    }

    /// Elements of my result for `len` input elements and a group of `n`.
    fn out_len(self, len: usize, n: usize) -> usize {
        match self {
            Call::AllGather => len * n,
            Call::ReduceScatter => len / n,
            Call::AllToAll | Call::AllReduce | Call::Broadcast { .. } => len,
        }
    }

    /// Logical bytes to each other member, as [`ByteCounters`] documents.
    fn bytes_per_peer(self, len: usize, n: usize, elem: usize, me: usize) -> u64 {
        self.op().bytes_per_peer(len, elem, n, me)
    }
}

/// A collective enqueued on the communication stream: its buffers, held until the compute
/// stream has been made to wait for `done`.
pub(super) struct InFlight {
    /// Shared with the watchdog.
    pub(super) done: Arc<CudaEvent>,
    compute: Arc<CudaStream>,
    /// The input, kept alive while NCCL may read it.
    _input: Tensor,
    output: Option<Tensor>,
    waited: bool,
    /// The communicator's log of the compute stream's waits (timed where it holds one).
    waits: Arc<Mutex<Option<WaitLog>>>,
}

impl InFlight {
    /// Makes the compute stream wait for the collective and hands out its output; where the
    /// waits are timed, between two timed events on the compute stream.
    pub(super) fn finish(mut self, op: &'static str) -> Result<Tensor> {
        let cuda = |e| cuda_error(op, e);
        let timed = lock_waits(&self.waits).is_some();
        let timer = || {
            self.compute
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        };
        let before = if timed {
            Some(timer().map_err(cuda)?)
        } else {
            None
        };
        self.compute.wait(&self.done).map_err(cuda)?;
        self.waited = true;
        if let Some(before) = before {
            let after = timer().map_err(cuda)?;
            if let Some(log) = lock_waits(&self.waits).as_mut() {
                log.pending.push_back((before, after));
                if log.pending.len() >= WaitLog::FOLD_AT {
                    log.fold(false).map_err(cuda)?;
                }
            }
        }
        Ok(self.output.take().expect("the output is taken once"))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.waited {
            // Unwaited (or failed): the buffers must not be freed before NCCL is done with them.
            // A drop cannot report a driver error, and there is nothing better to do on one.
            let _ = self.compute.wait(&self.done);
        }
    }
}

impl NcclComm {
    /// Issues a tensor collective; failures before NCCL become a failed [`Pending`].
    pub(super) fn collective(&self, group: Group, call: Call, send: Tensor) -> Pending<Tensor> {
        let op = call.name();
        let caller = send.device().clone();
        match self.issue(group, call, send, true) {
            Ok(in_flight) => {
                let (shared, home) = (self.shared.clone(), self.home.clone());
                Pending::deferred(move || {
                    shared.check()?;
                    let out = in_flight.finish(op)?;
                    if caller.same_device(&home) {
                        Ok(out)
                    } else {
                        out.to_device(&caller).map_err(|e| tensor_error(op, e))
                    }
                })
            }
            Err(e) => Pending::failed(e),
        }
    }

    /// Checks, moves `send` onto the device, and enqueues `call` on the communication stream
    /// (see the module doc); counts its bytes if `count`.
    pub(super) fn issue(
        &self,
        group: Group,
        call: Call,
        send: Tensor,
        count: bool,
    ) -> Result<InFlight> {
        let op = call.name();
        let n = self.topology.group_size(group);
        let me = self.topology.group_rank(group, self.rank);
        let len = send.elem_count();
        let dtype = send.dtype();
        self.shared.check()?;
        call.check(len, n)?;
        let elem = match dtype {
            DType::U8 if call.reduces() => {
                return Err(CommError::UnsupportedDType {
                    op,
                    dtype,
                    takes: "float (a reduction)",
                })
            }
            DType::U8 | DType::BF16 | DType::F16 | DType::F32 | DType::F64 => dtype.size_in_bytes(),
            _ => {
                return Err(CommError::UnsupportedDType {
                    op,
                    dtype,
                    takes: "U8, BF16, F16, F32 or F64",
                })
            }
        };
        let send = self.on_device(send, op)?;

        let state = self.shared.lock();
        let comm = state.comm(group)?;
        let members = self.topology.members(group, self.rank);
        let bytes = call.bytes_per_peer(len, n, elem, me);
        let sent = ByteCounters::sent(&self.topology, self.rank, &members, |_| bytes);
        let hold = match *self.link.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(link) if count => link.hold(sent.inter),
            _ => Duration::ZERO,
        };
        let (storage, layout) = send.storage_and_layout();
        let (Storage::Cuda(cuda), Some((start, end))) = (&*storage, layout.contiguous_offsets())
        else {
            unreachable!("`on_device` gives a contiguous tensor on the device");
        };
        let launched = match &cuda.slice {
            CudaStorageSlice::U8(s) => self.launch(comm, call, n, s.slice(start..end), hold),
            CudaStorageSlice::BF16(s) => self.launch(comm, call, n, s.slice(start..end), hold),
            CudaStorageSlice::F16(s) => self.launch(comm, call, n, s.slice(start..end), hold),
            CudaStorageSlice::F32(s) => self.launch(comm, call, n, s.slice(start..end), hold),
            CudaStorageSlice::F64(s) => self.launch(comm, call, n, s.slice(start..end), hold),
            _ => unreachable!("the dtype was checked"),
        };
        drop(storage);
        // Watched in issue order: the order they run on the communication stream, which only
        // collectives issued under the state lock are enqueued on.
        let launched = launched.map(|(done, output, nccl)| {
            let done = Arc::new(done);
            // The one uncounted collective is the barrier's all-reduce.
            let watched = if count { op } else { "barrier" };
            self.watch.push(watched, group, done.clone());
            (done, output, nccl)
        });
        drop(state);
        let (done, output, nccl) = launched?;
        let in_flight = InFlight {
            done,
            compute: self.compute.clone(),
            _input: send,
            output: Some(output),
            waited: false,
            waits: self.waits.clone(),
        };
        // On an NCCL error `in_flight` is dropped here, which still orders the buffers' release
        // after whatever was enqueued.
        nccl.map_err(|e| nccl_error(op, e))?;
        if count {
            self.counters.add(sent);
        }
        Ok(in_flight)
    }

    /// `send` as a contiguous tensor on this communicator's device: a CPU tensor is copied
    /// there; a tensor on another GPU is an error.
    fn on_device(&self, send: Tensor, op: &'static str) -> Result<Tensor> {
        let send = match send.device() {
            d if d.same_device(&self.home) => send,
            Device::Cpu => send
                .to_device(&self.home)
                .map_err(|e| tensor_error(op, e))?,
            other => {
                return Err(CommError::WrongDevice {
                    op,
                    buffer: other.location(),
                    comm: self.home.location(),
                })
            }
        };
        send.flatten_all()
            .and_then(|t| t.contiguous())
            .map_err(|e| tensor_error(op, e))
    }

    /// Allocates the output, orders the communication stream after the compute stream, holds it
    /// for `hold` (an emulated link's transfer time; before the call, so that a failure leaves
    /// nothing enqueued on the buffers), enqueues `call` and records `done`. The NCCL result
    /// comes separately so that the caller still holds the buffers until `done` when NCCL
    /// failed.
    #[allow(clippy::type_complexity)]
    fn launch<T>(
        &self,
        comm: &Comm,
        call: Call,
        n: usize,
        input: CudaView<'_, T>,
        hold: Duration,
    ) -> Result<(CudaEvent, Tensor, std::result::Result<(), NcclError>)>
    where
        T: NcclType + CudaDType + DeviceRepr,
    {
        let op = call.name();
        let cuda = |e: DriverError| cuda_error(op, e);
        let out_len = call.out_len(input.len(), n);
        // SAFETY: NCCL writes every element of the output before anyone reads it (the compute
        // stream waits for `done` before the output is handed out).
        let mut out: CudaSlice<T> =
            unsafe { self.device.alloc::<T>(out_len) }.map_err(|e| tensor_error(op, e))?;
        let ready = self.compute.record_event(None).map_err(cuda)?;
        self.stream.wait(&ready).map_err(cuda)?;
        self.stream.context().bind_to_thread().map_err(cuda)?;
        if !hold.is_zero() {
            hold_stream(&self.device, &self.stream, hold)?;
        }
        let nccl = match call {
            Call::AllGather => comm.all_gather(&input, &mut out).map(drop),
            Call::ReduceScatter => comm
                .reduce_scatter(&input, &mut out, &ReduceOp::Sum)
                .map(drop),
            Call::AllReduce => comm.all_reduce(&input, &mut out, &ReduceOp::Sum).map(drop),
            Call::Broadcast { root } => comm
                .broadcast(Some(&input), &mut out, root as i32)
                .map(drop),
            Call::AllToAll => all_to_all(comm, &input, &mut out, n),
        };
        let done = self.stream.record_event(None).map_err(cuda)?;
        let storage = CudaStorage::wrap_cuda_slice(out, self.device.clone());
        let output =
            Tensor::from_storage(Storage::Cuda(storage), out_len, BackpropOp::none(), false);
        Ok((done, output, nccl))
    }
}

/// One grouped set of sends and receives: chunk j of `input` to member j, chunk j of `out` from
/// member j (myself included).
fn all_to_all<T: NcclType>(
    comm: &Comm,
    input: &CudaView<'_, T>,
    out: &mut CudaSlice<T>,
    n: usize,
) -> std::result::Result<(), NcclError> {
    let chunk = input.len() / n;
    group_start()?;
    let mut sent = Ok(());
    for j in 0..n {
        let range = j * chunk..(j + 1) * chunk;
        let peer = j as i32;
        sent = comm
            .send(&input.slice(range.clone()), peer)
            .and_then(|()| comm.recv(&mut out.slice_mut(range), peer).map(drop));
        if sent.is_err() {
            break;
        }
    }
    // The group is closed even after a failed call, or NCCL stays in group mode.
    let ended = group_end();
    sent?;
    ended.map(drop)
}
