//! Parameter gathers, each one job on the communication side ([`comm::Job`]): plain (the shard
//! cast into its slot of the gathered buffer, the rest gathered in place), qwZ (the shard
//! quantised into its slot of an INT8 buffer and its scales', both gathered in place, then
//! dequantised into the buffer the layer reads) and hpZ (the secondary partitions, over the ranks
//! of my node only). The compute stream only waits for the finished buffer.
//!
//! hpZ: the first world gather of a unit in a training step leaves each rank holding its
//! node-local slice of the gathered unit (its *secondary partition*: elements
//! `[l x P/D, (l+1) x P/D)` of the padded buffer for local rank l), a buffer of the
//! communication side, stamped with the version of the weights it copies ([`Secondary`]). Every
//! later gather of that unit while those weights hold is an intra-node all-gather of the
//! secondary partitions, which rebuilds exactly the buffer of the world gather (with qwZ, the
//! same INT8 codes and scales), so hpZ changes no number. A secondary partition of other
//! weights (before an optimizer step or a checkpoint load) refuses to serve, so nothing has to
//! invalidate it. A backward gather issued before its unit's forward gather was waited (a
//! prefetch deeper than the distance between them) finds no secondary partition and gathers
//! from the world: the same numbers, more bytes.

use std::collections::VecDeque;

use candle_core::{DType, Device, Tensor};
use comm::{Communicator, Group, Lane};
use kernels::profile::Family;

use crate::typed_job::{self, TypedPending};
use crate::{shard_passes, Partition, Result, WeightGather};

/// What a gather job is reported as ([`comm::JobTime`]).
pub const FORWARD_GATHER: &str = "forward gather";
pub const BACKWARD_GATHER: &str = "backward gather";

/// A rank's slice of a unit's gathered weights, kept between the forward and the backward, in
/// its own buffer of the communication side, with the version of the weights it copies.
#[derive(Clone, Debug)]
pub(crate) struct Secondary {
    /// The engine's weights version when it was gathered (`Engine`'s counter: every optimizer
    /// step and every checkpoint load makes a new one).
    weights: u64,
    data: SecondaryData,
}

impl Secondary {
    /// The slice, if it copies weights of version `weights`; `None` (refused) otherwise.
    pub(crate) fn serve(&self, weights: u64) -> Option<&SecondaryData> {
        (self.weights == weights).then_some(&self.data)
    }
}

/// My shard of a unit's weights in the compute dtype, written by the optimizer beside the
/// master (`AdamW::update_tensors_with_copy`) and stamped with the version of the weights it
/// copies. A world gather of exact weights reads it instead of casting the master again; at
/// W = 1 it is the gathered buffer itself, so the forward's and the backward's gathers move no
/// byte. A copy of other weights (after a skipped step or a checkpoint load) refuses to serve,
/// and the gather casts the master as before.
#[derive(Clone, Debug)]
pub(crate) struct Working {
    weights: u64,
    data: Tensor,
}

impl Working {
    pub(crate) fn new(weights: u64, data: Tensor) -> Working {
        Working { weights, data }
    }

    /// The copy, if it copies weights of version `weights`; `None` (refused) otherwise.
    pub(crate) fn serve(&self, weights: u64) -> Option<&Tensor> {
        (self.weights == weights).then_some(&self.data)
    }
}

/// The values of a secondary partition.
#[derive(Clone, Debug)]
pub(crate) enum SecondaryData {
    /// The gathered values themselves, in the compute dtype (hpZ without qwZ).
    Plain(Tensor),
    /// The INT8 codes (`u8`) and f32 scales of `block` elements as gathered (hpZ with qwZ).
    Int8 {
        codes: Tensor,
        scales: Tensor,
        block: usize,
    },
}

/// Everything a gather of one unit needs to know besides its buffers.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub unit: usize,
    pub partition: Partition,
    pub gather: WeightGather,
    pub dtype: DType,
    pub device: Device,
    /// My world rank and local rank, and the ranks per node.
    pub rank: usize,
    pub local: usize,
    pub ranks_per_node: usize,
    /// hpZ in training: keep my secondary partition of a world gather, stamped `weights`.
    pub keep: Option<u64>,
    pub label: &'static str,
}

/// What a gather job returns: the unit's full padded buffer in the compute dtype and, for a
/// world gather that keeps it, my secondary partition.
pub(crate) struct Gathered {
    pub full: Tensor,
    pub secondary: Option<Secondary>,
}

/// A gather in flight.
pub(crate) struct InFlight {
    pub unit: usize,
    padded: usize,
    pending: TypedPending<Gathered>,
}

/// Submits the gather of `spec.unit`: from my node's secondary partitions if `secondary` is
/// given, else from every rank's primary shard: `working`, my shard already in the compute
/// dtype, where given and the gather is exact, else `master` (f32).
pub(crate) fn submit(
    comm: &dyn Communicator,
    spec: Spec,
    master: &Tensor,
    working: Option<&Tensor>,
    secondary: Option<&SecondaryData>,
) -> InFlight {
    let (unit, padded, label, device) = (
        spec.unit,
        spec.partition.padded,
        spec.label,
        spec.device.clone(),
    );
    let outputs = vec![(spec.dtype, spec.partition.padded)];
    let working = match spec.gather {
        WeightGather::Exact => working.filter(|w| w.dtype() == spec.dtype).cloned(),
        WeightGather::Int8 { .. } => None,
    };
    let (inputs, source) = match secondary {
        None => (
            vec![working.clone().unwrap_or_else(|| master.clone())],
            None,
        ),
        Some(SecondaryData::Plain(v)) => (vec![v.clone()], secondary.cloned()),
        Some(SecondaryData::Int8 { codes, scales, .. }) => {
            (vec![codes.clone(), scales.clone()], secondary.cloned())
        }
    };
    let master = master.clone();
    let pending = typed_job::submit(
        comm,
        label,
        device,
        inputs,
        outputs,
        move |lane, outputs| {
            let out = outputs.into_iter().next().expect("one output");
            match source {
                None => from_world_job(lane, &spec, &master, working.as_ref(), out),
                Some(s) => from_node_job(lane, &spec, s, out),
            }
        },
    );
    InFlight {
        unit,
        padded,
        pending,
    }
}

/// A world gather: my shard into my slot of `out` (with qwZ, of an INT8 buffer; exact, copied
/// from `working` where given, else cast from `master`), the rest gathered in place; with
/// `keep`, my node-local slice as well. At W = 1 an exact gather with `working` returns it.
fn from_world_job(
    lane: &mut dyn Lane,
    spec: &Spec,
    master: &Tensor,
    working: Option<&Tensor>,
    out: Tensor,
) -> Result<Gathered> {
    let place = lane.place().clone();
    let (padded, shard) = (spec.partition.padded, spec.partition.shard_len());
    let at = spec.rank * shard;
    let slice = padded / spec.ranks_per_node;
    let from = spec.local * slice;
    // Profile spans time the compute stream: they record only where the job runs there (one rank).
    let span = |family| place.scope(&spec.device, family);
    let (full, data) = match spec.gather {
        WeightGather::Exact => {
            let full = match working {
                // W = 1: my shard is the whole padded unit.
                Some(w) if shard == padded && w.elem_count() == padded => w.clone(),
                _ => {
                    {
                        let _span = span(Family::ShardPasses);
                        match working {
                            Some(w) => shard_passes::copy_into(&place, w, 0, shard, &out, at)?,
                            None => shard_passes::cast_into(&place, master, &out, at)?,
                        }
                    }
                    lane.all_gather_in_place(Group::World, &out)?
                }
            };
            let data = match spec.keep {
                Some(_) => {
                    let mine = lane.alloc(spec.dtype, slice)?;
                    shard_passes::copy_into(&place, &full, from, slice, &mine, 0)?;
                    Some(SecondaryData::Plain(mine))
                }
                None => None,
            };
            (full, data)
        }
        WeightGather::Int8 { block } => {
            let codes = lane.alloc(DType::U8, padded)?;
            let scales = lane.alloc(DType::F32, padded / block)?;
            {
                let _span = span(Family::Quantisation);
                quant::tensor::quantize_int8_into(master, block, &codes, &scales, at, &place)?;
            }
            let codes = lane.all_gather_in_place(Group::World, &codes)?;
            let scales = lane.all_gather_in_place(Group::World, &scales)?;
            let full = {
                let _span = span(Family::Quantisation);
                quant::tensor::dequantize_int8_into(&codes, &scales, block, &out, &place)?
            };
            let data = match spec.keep {
                Some(_) => {
                    let blocks = slice / block;
                    let my_codes = lane.alloc(DType::U8, slice)?;
                    shard_passes::copy_into(&place, &codes, from, slice, &my_codes, 0)?;
                    let my_scales = lane.alloc(DType::F32, blocks)?;
                    shard_passes::copy_into(&place, &scales, from / block, blocks, &my_scales, 0)?;
                    Some(SecondaryData::Int8 {
                        codes: my_codes,
                        scales: my_scales,
                        block,
                    })
                }
                None => None,
            };
            (full, data)
        }
    };
    let secondary = spec
        .keep
        .zip(data)
        .map(|(weights, data)| Secondary { weights, data });
    Ok(Gathered { full, secondary })
}

/// An hpZ gather: my secondary partition into my node slot of `out` (with qwZ, of the INT8
/// buffers), the rest gathered in place over my node.
fn from_node_job(
    lane: &mut dyn Lane,
    spec: &Spec,
    source: SecondaryData,
    out: Tensor,
) -> Result<Gathered> {
    let place = lane.place().clone();
    let padded = spec.partition.padded;
    let slice = padded / spec.ranks_per_node;
    let at = spec.local * slice;
    let full = match source {
        SecondaryData::Plain(values) => {
            shard_passes::copy_into(&place, &values, 0, slice, &out, at)?;
            lane.all_gather_in_place(Group::IntraNode, &out)?
        }
        SecondaryData::Int8 {
            codes,
            scales,
            block,
        } => {
            let blocks = slice / block;
            let all_codes = lane.alloc(DType::U8, padded)?;
            shard_passes::copy_into(&place, &codes, 0, slice, &all_codes, at)?;
            let all_scales = lane.alloc(DType::F32, padded / block)?;
            shard_passes::copy_into(&place, &scales, 0, blocks, &all_scales, at / block)?;
            let all_codes = lane.all_gather_in_place(Group::IntraNode, &all_codes)?;
            let all_scales = lane.all_gather_in_place(Group::IntraNode, &all_scales)?;
            quant::tensor::dequantize_int8_into(&all_codes, &all_scales, block, &out, &place)?
        }
    };
    Ok(Gathered {
        full,
        secondary: None,
    })
}

/// Waits for a gather: the unit's full padded buffer in the compute dtype and, for a world
/// gather that keeps it (hpZ in training), my secondary partition.
pub(crate) fn finish(flight: InFlight) -> Result<Gathered> {
    let gathered = flight.pending.wait()?;
    debug_assert_eq!(
        gathered.full.elem_count(),
        flight.padded,
        "unit {}",
        flight.unit
    );
    Ok(gathered)
}

/// A gather the queue says to issue next.
pub(crate) struct Issue {
    pub unit: usize,
    pub label: &'static str,
    /// Its position in the order, and that of its unit's forward gather (hpZ's rule reads both:
    /// [`crate::GatherSlot::at`]).
    pub position: usize,
    pub forward_position: usize,
}

/// Gathers units in a fixed order, keeping up to `depth` gathers in flight ahead of the unit
/// being computed, as ZeRO-3's prefetch does (`zero.prefetch_depth`; 0: each gather is issued
/// when its unit is needed). The engine drives it (`Engine::next_gather`).
pub(crate) struct GatherQueue {
    order: Vec<usize>,
    /// The first `forward` gathers of `order` are the forward pass's; the rest the backward's.
    forward: usize,
    issued: usize,
    in_flight: VecDeque<InFlight>,
    depth: usize,
}

impl GatherQueue {
    pub(crate) fn new(order: Vec<usize>, depth: usize, forward: usize) -> Self {
        GatherQueue {
            order,
            forward,
            issued: 0,
            in_flight: VecDeque::new(),
            depth,
        }
    }

    /// The next gather to issue, if any, marking it issued.
    pub(crate) fn next_to_issue(&mut self) -> Option<Issue> {
        let position = self.issued;
        let unit = self.order.get(position).copied()?;
        let label = match position < self.forward {
            true => FORWARD_GATHER,
            false => BACKWARD_GATHER,
        };
        let forward_position = self.order[..self.forward.min(self.order.len())]
            .iter()
            .position(|&v| v == unit)
            .unwrap_or(position);
        self.issued += 1;
        Some(Issue {
            unit,
            label,
            position,
            forward_position,
        })
    }

    pub(crate) fn push(&mut self, flight: InFlight) {
        self.in_flight.push_back(flight);
    }

    pub(crate) fn pop(&mut self) -> Option<InFlight> {
        self.in_flight.pop_front()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub(crate) fn depth(&self) -> usize {
        self.depth
    }
}
