//! The table where the ranks of one local world meet: one slot per (group instance, sequence
//! number), holding each member's contribution until every member has taken all of them.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};

use crate::op::Op;
use crate::{CommError, Group, Result, Topology};

/// One member's contribution to a collective.
#[derive(Debug)]
pub(super) enum Payload {
    Tensor(Tensor),
    Empty,
}

impl Payload {
    /// Length in elements.
    pub(super) fn len(&self) -> usize {
        match self {
            Payload::Tensor(t) => t.elem_count(),
            Payload::Empty => 0,
        }
    }

    /// Bytes per element.
    pub(super) fn elem_size(&self) -> usize {
        match self {
            Payload::Tensor(t) => t.dtype().size_in_bytes(),
            Payload::Empty => 1,
        }
    }

    fn dtype(&self) -> Option<DType> {
        match self {
            Payload::Tensor(t) => Some(t.dtype()),
            Payload::Empty => None,
        }
    }

    pub(super) fn tensor(&self) -> &Tensor {
        match self {
            Payload::Tensor(t) => t,
            Payload::Empty => {
                unreachable!("members agreed on the op, so every payload is a tensor")
            }
        }
    }
}

/// One collective of one group instance: (group, instance, sequence number on that instance).
pub(super) type SlotKey = (Group, usize, u64);

struct Slot {
    /// Each member's call, by group rank; `None` until it arrives.
    calls: Vec<Option<(Op, Arc<Payload>)>>,
    arrived: usize,
    departed: usize,
}

#[derive(Default)]
struct Table {
    slots: HashMap<SlotKey, Slot>,
    /// Set once, by the first abort; fails every waiting and future collective.
    aborted: Option<CommError>,
    /// World ranks whose communication thread has exited: they will never contribute again.
    gone: Vec<bool>,
}

/// State shared by all ranks of one local world.
pub(super) struct Shared {
    pub(super) topology: Topology,
    table: Mutex<Table>,
    changed: Condvar,
    timeout: Duration,
    /// The communication stream of the world's GPU jobs (`job.rs`), made by the first one.
    #[cfg(feature = "cuda")]
    comm_stream:
        std::sync::OnceLock<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>>,
}

/// A member's own view of a collective: who it is and who its peers are.
pub(super) struct Seat<'a> {
    pub(super) key: SlotKey,
    /// World ranks of the group, in group-rank order.
    pub(super) members: &'a [usize],
    /// My group rank.
    pub(super) me: usize,
}

impl Shared {
    pub(super) fn new(topology: Topology, timeout: Duration) -> Self {
        Shared {
            topology,
            table: Mutex::new(Table {
                gone: vec![false; topology.world()],
                ..Table::default()
            }),
            changed: Condvar::new(),
            timeout,
            #[cfg(feature = "cuda")]
            comm_stream: std::sync::OnceLock::new(),
        }
    }

    /// The world's communication stream on `dev`'s GPU (made at the first call); an error for a
    /// job on another GPU: a local world shares one.
    #[cfg(feature = "cuda")]
    pub(super) fn comm_stream(
        &self,
        dev: &candle_core::cuda_backend::CudaDevice,
    ) -> Result<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>> {
        let compute = dev.cuda_stream();
        let stream = match self.comm_stream.get() {
            Some(s) => s.clone(),
            None => {
                let made = compute
                    .context()
                    .new_stream()
                    .map_err(|e| crate::gpu::cuda_error("creating the communication stream", e))?;
                self.comm_stream.get_or_init(|| made).clone()
            }
        };
        if stream.context().ordinal() != compute.context().ordinal() {
            return Err(CommError::WrongDevice {
                op: "job",
                buffer: candle_core::DeviceLocation::Cuda {
                    gpu_id: compute.context().ordinal(),
                },
                comm: candle_core::DeviceLocation::Cuda {
                    gpu_id: stream.context().ordinal(),
                },
            });
        }
        Ok(stream)
    }

    // The table is consistent between statements (no code that can panic holds the lock
    // half-way through an update), so a poisoned lock is still safe to use.
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails every pending and future collective of the world with `Aborted { rank, reason }`;
    /// only the first abort is kept.
    pub(super) fn abort(&self, rank: usize, reason: String) {
        let mut table = self.lock();
        if table.aborted.is_none() {
            table.aborted = Some(CommError::Aborted { rank, reason });
        }
        self.changed.notify_all();
    }

    /// Marks `rank` as never contributing again (its communication thread has exited).
    pub(super) fn mark_gone(&self, rank: usize) {
        let mut table = self.lock();
        table.gone[rank] = true;
        self.changed.notify_all();
    }

    /// Deposits my call, waits for every member's, and returns all calls in group-rank order.
    ///
    /// Checks that the members agree on the op and the length, so that a bad call fails on
    /// every member alike. The last member to leave removes the slot.
    pub(super) fn meet(
        &self,
        seat: &Seat<'_>,
        op: Op,
        payload: Payload,
    ) -> Result<Vec<Arc<Payload>>> {
        let n = seat.members.len();
        let my_rank = seat.members[seat.me];
        let mut table = self.lock();
        if let Some(error) = &table.aborted {
            return Err(error.clone());
        }
        let slot = table.slots.entry(seat.key).or_insert_with(|| Slot {
            calls: vec![None; n],
            arrived: 0,
            departed: 0,
        });
        slot.calls[seat.me] = Some((op, Arc::new(payload)));
        slot.arrived += 1;
        if slot.arrived == n {
            self.changed.notify_all();
        }
        let start = Instant::now();
        loop {
            let Table {
                slots,
                aborted,
                gone,
            } = &mut *table;
            if let Some(error) = aborted {
                return Err(error.clone());
            }
            let slot = slots
                .get_mut(&seat.key)
                .expect("a slot stays until all its members have left");
            if slot.arrived == n {
                let calls: Vec<(Op, Arc<Payload>)> = slot
                    .calls
                    .iter()
                    .map(|c| c.clone().expect("every member has arrived"))
                    .collect();
                slot.departed += 1;
                if slot.departed == n {
                    slots.remove(&seat.key);
                }
                drop(table);
                return agree(seat, &calls).map(|()| calls.into_iter().map(|(_, p)| p).collect());
            }
            if let Some(j) = (0..n).find(|&j| slot.calls[j].is_none() && gone[seat.members[j]]) {
                return Err(CommError::Aborted {
                    rank: seat.members[j],
                    reason: format!(
                        "its communicator was dropped while rank {my_rank} waited for it in {} #{} on {:?}",
                        op.name(),
                        seat.key.2,
                        seat.key.0
                    ),
                });
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                return Err(CommError::Timeout {
                    op: op.name(),
                    group: seat.key.0,
                    seq: seat.key.2,
                    rank: my_rank,
                    waited_s: waited.as_secs(),
                });
            }
            // Every change of the table notifies; the cap only bounds a missed wake-up.
            let wait = (self.timeout - waited).min(Duration::from_secs(1));
            table = self
                .changed
                .wait_timeout(table, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Checks that every member issued the same op with the same length as I did, and that the
/// length and root fit the group; every member reaches the same verdict.
fn agree(seat: &Seat<'_>, calls: &[(Op, Arc<Payload>)]) -> Result<()> {
    let n = calls.len();
    let (op, payload) = &calls[seat.me];
    let len = payload.len();
    let dtype = payload.dtype();
    if let Some(j) = calls
        .iter()
        .position(|(o, p)| o != op || p.len() != len || p.dtype() != dtype)
    {
        let (theirs, their_payload) = &calls[j];
        return Err(CommError::Mismatch {
            group: seat.key.0,
            seq: seat.key.2,
            rank: seat.members[seat.me],
            ours: op.describe(len, dtype),
            peer: seat.members[j],
            theirs: theirs.describe(their_payload.len(), their_payload.dtype()),
        });
    }
    match *op {
        Op::AllToAll | Op::ReduceScatter if len % n != 0 => Err(CommError::Indivisible {
            op: op.name(),
            len,
            parts: n,
        }),
        Op::Broadcast { root } if root >= n => Err(CommError::BadRoot { root, size: n }),
        _ => Ok(()),
    }
}
