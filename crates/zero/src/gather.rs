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

use candle_core::{Device, Tensor};
use comm::{bytes_to_f32, f32_to_bytes, Communicator, Group, Pending};

use crate::{wire, Partition, Qwz, Result, ZeroError};

/// A rank's slice of a unit's gathered weights, kept between the forward and the backward.
#[derive(Clone, Debug)]
pub(crate) enum Secondary {
    /// The gathered values themselves (hpZ without qwZ).
    Plain(Vec<f32>),
    /// The INT8 codes and scales as gathered (hpZ with qwZ).
    Quantized { codes: Vec<i8>, scales: Vec<f32> },
}

/// Where a gather comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// All-gather of every rank's primary shard over the world.
    World,
    /// All-gather of the secondary partitions over my node (hpZ).
    Secondary,
}

/// One INT8 message: the codes, then the scales.
fn int8_message(codes: &[i8], scales: &[f32]) -> Vec<u8> {
    let mut m = Vec::with_capacity(codes.len() + 4 * scales.len());
    wire::push(&mut m, codes.iter().map(|&c| c as u8), scales);
    m
}

/// The codes and scales of `parts` INT8 messages of `elems` codes each, concatenated.
fn split_int8_messages(
    bytes: &[u8],
    parts: usize,
    elems: usize,
    block: usize,
) -> (Vec<i8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(parts * elems);
    let mut scales = Vec::with_capacity(parts * elems / block);
    for (c, s) in wire::split(bytes, elems, elems / block) {
        codes.extend(c.iter().map(|&c| c as i8));
        scales.extend(s);
    }
    (codes, scales)
}

/// A gather in flight.
pub(crate) struct InFlight {
    pub unit: usize,
    source: Source,
    pending: Pending<Vec<u8>>,
}

/// Starts gathering a unit whose primary shard is `master`.
pub(crate) fn start(
    comm: &dyn Communicator,
    unit: usize,
    master: &[f32],
    qwz: Option<Qwz>,
    secondary: Option<&Secondary>,
) -> Result<InFlight> {
    let (source, pending) = match secondary {
        Some(Secondary::Plain(v)) => (
            Source::Secondary,
            comm.all_gather(Group::IntraNode, f32_to_bytes(v)),
        ),
        Some(Secondary::Quantized { codes, scales }) => (
            Source::Secondary,
            comm.all_gather(Group::IntraNode, int8_message(codes, scales)),
        ),
        None => {
            let message = match qwz {
                Some(q) => {
                    let (codes, scales) = quant::quantize_int8(master, q.block)?;
                    int8_message(&codes, &scales)
                }
                None => f32_to_bytes(master),
            };
            (Source::World, comm.all_gather(Group::World, message))
        }
    };
    Ok(InFlight {
        unit,
        source,
        pending,
    })
}

/// Waits for a gather; returns the unit's full padded buffer as a tensor and, when `keep`
/// (hpZ in training) and the gather came from the world, my secondary partition of it.
pub(crate) fn finish(
    flight: InFlight,
    partition: &Partition,
    qwz: Option<Qwz>,
    topology: comm::Topology,
    local_rank: usize,
    keep: bool,
    device: &Device,
) -> Result<(Tensor, Option<Secondary>)> {
    let bytes = flight.pending.wait()?;
    let padded = partition.padded;
    let d = topology.ranks_per_node;
    let parts = match flight.source {
        Source::World => topology.world(),
        Source::Secondary => d,
    };
    let slice = padded / d;
    let keep = keep && flight.source == Source::World;
    let (full, secondary) = match qwz {
        Some(q) => {
            let (codes, scales) = split_int8_messages(&bytes, parts, padded / parts, q.block);
            let full = quant::dequantize_int8(&codes, &scales, q.block);
            let secondary = keep.then(|| {
                let blocks = slice / q.block;
                Secondary::Quantized {
                    codes: codes[local_rank * slice..(local_rank + 1) * slice].to_vec(),
                    scales: scales[local_rank * blocks..(local_rank + 1) * blocks].to_vec(),
                }
            });
            (full, secondary)
        }
        None => {
            let full = bytes_to_f32(&bytes);
            let secondary = keep.then(|| {
                Secondary::Plain(full[local_rank * slice..(local_rank + 1) * slice].to_vec())
            });
            (full, secondary)
        }
    };
    if full.len() != padded {
        return Err(ZeroError::BadState {
            name: format!("gathered unit {}", flight.unit),
            reason: format!("{} elements, expected {padded}", full.len()),
        });
    }
    Ok((Tensor::from_vec(full, padded, device)?, secondary))
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
