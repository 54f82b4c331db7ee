//! The weight codecs: the parameters gathered as they are, and qwZ's INT8; and what a gather
//! job hands a codec ([`GatherInput`]) and what hpZ keeps of a codec's gather ([`NodeSlice`]).

use candle_core::{DType, Device, Tensor};
use comm::{Group, Lane};
use kernels::profile::Family;
use model::UnitParams;

use super::{flat_output, GatherSize, LinearLayout, WeightCodec, Wire};
use crate::{shard_passes, Result};

/// One unit's gather as its job (`gather.rs`) hands it to the codec: the unit's layout over the
/// ranks, my primary shard and whether to keep my node-local slice (hpZ in training).
pub struct GatherInput<'a> {
    /// The unit's padded length and my primary shard's length (`padded / W`).
    pub padded: usize,
    pub shard: usize,
    /// My world rank and local rank, and the ranks per node.
    pub rank: usize,
    pub local: usize,
    pub ranks_per_node: usize,
    /// The compute dtype, what the gathered buffer holds.
    pub dtype: DType,
    /// The compute device, which profile spans are recorded for.
    pub device: &'a Device,
    /// My shard in f32, and in the compute dtype where a copy of these weights is given (read
    /// only by a codec whose [`WeightCodec::reads_working`]).
    pub master: &'a Tensor,
    pub working: Option<&'a Tensor>,
    /// hpZ in training: a world gather returns my node-local slice as well.
    pub keep: bool,
    /// Where the unit's linear weights lie (read by FP8 qwZ only).
    pub linears: &'a LinearLayout,
}

impl GatherInput<'_> {
    /// Where my shard starts in the world-gathered buffer.
    pub fn at(&self) -> usize {
        self.rank * self.shard
    }

    /// The length of a node-local slice (hpZ's secondary partition).
    pub fn slice(&self) -> usize {
        self.padded / self.ranks_per_node
    }

    /// Where my node-local slice starts in the gathered buffer.
    pub fn node_at(&self) -> usize {
        self.local * self.slice()
    }
}

/// My node-local slice of a gathered unit (hpZ's secondary partition) as the codec that gathered
/// it keeps it: its named buffers of the communication side, which only that codec reads back
/// ([`WeightCodec::gather_from_node`]). The gather job passes them to the backend as the job's
/// inputs and knows nothing else of them.
#[derive(Clone, Debug)]
pub struct NodeSlice {
    buffers: Vec<(&'static str, Tensor)>,
}

impl NodeSlice {
    pub fn new(buffers: Vec<(&'static str, Tensor)>) -> NodeSlice {
        NodeSlice { buffers }
    }

    /// The buffer `name`. Panics if the codec did not keep one of that name: a codec reads only
    /// the slices it made.
    pub fn buffer(&self, name: &str) -> &Tensor {
        let found = self.buffers.iter().find(|(n, _)| *n == name);
        let (_, buffer) = found.unwrap_or_else(|| panic!("no {name} in the node slice"));
        buffer
    }

    /// Every buffer, in the order the codec kept them.
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.buffers.iter().map(|(_, t)| t)
    }
}

/// The parameters gathered in the compute dtype, as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainGather;

impl WeightCodec for PlainGather {
    fn label(&self) -> String {
        "exact gather".into()
    }

    fn wire(&self, size: &GatherSize<'_>) -> Wire {
        Wire {
            data: (size.n * size.param_bytes) as u64,
            scales: 0,
        }
    }

    fn decode_traffic(&self, _size: &GatherSize<'_>) -> u64 {
        0
    }

    fn reads_working(&self) -> bool {
        true
    }

    /// My shard copied from `working` where given, else cast from `master`, into my slot of
    /// `out`, the rest gathered in place; at W = 1 with `working`, that copy is the buffer. The
    /// slice kept is the gathered values themselves (`values`).
    fn gather_from_world(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        outputs: Vec<Tensor>,
    ) -> Result<(UnitParams, Option<NodeSlice>)> {
        let out = flat_output(outputs);
        let place = lane.place().clone();
        let (padded, shard, at) = (input.padded, input.shard, input.at());
        // Profile spans time the compute stream: they record only where the job runs there (one rank).
        let span = |family| place.scope(input.device, family);
        let full = match input.working {
            // W = 1: my shard is the whole padded unit.
            Some(w) if shard == padded && w.elem_count() == padded => w.clone(),
            _ => {
                {
                    let _span = span(Family::ShardPasses);
                    match input.working {
                        Some(w) => shard_passes::copy_into(&place, w, 0, shard, &out, at)?,
                        None => shard_passes::cast_into(&place, input.master, &out, at)?,
                    }
                }
                lane.all_gather_in_place(Group::World, &out)?
            }
        };
        let kept = match input.keep {
            true => {
                let (slice, from) = (input.slice(), input.node_at());
                let mine = lane.alloc(input.dtype, slice)?;
                shard_passes::copy_into(&place, &full, from, slice, &mine, 0)?;
                Some(NodeSlice::new(vec![("values", mine)]))
            }
            false => None,
        };
        Ok((UnitParams::dense(full), kept))
    }

    fn gather_from_node(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        kept: &NodeSlice,
        outputs: Vec<Tensor>,
    ) -> Result<UnitParams> {
        let out = flat_output(outputs);
        let place = lane.place().clone();
        let (slice, at) = (input.slice(), input.node_at());
        shard_passes::copy_into(&place, kept.buffer("values"), 0, slice, &out, at)?;
        let full = lane.all_gather_in_place(Group::IntraNode, &out)?;
        Ok(UnitParams::dense(full))
    }
}

/// qwZ: symmetric INT8 codes, one byte an element, and one f32 scale per `block` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8Gather {
    pub block: usize,
}

impl WeightCodec for Int8Gather {
    fn label(&self) -> String {
        format!("qwZ int8 gather (block {})", self.block)
    }

    fn wire(&self, size: &GatherSize<'_>) -> Wire {
        Wire {
            data: size.n as u64,
            scales: (size.n / self.block * 4) as u64,
        }
    }

    /// The dequantise: codes and scales read, the buffer written in the compute dtype.
    fn decode_traffic(&self, size: &GatherSize<'_>) -> u64 {
        self.wire(size).total() + (size.n * size.param_bytes) as u64
    }

    /// My shard of `master` quantised into my slot of an INT8 buffer and of its scales', both
    /// gathered in place, dequantised into `out`. The slice kept is my node-local part of the
    /// codes (`codes`, u8) and of the scales (`scales`, f32) as gathered.
    fn gather_from_world(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        outputs: Vec<Tensor>,
    ) -> Result<(UnitParams, Option<NodeSlice>)> {
        let out = flat_output(outputs);
        let place = lane.place().clone();
        let (padded, block, at) = (input.padded, self.block, input.at());
        // Profile spans time the compute stream: they record only where the job runs there (one rank).
        let span = |family| place.scope(input.device, family);
        let codes = lane.alloc(DType::U8, padded)?;
        let scales = lane.alloc(DType::F32, padded / block)?;
        {
            let _span = span(Family::Quantisation);
            quant::tensor::quantize_int8_into(input.master, block, &codes, &scales, at, &place)?;
        }
        let codes = lane.all_gather_in_place(Group::World, &codes)?;
        let scales = lane.all_gather_in_place(Group::World, &scales)?;
        let full = {
            let _span = span(Family::Quantisation);
            quant::tensor::dequantize_int8_into(&codes, &scales, block, &out, &place)?
        };
        let kept = match input.keep {
            true => {
                let (slice, from) = (input.slice(), input.node_at());
                let blocks = slice / block;
                let my_codes = lane.alloc(DType::U8, slice)?;
                shard_passes::copy_into(&place, &codes, from, slice, &my_codes, 0)?;
                let my_scales = lane.alloc(DType::F32, blocks)?;
                shard_passes::copy_into(&place, &scales, from / block, blocks, &my_scales, 0)?;
                Some(NodeSlice::new(vec![
                    ("codes", my_codes),
                    ("scales", my_scales),
                ]))
            }
            false => None,
        };
        Ok((UnitParams::dense(full), kept))
    }

    /// My slice's codes and scales into my node slots of INT8 buffers, gathered over my node,
    /// dequantised into `out`: the same codes and scales as the world gather, so the same values.
    fn gather_from_node(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        kept: &NodeSlice,
        outputs: Vec<Tensor>,
    ) -> Result<UnitParams> {
        let out = flat_output(outputs);
        let place = lane.place().clone();
        let (padded, block) = (input.padded, self.block);
        let (slice, at) = (input.slice(), input.node_at());
        let blocks = slice / block;
        let all_codes = lane.alloc(DType::U8, padded)?;
        shard_passes::copy_into(&place, kept.buffer("codes"), 0, slice, &all_codes, at)?;
        let all_scales = lane.alloc(DType::F32, padded / block)?;
        let scales = kept.buffer("scales");
        shard_passes::copy_into(&place, scales, 0, blocks, &all_scales, at / block)?;
        let all_codes = lane.all_gather_in_place(Group::IntraNode, &all_codes)?;
        let all_scales = lane.all_gather_in_place(Group::IntraNode, &all_scales)?;
        let full =
            quant::tensor::dequantize_int8_into(&all_codes, &all_scales, block, &out, &place)?;
        Ok(UnitParams::dense(full))
    }
}
