//! Parameter gathers: plain (the shard as is), qwZ (the shard as block-wise INT8 + scales) and
//! hpZ (the secondary partition, over the ranks of my node only).
//!
//! hpZ: the first world gather of a unit in a training step leaves each rank holding its
//! node-local slice of the gathered unit (its *secondary partition*: elements
//! `[l x P/D, (l+1) x P/D)` of the padded buffer for local rank l). Every later gather of that
//! unit in the step is an intra-node all-gather of the secondary partitions, which rebuilds
//! exactly the buffer of the world gather (with qwZ, the same INT8 codes and scales), so hpZ
//! changes no number. The optimizer step and a checkpoint load invalidate every secondary
//! partition: it is a copy of weights that are about to change.

use std::collections::VecDeque;

use candle_core::{DType, Device, Tensor};
use comm::{Communicator, Group, Pending};
use kernels::profile::{scope, Family};

use crate::{Partition, Qwz, Result, ZeroError};

/// A rank's slice of a unit's gathered weights, kept between the forward and the backward, in
/// its own buffer on the compute device.
#[derive(Clone, Debug)]
pub(crate) enum Secondary {
    /// The gathered values themselves, in the compute dtype (hpZ without qwZ).
    Plain(Tensor),
    /// The INT8 codes (`u8`) and f32 scales as gathered (hpZ with qwZ).
    Quantized { codes: Tensor, scales: Tensor },
}

/// Where a gather comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// All-gather of every rank's primary shard over the world.
    World,
    /// All-gather of the secondary partitions over my node (hpZ).
    Secondary,
}

/// The collectives of one gather: the values, or INT8 codes and their scales (two all-gathers
/// on the same group, issued back to back).
enum Gathering {
    Plain(Pending<Tensor>),
    Quantized {
        codes: Pending<Tensor>,
        scales: Pending<Tensor>,
    },
}

/// A gather in flight.
pub(crate) struct InFlight {
    pub unit: usize,
    source: Source,
    gathering: Gathering,
}

/// Starts gathering a unit whose primary shard is `master` (f32); plain gathers move
/// `compute_dtype` values.
pub(crate) fn start(
    comm: &dyn Communicator,
    unit: usize,
    master: &Tensor,
    compute_dtype: DType,
    qwz: Option<Qwz>,
    secondary: Option<&Secondary>,
) -> Result<InFlight> {
    let quantized = |group, codes: Tensor, scales: Tensor| Gathering::Quantized {
        codes: comm.all_gather(group, codes),
        scales: comm.all_gather(group, scales),
    };
    let (source, gathering) = match secondary {
        Some(Secondary::Plain(v)) => (
            Source::Secondary,
            Gathering::Plain(comm.all_gather(Group::IntraNode, v.clone())),
        ),
        Some(Secondary::Quantized { codes, scales }) => (
            Source::Secondary,
            quantized(Group::IntraNode, codes.clone(), scales.clone()),
        ),
        None => {
            let gathering = match qwz {
                Some(q) => {
                    let (codes, scales) = {
                        let _span = scope(master.device(), Family::Quantisation);
                        quant::tensor::quantize_int8(master, q.block)?
                    };
                    quantized(Group::World, codes, scales)
                }
                None => Gathering::Plain(comm.all_gather(
                    Group::World,
                    crate::copies::cast_for_gather(master, compute_dtype)?,
                )),
            };
            (Source::World, gathering)
        }
    };
    Ok(InFlight {
        unit,
        source,
        gathering,
    })
}

/// `x[start..start + len]` in a buffer of its own (a narrow would keep all of `x` alive).
fn own_slice(x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    Ok(x.narrow(0, start, len)?.copy()?)
}

/// Waits for a gather; returns the unit's full padded buffer in `compute_dtype` and, when
/// `keep` (hpZ in training) and the gather came from the world, my secondary partition of it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish(
    flight: InFlight,
    partition: &Partition,
    qwz: Option<Qwz>,
    topology: comm::Topology,
    local_rank: usize,
    keep: bool,
    compute_dtype: DType,
    device: &Device,
) -> Result<(Tensor, Option<Secondary>)> {
    let padded = partition.padded;
    let slice = padded / topology.ranks_per_node;
    let keep = keep && flight.source == Source::World;
    let (full, secondary) = match flight.gathering {
        Gathering::Quantized { codes, scales } => {
            let q = qwz.expect("a quantised gather has a qwZ plan");
            let (codes, scales) = {
                let _span = scope(device, Family::Communication);
                (codes.wait()?, scales.wait()?)
            };
            let full = {
                let _span = scope(codes.device(), Family::Quantisation);
                quant::tensor::dequantize_int8(&codes, &scales, q.block, compute_dtype)?
            };
            let secondary = match keep {
                true => {
                    let blocks = slice / q.block;
                    Some(Secondary::Quantized {
                        codes: own_slice(&codes, local_rank * slice, slice)?,
                        scales: own_slice(&scales, local_rank * blocks, blocks)?,
                    })
                }
                false => None,
            };
            (full, secondary)
        }
        Gathering::Plain(values) => {
            let full = {
                let _span = scope(device, Family::Communication);
                values.wait()?
            };
            let secondary = match keep {
                true => Some(Secondary::Plain(own_slice(
                    &full,
                    local_rank * slice,
                    slice,
                )?)),
                false => None,
            };
            (full, secondary)
        }
    };
    if full.elem_count() != padded {
        return Err(ZeroError::BadState {
            name: format!("gathered unit {}", flight.unit),
            reason: format!("{} elements, expected {padded}", full.elem_count()),
        });
    }
    Ok((full, secondary))
}

/// Gathers units in a fixed order, keeping the next gather in flight while the current unit
/// computes (with `overlap`), as ZeRO-3's prefetch does. The engine drives it through
/// [`crate::Engine`]'s `issue_gather` and `finish_gather`.
pub(crate) struct GatherQueue {
    order: Vec<usize>,
    issued: usize,
    in_flight: VecDeque<InFlight>,
    overlap: bool,
}

impl GatherQueue {
    pub(crate) fn new(order: Vec<usize>, overlap: bool) -> Self {
        GatherQueue {
            order,
            issued: 0,
            in_flight: VecDeque::new(),
            overlap,
        }
    }

    /// The next unit to issue, if any, marking it issued.
    pub(crate) fn next_to_issue(&mut self) -> Option<usize> {
        let u = self.order.get(self.issued).copied();
        self.issued += u.is_some() as usize;
        u
    }

    pub(crate) fn push(&mut self, flight: InFlight) {
        self.in_flight.push_back(flight);
    }

    pub(crate) fn pop(&mut self) -> Option<InFlight> {
        self.in_flight.pop_front()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    pub(crate) fn overlap(&self) -> bool {
        self.overlap
    }
}
