//! Parameter gathers, each one job on the communication side ([`comm::Job`]): from the world
//! (every rank's primary shard) or, with hpZ, from the secondary partitions over the ranks of my
//! node only. What is encoded, sent, decoded and kept is the plan's weight codec's
//! ([`crate::codec::WeightCodec`]: plain, or qwZ's INT8); this module keeps the job's structure:
//! its inputs, its lane, the prefetch queue and hpZ's stamp of the weights version. The compute
//! stream only waits for the finished buffer.
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

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use comm::{Communicator, Lane};
use model::UnitParams;

use crate::codec::{GatherInput, LinearLayout, NodeSlice};
use crate::typed_job::{self, TypedPending};
use crate::{Partition, Result, WeightGather};

/// What a gather job is reported as ([`comm::JobTime`]).
pub const FORWARD_GATHER: &str = "forward gather";
pub const BACKWARD_GATHER: &str = "backward gather";

/// A rank's slice of a unit's gathered weights, kept between the forward and the backward, in
/// buffers of the communication side that the codec which gathered it made, with the version
/// of the weights it copies.
#[derive(Clone, Debug)]
pub(crate) struct Secondary {
    /// The engine's weights version when it was gathered (`Engine`'s counter: every optimizer
    /// step and every checkpoint load makes a new one).
    weights: u64,
    /// The gather that made it, whose codec reads it back.
    gather: WeightGather,
    data: NodeSlice,
}

impl Secondary {
    /// The slice and the gather that made it, if it copies weights of version `weights`; `None`
    /// (refused) otherwise.
    pub(crate) fn serve(&self, weights: u64) -> Option<(WeightGather, &NodeSlice)> {
        (self.weights == weights).then_some((self.gather, &self.data))
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
    /// Where the unit's linear weights lie (FP8 qwZ encodes them).
    pub linears: Arc<LinearLayout>,
}

impl Spec {
    /// What the codec is handed of this gather.
    fn input<'a>(&'a self, master: &'a Tensor, working: Option<&'a Tensor>) -> GatherInput<'a> {
        GatherInput {
            padded: self.partition.padded,
            shard: self.partition.shard_len(),
            rank: self.rank,
            local: self.local,
            ranks_per_node: self.ranks_per_node,
            dtype: self.dtype,
            device: &self.device,
            master,
            working,
            keep: self.keep.is_some(),
            linears: &self.linears,
        }
    }
}

/// What a gather job returns: the unit's parameters (its full padded buffer in the compute
/// dtype, and any weights in FP8) and, for a world gather that keeps it, my secondary
/// partition.
pub(crate) struct Gathered {
    pub full: UnitParams,
    pub secondary: Option<Secondary>,
}

/// A gather in flight.
pub(crate) struct InFlight {
    pub unit: usize,
    padded: usize,
    pending: TypedPending<Gathered>,
}

/// Submits the gather of `spec.unit`: from my node's secondary partitions if `secondary` is
/// given (with the gather that kept them), else from every rank's primary shard: `working`, my
/// shard already in the compute dtype, where given and the codec reads it, else `master` (f32).
pub(crate) fn submit(
    comm: &dyn Communicator,
    spec: Spec,
    master: &Tensor,
    working: Option<&Tensor>,
    secondary: Option<(WeightGather, &NodeSlice)>,
) -> InFlight {
    let (unit, padded, label, device) = (
        spec.unit,
        spec.partition.padded,
        spec.label,
        spec.device.clone(),
    );
    // The codec that runs: the plan's, or for hpZ the one that kept the node slices.
    let codec = secondary.map_or(spec.gather, |(gather, _)| gather).codec();
    let outputs = codec.outputs(spec.partition.padded, spec.dtype, &spec.linears);
    let reads = spec.gather.codec().reads_working();
    let working = working
        .filter(|w| reads && w.dtype() == spec.dtype)
        .cloned();
    let (inputs, source) = match secondary {
        None => (
            vec![working.clone().unwrap_or_else(|| master.clone())],
            None,
        ),
        Some((gather, kept)) => (
            kept.tensors().cloned().collect(),
            Some((gather, kept.clone())),
        ),
    };
    let master = master.clone();
    let pending = typed_job::submit(
        comm,
        label,
        device,
        inputs,
        outputs,
        move |lane, outputs| match source {
            None => from_world_job(lane, &spec, &master, working.as_ref(), outputs),
            Some((gather, kept)) => from_node_job(lane, &spec, &master, gather, &kept, outputs),
        },
    );
    InFlight {
        unit,
        padded,
        pending,
    }
}

/// A world gather, run by the plan's codec; with `keep`, my node-local slice stamped with the
/// weights version and the gather that made it.
fn from_world_job(
    lane: &mut dyn Lane,
    spec: &Spec,
    master: &Tensor,
    working: Option<&Tensor>,
    outputs: Vec<Tensor>,
) -> Result<Gathered> {
    let input = spec.input(master, working);
    let (full, data) = spec
        .gather
        .codec()
        .gather_from_world(lane, &input, outputs)?;
    let secondary = spec.keep.zip(data).map(|(weights, data)| Secondary {
        weights,
        gather: spec.gather,
        data,
    });
    Ok(Gathered { full, secondary })
}

/// An hpZ gather over my node, run by the codec of `gather`, which kept `kept`.
fn from_node_job(
    lane: &mut dyn Lane,
    spec: &Spec,
    master: &Tensor,
    gather: WeightGather,
    kept: &NodeSlice,
    outputs: Vec<Tensor>,
) -> Result<Gathered> {
    let input = spec.input(master, None);
    let full = gather
        .codec()
        .gather_from_node(lane, &input, kept, outputs)?;
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
        gathered.full.flat().elem_count(),
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
