//! FP8 qwZ: under FP8 compute (`train.precision = "fp8"`), a block's linear weights gathered
//! as the FP8 E4M3 codes its FP8 layers multiply, with one scale a 128 x 128 tile, so that no
//! layer quantises a weight and none is dequantised after the gather
//! ([`model::Fp8Weight`], docs/zeropp.md "FP8 qwZ").
//!
//! A rank's shard cuts through the rows of the weights, so a tile can straddle shards, and its
//! scale must come from the whole tile. A world gather of a block therefore runs in two
//! collectives:
//! 1. Each rank computes the partial absmax of every tile its shard touches (an inf or NaN
//!    counts as inf, so that the tile's scale comes out NaN, as the one-device rule has it)
//!    and copies its shard's other elements (norms, biases: the unit's *rest*) beside them,
//!    into a slot as long as the most any rank holds ([`LinearLayout::slot`]); one all-gather
//!    of these small slots gives every rank every tile's absmax (the max over the ranks) and
//!    the whole rest (each element from the rank that holds it).
//! 2. Each rank encodes its shard with those scales ([`quant::fp8_e4m3_scale`],
//!    [`quant::e4m3_encode`]): the codes are exactly [`quant::quantize_fp8_e4m3_tiles`] of the
//!    whole weight, wherever the shard boundaries fall. One all-gather of the codes, 1 byte an
//!    element, completes each weight.
//!
//! The values encoded are the ones an exact gather would hand the layer (the compute dtype's
//! working copy, or the master cast to it), so FP8 qwZ changes no number a block multiplies
//! under FP8 compute with exact gathers: the tests hold each block's gathered weights equal to
//! those bit for bit (the embedding's INT8 codes still move a run). hpZ keeps my node's slice of
//! the codes and the resolved absmax and rest, and rebuilds the same gather over the node.
//! A unit with no linear weight (the embedding, the final norm) is gathered as INT8 qwZ.
//!
//! Each step (the partial absmax, the resolution, the encoding, the scales) is a function of
//! `steps.rs` on the device of its tensors: host arithmetic on the CPU, kernels of
//! `crates/kernels/cuda/fp8.cu` on the GPU, queued on the job's communication stream between
//! its collectives (`cuda.rs`), the same bits on both. The gathered codes and the tile scales
//! are the job's outputs, which the compute stream reads after waiting for the job.

use candle_core::{DType, Tensor};
use comm::{Group, Lane};
use kernels::profile::Family;
use model::{Fp8Weight, UnitParams};

use super::{GatherInput, GatherSize, Int8Gather, NodeSlice, WeightCodec, Wire};
use crate::{shard_passes, Result};

#[cfg(feature = "cuda")]
mod cuda;
mod layout;
pub mod steps;

use layout::TILE;
pub use layout::{LinearLayout, Matrix};

/// qwZ under FP8 compute ([`crate::WeightGather::Fp8Tiles`], module doc): a block's linear
/// weights as FP8 E4M3 codes with tile scales made common over the world; anything else as
/// INT8 qwZ of `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8TileGather {
    pub block: usize,
}

impl Fp8TileGather {
    fn int8(&self) -> Int8Gather {
        Int8Gather { block: self.block }
    }
}

impl WeightCodec for Fp8TileGather {
    fn label(&self) -> String {
        format!(
            "qwZ fp8 gather (E4M3, 128 x 128 tiles; int8 block {} for units without linear layers)",
            self.block
        )
    }

    /// A block: its codes, 1 byte an element, and from the world the first all-gather's slot
    /// (4 bytes a tile and a norm or bias element of the most one rank holds); over the node
    /// the codes alone (the absmax and the rest are kept). Anything else as INT8 qwZ.
    fn wire(&self, size: &GatherSize<'_>) -> Wire {
        if size.linears.matrices.is_empty() {
            return self.int8().wire(size);
        }
        let slot = match size.world {
            Some(w) => {
                let (tiles, rest) = size.linears.slot(w, size.n);
                tiles + rest
            }
            None => 0,
        };
        Wire {
            data: size.n as u64,
            scales: 4 * slot as u64,
        }
    }

    /// Nothing is dequantised for a block: its layers read the codes.
    fn decode_traffic(&self, size: &GatherSize<'_>) -> u64 {
        match size.linears.matrices.is_empty() {
            true => self.int8().decode_traffic(size),
            false => 0,
        }
    }

    /// A block's node slice of codes and the resolved absmax and rest.
    fn kept_bytes(&self, size: &GatherSize<'_>) -> u64 {
        match size.linears.matrices.is_empty() {
            true => self.int8().kept_bytes(size),
            false => (size.n + 4 * size.linears.resolved_len()) as u64,
        }
    }

    fn reads_working(&self) -> bool {
        true
    }

    /// A block's flat buffer (its norms and biases), its codes (1 byte an element of the
    /// padded unit) and every tile's scale.
    fn outputs(&self, padded: usize, dtype: DType, linears: &LinearLayout) -> Vec<(DType, usize)> {
        match linears.matrices.is_empty() {
            true => self.int8().outputs(padded, dtype, linears),
            false => vec![
                (dtype, padded),
                (DType::U8, padded),
                (DType::F32, linears.tiles),
            ],
        }
    }

    fn gather_from_world(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        outputs: Vec<Tensor>,
    ) -> Result<(UnitParams, Option<NodeSlice>)> {
        let layout = input.linears;
        if layout.matrices.is_empty() {
            return self.int8().gather_from_world(lane, input, outputs);
        }
        let place = lane.place().clone();
        let span = |family| place.scope(input.device, family);
        let (w, at, shard) = (input.padded / input.shard, input.at(), input.shard);
        let [flat, codes, scales] = three(outputs);
        let mine = my_values(lane, input)?;
        // 1. every tile's absmax and the rest, from every rank's part of them
        let slot = layout.slot(w, shard);
        let headers = lane.alloc(DType::F32, w * (slot.0 + slot.1))?;
        {
            let _span = span(Family::Quantisation);
            steps::partial_header_into(&place, layout, slot, &mine, at, &headers, input.rank)?;
        }
        let headers = lane.all_gather_in_place(Group::World, &headers)?;
        let resolved = lane.alloc(DType::F32, layout.resolved_len())?;
        // 2. my shard's codes with the common scales, gathered
        {
            let _span = span(Family::Quantisation);
            let map = layout.resolve_map(w, shard);
            steps::resolve_into(&place, layout, &map, &headers, &resolved)?;
            steps::encode_into(&place, layout, &resolved, &mine, at, &codes)?;
        }
        let codes = lane.all_gather_in_place(Group::World, &codes)?;
        let params = unit_params(&place, layout, &codes, &resolved, flat, scales)?;
        let kept = match input.keep {
            true => {
                let (slice, from) = (input.slice(), input.node_at());
                let my_codes = lane.alloc(DType::U8, slice)?;
                shard_passes::copy_into(&place, &codes, from, slice, &my_codes, 0)?;
                Some(NodeSlice::new(vec![
                    ("codes", my_codes),
                    ("resolved", resolved),
                ]))
            }
            false => None,
        };
        Ok((params, kept))
    }

    /// My node slice's codes gathered over my node, with the tiles' absmax and the rest as the
    /// world gather resolved them: the same codes and scales, so the same weights.
    fn gather_from_node(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        kept: &NodeSlice,
        outputs: Vec<Tensor>,
    ) -> Result<UnitParams> {
        let layout = input.linears;
        if layout.matrices.is_empty() {
            return self.int8().gather_from_node(lane, input, kept, outputs);
        }
        let place = lane.place().clone();
        let [flat, codes, scales] = three(outputs);
        let (slice, at) = (input.slice(), input.node_at());
        shard_passes::copy_into(&place, kept.buffer("codes"), 0, slice, &codes, at)?;
        let codes = lane.all_gather_in_place(Group::IntraNode, &codes)?;
        unit_params(
            &place,
            layout,
            &codes,
            kept.buffer("resolved"),
            flat,
            scales,
        )
    }
}

/// The three outputs of a block's gather ([`Fp8TileGather`]'s `outputs`).
fn three(outputs: Vec<Tensor>) -> [Tensor; 3] {
    let n = outputs.len();
    outputs
        .try_into()
        .unwrap_or_else(|_| panic!("an FP8 qwZ gather has 3 outputs, not {n}"))
}

/// My shard as the layer would read it after an exact gather, in the compute dtype: the
/// working copy where given, else the master cast to the compute dtype.
fn my_values(lane: &mut dyn Lane, input: &GatherInput<'_>) -> Result<Tensor> {
    match input.working {
        Some(w) if w.dtype() == input.dtype => Ok(w.narrow(0, 0, input.shard)?),
        _ => {
            let mine = lane.alloc(input.dtype, input.shard)?;
            shard_passes::cast_into(lane.place(), input.master, &mine, 0)?;
            Ok(mine)
        }
    }
}

/// The gathered unit as its layers read it: `flat` (the rest at its places, zeros in the
/// weights and the padding) and each weight's codes and tile scales, views of `codes` and of
/// `scales` (written here from the resolved absmax).
fn unit_params(
    place: &kernels::place::Place,
    layout: &LinearLayout,
    codes: &Tensor,
    resolved: &Tensor,
    flat: Tensor,
    scales: Tensor,
) -> Result<UnitParams> {
    steps::finish_into(place, layout, resolved, &scales, &flat)?;
    let weights = layout
        .matrices
        .iter()
        .map(|m| -> Result<(usize, Fp8Weight)> {
            let w_codes = codes
                .narrow(0, m.offset, m.rows * m.cols)?
                .reshape((m.rows, m.cols))?;
            let s = scales
                .narrow(0, m.first_tile, m.tiles())?
                .reshape((m.rows.div_ceil(TILE), m.tile_cols()))?;
            Ok((m.offset, Fp8Weight::new(w_codes, s)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(UnitParams::with_fp8(flat, weights))
}
