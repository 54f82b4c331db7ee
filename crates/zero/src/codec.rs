//! Codecs: what a collective of a ZeRO++ step puts on the wire and keeps in memory, each
//! technique answering for itself.
//!
//! A [`WeightCodec`] is what a gather sends of a unit's weights and what hpZ keeps of it: the
//! parameters as they are ([`PlainGather`]) or qwZ's INT8 codes and block scales
//! ([`Int8Gather`]); it runs the gather itself inside the job of `gather.rs`. A [`GradCodec`] is
//! what a reduction sends of a unit's gradient, hop by hop, and what it keeps between steps: the
//! plain reduce-scatter in `zero.reduce_dtype` ([`PlainReduceScatter`]) or qgZ's two INT4 hops
//! with their error feedback ([`Int4TwoHop`]). The step's plan says which codec a pass uses
//! ([`WeightGather::codec`], [`GradReduction::codec`]); the logical bytes of
//! [`crate::volume`], the memory of [`crate::memory`], the time model of
//! `trainer plan --throughput` and the names and lengths of the state a checkpoint saves all
//! ask the codec, so that a technique's sizes are written once. docs/design.md section 3 says
//! how to add one.

use candle_core::{DType, Tensor};
use comm::{Group, Lane, Topology};
use model::UnitParams;

use crate::{GradReduction, Result, WeightGather};

mod fp8;
pub(crate) mod grad;
mod state;
mod weight;

pub use fp8::{steps as fp8_steps, Fp8TileGather, LinearLayout, Matrix};
pub use grad::{Int4TwoHop, PlainReduceScatter};
pub use state::{GradState, ReduceInput};
pub use weight::{GatherInput, Int8Gather, NodeSlice, PlainGather};

/// The bytes of a gathered buffer on the wire: its values and, for a quantised codec, their
/// scales (gathered by a second collective).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wire {
    pub data: u64,
    pub scales: u64,
}

impl Wire {
    pub fn total(&self) -> u64 {
        self.data + self.scales
    }
}

/// One gather of one unit as the weight codecs size it: `trainer plan`'s bytes, memory and
/// times ([`crate::volume`], [`crate::memory`]) ask the codec with it.
#[derive(Clone, Copy, Debug)]
pub struct GatherSize<'a> {
    /// The elements a rank puts in: its shard (padded / W) in a world gather, its node slice
    /// (padded / D) in hpZ's; the whole padded unit for [`WeightCodec::decode_traffic`].
    pub n: usize,
    /// The bytes of an element of the plain parameters (the compute dtype's).
    pub param_bytes: usize,
    /// `Some(W)` for a gather from the world's `W` shards, `None` for hpZ's over the node.
    pub world: Option<usize>,
    /// Where the unit's linear weights lie (read by FP8 qwZ alone).
    pub linears: &'a LinearLayout,
}

/// What a gather sends of a unit's weights, and what hpZ keeps of it.
///
/// Implementors give sizes, as functions of an element count, and run the gather itself inside
/// the job of `gather.rs` ([`WeightCodec::gather_from_world`], [`WeightCodec::gather_from_node`]):
/// the sizes must agree with what those send (the byte counters of `comm` are tested equal to
/// [`crate::volume`], which reads these). The job keeps the structure (lanes, prefetch, hpZ's
/// stamp of the weights version); the codec what is encoded, sent, decoded and kept.
pub trait WeightCodec {
    /// What `trainer plan` and the start-up lines call it.
    fn label(&self) -> String;
    /// The bytes a rank's part of one gather puts on the wire ([`GatherSize`]).
    fn wire(&self, size: &GatherSize<'_>) -> Wire;
    /// The bytes the decode after a gather of `size.n` elements (a whole unit) reads and writes
    /// (the codes and scales read, the buffer written at `param_bytes`); 0 where nothing is
    /// decoded.
    fn decode_traffic(&self, size: &GatherSize<'_>) -> u64;
    /// The bytes hpZ keeps of a node slice of `size.n` elements between the gathers of a step:
    /// by default what the slice puts on the wire.
    fn kept_bytes(&self, size: &GatherSize<'_>) -> u64 {
        self.wire(size).total()
    }

    /// Whether a world gather reads my shard in the compute dtype ([`GatherInput::working`],
    /// given where the optimizer wrote one for these weights) in place of casting the master;
    /// the job then passes that copy, not the master, as its input.
    fn reads_working(&self) -> bool {
        false
    }

    /// The buffers a gather of a unit of `padded` elements fills for compute to read, which the
    /// job's backend allocates on the compute device (a buffer the compute stream reads must not
    /// be freed in the communication stream's order): the unit's padded buffer in the compute
    /// dtype first, then whatever else the codec hands the layers (FP8 qwZ's codes and scales).
    fn outputs(&self, padded: usize, dtype: DType, linears: &LinearLayout) -> Vec<(DType, usize)> {
        let _ = linears;
        vec![(dtype, padded)]
    }

    /// One unit's world gather at any W, inside its job on `lane`: my shard encoded into my
    /// slot, gathered over the world and decoded into `outputs` ([`WeightCodec::outputs`]).
    /// Returns the gathered unit (the first output, or a buffer the codec already holds, with
    /// any weights it hands the layers in FP8) and, where [`GatherInput::keep`], my node-local
    /// slice as this codec keeps it for [`WeightCodec::gather_from_node`].
    fn gather_from_world(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        outputs: Vec<Tensor>,
    ) -> Result<(UnitParams, Option<NodeSlice>)>;

    /// hpZ: one unit's gather over my node from the slices this codec kept of a world gather of
    /// the same weights (`kept`, mine), rebuilding into `outputs` exactly the unit of that world
    /// gather, so that hpZ changes no number. Returns the gathered unit.
    fn gather_from_node(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        kept: &NodeSlice,
        outputs: Vec<Tensor>,
    ) -> Result<UnitParams>;
}

/// The flat buffer of a gather's outputs (the first, [`WeightCodec::outputs`]).
fn flat_output(outputs: Vec<Tensor>) -> Tensor {
    outputs
        .into_iter()
        .next()
        .expect("a gather's first output is the unit's buffer")
}

/// One collective of a reduction: its group and the bytes each rank puts in (its whole input;
/// what goes to each peer is that over the group's size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop {
    pub group: Group,
    pub input: u64,
}

/// What a reduction sends of a unit's gradient and what it keeps.
///
/// Implementors give sizes for a unit padded to `padded` elements (a multiple of W x
/// [`crate::ZeroPlan::align`], so that every division here is exact), and run the reduction
/// itself inside the job of `reduce.rs` ([`GradCodec::reduce`]): the sizes must agree with what
/// `reduce` sends. The buffers of [`kept`] are the rank's own f32 state between steps
/// ([`GradState`]): the checkpoint saves and restores them under these names, so renaming one
/// breaks every checkpoint written before.
///
/// [`kept`]: GradCodec::kept
pub trait GradCodec {
    /// What `trainer plan` and the start-up lines call it.
    fn label(&self) -> String;
    /// The collectives of one unit's reduction, in the order the job runs them.
    fn hops(&self, padded: usize, topology: Topology) -> Vec<Hop>;
    /// The bytes an element of the full gradient that the reduction holds until it completes.
    fn input_bytes(&self) -> usize;
    /// The bytes its kernels read and write besides the collectives (quantise, dequantise, sum,
    /// error feedback); 0 for none.
    fn kernel_traffic(&self, padded: usize, topology: Topology) -> u64;
    /// The f32 buffers it keeps for a unit from one step to the next, in checkpoint order: each
    /// its name (the checkpoint's `<unit>.<name>`) and length. Empty for a stateless codec.
    fn kept(&self, padded: usize, topology: Topology) -> Vec<(&'static str, usize)>;

    /// A unit's state for this codec, with nothing kept yet: the buffers of [`GradCodec::kept`].
    fn new_state(&self, padded: usize, topology: Topology) -> GradState {
        GradState::new(self.kept(padded, topology))
    }

    /// One unit's reduction at W > 1, inside its job on `lane`: `input.grad` scaled by
    /// `input.coef` and padded, sent, and my reduced slice returned: in f32 (into
    /// [`ReduceInput::target`]), or where [`ReduceInput::accumulates`] in any dtype the add
    /// into the shard widens. It reads and rewrites its own buffers of `state` only.
    fn reduce(
        &self,
        lane: &mut dyn Lane,
        input: &ReduceInput<'_>,
        state: &mut GradState,
    ) -> Result<Tensor>;
}

impl WeightGather {
    /// The codec of this gather.
    pub fn codec(self) -> Box<dyn WeightCodec> {
        match self {
            WeightGather::Exact => Box::new(PlainGather),
            WeightGather::Int8 { block } => Box::new(Int8Gather { block }),
            WeightGather::Fp8Tiles { block } => Box::new(Fp8TileGather { block }),
        }
    }
}

impl GradReduction {
    /// The codec of this reduction.
    pub fn codec(self) -> Box<dyn GradCodec> {
        match self {
            GradReduction::ReduceScatter { dtype } => Box::new(PlainReduceScatter { dtype }),
            GradReduction::Qgz {
                block,
                error_feedback,
            } => Box::new(Int4TwoHop {
                block,
                error_feedback,
            }),
        }
    }
}

/// The ranks of `group` under `topology`, and how many of my peers in it share my node and how
/// many do not.
pub(crate) fn peers(group: Group, topology: Topology) -> (usize, usize, usize) {
    let (w, d, n) = (topology.world(), topology.ranks_per_node, topology.nodes);
    match group {
        Group::World => (w, d - 1, w - d),
        Group::IntraNode => (d, d - 1, 0),
        Group::InterNode => (n, 0, n - 1),
    }
}
