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
//! The encoding and the resolution run on the host: the CPU's emulation of FP8 compute is what
//! trains with them today. On the GPU they would race the communication stream's collectives,
//! so a GPU gather is refused in one line; its version is a kernel on that stream for each
//! step of the same arithmetic (the partial absmax, the encoding), not written yet.

use std::ops::Range;

use candle_core::{DType, Tensor};
use comm::{Group, Lane};
use kernels::profile::Family;
use model::{Fp8Weight, UnitLayout, UnitParams};

use super::{GatherInput, GatherSize, Int8Gather, NodeSlice, WeightCodec, Wire};
use crate::{shard_passes, Result, ZeroError};

/// The side of a weight's scale tile.
const TILE: usize = 128;

/// One linear weight `(rows, cols)` at `offset` in its unit's flat buffer, whose tiles are
/// numbered from `first_tile` (row-major over the tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matrix {
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub first_tile: usize,
}

impl Matrix {
    fn tile_cols(&self) -> usize {
        self.cols.div_ceil(TILE)
    }

    fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE) * self.tile_cols()
    }

    fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.rows * self.cols
    }

    /// The unit's tile of element `e` of this weight.
    fn tile_of(&self, e: usize) -> usize {
        let k = e - self.offset;
        let (i, j) = (k / self.cols, k % self.cols);
        self.first_tile + (i / TILE) * self.tile_cols() + j / TILE
    }
}

/// Where a unit's linear weights lie in its flat buffer, as FP8 qwZ encodes it: the weights
/// ([`UnitLayout::linear_weights`]), their tiles, and the unit's other elements (the rest).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinearLayout {
    pub matrices: Vec<Matrix>,
    /// The unit's elements outside the weights, in order (padding excluded).
    pub rest: Vec<Range<usize>>,
    pub tiles: usize,
    pub rest_len: usize,
}

impl LinearLayout {
    /// No linear weight (the embedding, the final norm, any unit without FP8 qwZ).
    pub const fn none() -> LinearLayout {
        LinearLayout {
            matrices: Vec::new(),
            rest: Vec::new(),
            tiles: 0,
            rest_len: 0,
        }
    }

    /// The layout of `unit`'s linear weights (none for the embedding and the final norm).
    pub fn of(unit: &UnitLayout) -> LinearLayout {
        let mut matrices = Vec::new();
        let mut tiles = 0;
        for p in unit.linear_weights() {
            let m = Matrix {
                offset: p.offset,
                rows: p.shape[0],
                cols: p.shape[1],
                first_tile: tiles,
            };
            tiles += m.tiles();
            matrices.push(m);
        }
        let mut sorted: Vec<Range<usize>> = matrices.iter().map(Matrix::range).collect();
        sorted.sort_by_key(|r| r.start);
        let mut rest = Vec::new();
        let mut at = 0;
        for r in sorted {
            if r.start > at {
                rest.push(at..r.start);
            }
            at = r.end;
        }
        if unit.numel > at {
            rest.push(at..unit.numel);
        }
        let rest_len = rest.iter().map(|r| r.len()).sum();
        LinearLayout {
            matrices,
            rest,
            tiles,
            rest_len,
        }
    }

    /// The length of the resolved header: an absmax a tile, then the rest.
    pub fn resolved_len(&self) -> usize {
        self.tiles + self.rest_len
    }

    /// What the part `[at, at + len)` of the unit holds: the tiles it touches (a contiguous
    /// range: tiles are numbered in buffer order, row-major within a weight, and a range of
    /// elements covers whole tile rows between its ends) and its pieces of the rest, each with
    /// its place in the rest.
    fn part(&self, at: usize, len: usize) -> Part {
        let mut tiles: Option<Range<usize>> = None;
        for m in &self.matrices {
            let o = overlap(&m.range(), at, len);
            if o.is_empty() {
                continue;
            }
            let row = |e: usize| (e - m.offset) / m.cols / TILE;
            let lo = m.first_tile + row(o.start) * m.tile_cols();
            let hi = m.first_tile + (row(o.end - 1) + 1) * m.tile_cols();
            tiles = Some(match tiles {
                Some(t) => t.start..hi,
                None => lo..hi,
            });
        }
        let mut rest = Vec::new();
        let mut k = 0;
        for r in &self.rest {
            let o = overlap(r, at, len);
            if !o.is_empty() {
                rest.push((o.clone(), k + o.start - r.start));
            }
            k += r.len();
        }
        Part {
            tiles: tiles.unwrap_or(0..0),
            rest,
        }
    }

    /// The slot each of `w` ranks with shards of `shard` elements fills in the first
    /// all-gather: room for the most tiles one touches, then for the most rest elements one
    /// holds.
    pub fn slot(&self, w: usize, shard: usize) -> (usize, usize) {
        (0..w)
            .map(|r| self.part(r * shard, shard))
            .fold((0, 0), |(t, e), p| {
                (t.max(p.tiles.len()), e.max(p.rest_len()))
            })
    }
}

/// A rank's part of a unit ([`LinearLayout::part`]): the tiles its elements touch and its
/// pieces of the rest (unit offsets, and where each starts in the rest).
struct Part {
    tiles: Range<usize>,
    rest: Vec<(Range<usize>, usize)>,
}

impl Part {
    fn rest_len(&self) -> usize {
        self.rest.iter().map(|(r, _)| r.len()).sum()
    }
}

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

    fn gather_from_world(
        &self,
        lane: &mut dyn Lane,
        input: &GatherInput<'_>,
        out: Tensor,
    ) -> Result<(UnitParams, Option<NodeSlice>)> {
        let layout = input.linears;
        if layout.matrices.is_empty() {
            return self.int8().gather_from_world(lane, input, out);
        }
        on_the_cpu(input)?;
        let place = lane.place().clone();
        let span = |family| place.scope(input.device, family);
        let (w, at, shard) = (input.padded / input.shard, input.at(), input.shard);
        let mine = my_values(input)?;
        // 1. every tile's absmax and the rest, from every rank's part of them
        let slot = layout.slot(w, shard);
        let h = slot.0 + slot.1;
        let header = {
            let _span = span(Family::Quantisation);
            Tensor::from_vec(partial_header(layout, slot, &mine, at), h, input.device)?
        };
        let headers = lane.alloc(DType::F32, w * h)?;
        shard_passes::copy_into(&place, &header, 0, h, &headers, input.rank * h)?;
        let headers = lane.all_gather_in_place(Group::World, &headers)?;
        let resolved = resolve(layout, slot, &headers.to_vec1::<f32>()?, w, shard);
        // 2. my shard's codes with the common scales, gathered
        let codes = lane.alloc(DType::U8, input.padded)?;
        let mine = {
            let _span = span(Family::Quantisation);
            let scales = tile_scales(layout, &resolved);
            Tensor::from_vec(encode(layout, &scales, &mine, at), shard, input.device)?
        };
        shard_passes::copy_into(&place, &mine, 0, shard, &codes, at)?;
        let codes = lane.all_gather_in_place(Group::World, &codes)?;
        let resolved = Tensor::from_vec(resolved, layout.resolved_len(), input.device)?;
        let params = unit_params(input, layout, &codes, &resolved)?;
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
        out: Tensor,
    ) -> Result<UnitParams> {
        let layout = input.linears;
        if layout.matrices.is_empty() {
            return self.int8().gather_from_node(lane, input, kept, out);
        }
        on_the_cpu(input)?;
        let place = lane.place().clone();
        let (slice, at) = (input.slice(), input.node_at());
        let codes = lane.alloc(DType::U8, input.padded)?;
        shard_passes::copy_into(&place, kept.buffer("codes"), 0, slice, &codes, at)?;
        let codes = lane.all_gather_in_place(Group::IntraNode, &codes)?;
        unit_params(input, layout, &codes, kept.buffer("resolved"))
    }
}

/// The encoding and the resolution run on the host, between collectives that a GPU job queues
/// on its communication stream: only the CPU's jobs, which run in order, can read and write
/// their buffers so. On the GPU they are kernels on that stream, not written yet.
fn on_the_cpu(input: &GatherInput<'_>) -> Result<()> {
    match input.device.is_cuda() {
        true => Err(ZeroError::Config {
            key: "quantized_weights",
            reason: "FP8 qwZ (qwZ under train.precision = \"fp8\") encodes on the CPU only so \
                     far; on the GPU set zero.quantized_weights = false"
                .into(),
        }),
        false => Ok(()),
    }
}

/// My shard as the layer would read it after an exact gather, in f32: the working copy in the
/// compute dtype where given, else the master cast to the compute dtype.
fn my_values(input: &GatherInput<'_>) -> Result<Vec<f32>> {
    let shard = match input.working {
        Some(w) if w.dtype() == input.dtype => w.narrow(0, 0, input.shard)?,
        _ => input.master.to_dtype(input.dtype)?,
    };
    Ok(shard.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// The parts of `range` and of my shard `[at, at + values.len())` that overlap, as unit offsets.
fn overlap(range: &Range<usize>, at: usize, len: usize) -> Range<usize> {
    range.start.max(at)..range.end.min(at + len)
}

/// My slot of the first all-gather (`slot`: [`LinearLayout::slot`]): the partial absmax of
/// each tile my shard touches (inf where one of mine is inf or NaN), then my shard's rest
/// elements, each part padded with zeros to the slot.
fn partial_header(
    layout: &LinearLayout,
    slot: (usize, usize),
    values: &[f32],
    at: usize,
) -> Vec<f32> {
    let part = layout.part(at, values.len());
    let mut header = vec![0f32; slot.0 + slot.1];
    let (amax, rest) = header.split_at_mut(slot.0);
    for m in &layout.matrices {
        for e in overlap(&m.range(), at, values.len()) {
            let v = values[e - at].abs();
            let v = if v.is_nan() { f32::INFINITY } else { v };
            let t = m.tile_of(e) - part.tiles.start;
            amax[t] = amax[t].max(v);
        }
    }
    let mut k = 0;
    for (r, _) in &part.rest {
        rest[k..k + r.len()].copy_from_slice(&values[r.start - at..r.end - at]);
        k += r.len();
    }
    header
}

/// Every tile's absmax (the max of the ranks' partial ones) and the rest (each element from
/// the rank whose shard holds it), from the gathered slots of `w` ranks with shards of `shard`
/// elements: the resolved header, [`LinearLayout::resolved_len`] long.
fn resolve(
    layout: &LinearLayout,
    slot: (usize, usize),
    headers: &[f32],
    w: usize,
    shard: usize,
) -> Vec<f32> {
    let h = slot.0 + slot.1;
    let mut out = vec![0f32; layout.resolved_len()];
    let (amax, rest) = out.split_at_mut(layout.tiles);
    for (r, theirs) in headers.chunks(h).take(w).enumerate() {
        let part = layout.part(r * shard, shard);
        for (i, t) in part.tiles.enumerate() {
            amax[t] = amax[t].max(theirs[i]);
        }
        let mut k = slot.0;
        for (piece, to) in &part.rest {
            rest[*to..*to + piece.len()].copy_from_slice(&theirs[k..k + piece.len()]);
            k += piece.len();
        }
    }
    out
}

/// Each tile's (scale, multiplier) from its absmax: [`quant::fp8_e4m3_scale`], NaN for a tile
/// holding an inf or NaN.
fn tile_scales(layout: &LinearLayout, resolved: &[f32]) -> Vec<(f32, f32)> {
    resolved[..layout.tiles]
        .iter()
        .map(|&a| quant::fp8_e4m3_scale(a))
        .collect()
}

/// My shard's codes: each weight element `e4m3_encode(x m)` with its tile's multiplier (0 in a
/// tile whose scale is NaN), as `quantize_fp8_e4m3_tiles` of the whole weight; 0 elsewhere.
fn encode(layout: &LinearLayout, scales: &[(f32, f32)], values: &[f32], at: usize) -> Vec<u8> {
    let mut codes = vec![0u8; values.len()];
    for m in &layout.matrices {
        for e in overlap(&m.range(), at, values.len()) {
            let (s, mult) = scales[m.tile_of(e)];
            codes[e - at] = match s.is_nan() {
                true => 0,
                false => quant::e4m3_encode(values[e - at] * mult),
            };
        }
    }
    codes
}

/// The gathered unit as its layers read it: the flat buffer (the rest at its places, zeros in
/// the weights and the padding) and each weight's codes and tile scales.
fn unit_params(
    input: &GatherInput<'_>,
    layout: &LinearLayout,
    codes: &Tensor,
    resolved: &Tensor,
) -> Result<UnitParams> {
    let dev = input.device;
    let resolved = resolved.to_vec1::<f32>()?;
    let mut flat = vec![0f32; input.padded];
    let mut k = layout.tiles;
    for r in &layout.rest {
        flat[r.clone()].copy_from_slice(&resolved[k..k + r.len()]);
        k += r.len();
    }
    let scales = tile_scales(layout, &resolved);
    let weights = layout
        .matrices
        .iter()
        .map(|m| -> Result<(usize, Fp8Weight)> {
            let w_codes = codes
                .narrow(0, m.offset, m.rows * m.cols)?
                .reshape((m.rows, m.cols))?;
            let tiles = m.first_tile..m.first_tile + m.tiles();
            let s: Vec<f32> = scales[tiles].iter().map(|&(s, _)| s).collect();
            let s = Tensor::from_vec(s, (m.rows.div_ceil(TILE), m.tile_cols()), dev)?;
            Ok((m.offset, Fp8Weight::new(w_codes, s)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let flat = Tensor::from_vec(flat, input.padded, dev)?.to_dtype(input.dtype)?;
    Ok(UnitParams::with_fp8(flat, weights))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit of a norm (`head` elements), a `(r0, c0)` weight, a bias, a `(r1, c1)` weight,
    /// padded to `padded`: its layout and values, with a zero tile, signed zeros, an inf, a
    /// NaN, values under the amax floor and magnitudes 2^20 apart.
    fn unit(w: usize) -> (LinearLayout, Vec<f32>, usize) {
        let (head, (r0, c0), bias, (r1, c1)) = (20, (272, 400), 48, (144, 130));
        let m0 = Matrix {
            offset: head,
            rows: r0,
            cols: c0,
            first_tile: 0,
        };
        let m1 = Matrix {
            offset: head + r0 * c0 + bias,
            rows: r1,
            cols: c1,
            first_tile: m0.tiles(),
        };
        let numel = m1.offset + r1 * c1;
        let rest = vec![0..head, m0.range().end..m1.offset];
        let layout = LinearLayout {
            tiles: m0.tiles() + m1.tiles(),
            rest_len: head + bias,
            matrices: vec![m0, m1],
            rest,
        };
        let mut state = 0x2545_f491_u64;
        let mut values: Vec<f32> = (0..numel)
            .map(|i| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                u * if i % 7 == 0 { 1e3 } else { 1e-2 }
            })
            .collect();
        // m0's tile (0, 1) all zeros, with signed zeros; a tile of m0 under the amax floor
        for i in 0..128 {
            for j in 128..256 {
                values[head + i * c0 + j] = if j % 2 == 0 { 0.0 } else { -0.0 };
                values[head + (128 + i) * c0 + j] = 1e-14 * (j as f32 - 190.0);
            }
        }
        values[head + 3 * c0 + 300] = f32::NAN; // tile (0, 2) of m0
        values[m1.offset + 140 * c1 + 129] = f32::NEG_INFINITY; // m1's last tile
        values[m1.offset + 5] = 1e-6; // beside 1e3's, 2^30 apart
        let padded = numel.div_ceil(w) * w;
        values.resize(padded, 0.0);
        (layout, values, padded / w)
    }

    /// Every rank's codes, and the resolved absmax and rest, of a world of `w` ranks, as the
    /// codec computes them from its shards.
    fn world(layout: &LinearLayout, values: &[f32], w: usize, shard: usize) -> (Vec<u8>, Vec<f32>) {
        let slot = layout.slot(w, shard);
        let headers: Vec<f32> = (0..w)
            .flat_map(|r| {
                partial_header(layout, slot, &values[r * shard..(r + 1) * shard], r * shard)
            })
            .collect();
        let resolved = resolve(layout, slot, &headers, w, shard);
        let scales = tile_scales(layout, &resolved);
        let codes = (0..w)
            .flat_map(|r| {
                encode(
                    layout,
                    &scales,
                    &values[r * shard..(r + 1) * shard],
                    r * shard,
                )
            })
            .collect();
        (codes, resolved)
    }

    #[test]
    fn shards_encode_the_one_device_quantisation_of_each_weight() {
        for w in [1, 2, 3, 5, 8] {
            let (layout, values, shard) = unit(w);
            let (codes, resolved) = world(&layout, &values, w, shard);
            let scales = tile_scales(&layout, &resolved);
            for m in &layout.matrices {
                let whole = &values[m.range()];
                let (want_codes, want_scales) = quant::quantize_fp8_e4m3_tiles(
                    whole,
                    m.rows,
                    m.cols,
                    quant::Tile {
                        rows: TILE,
                        cols: TILE,
                    },
                )
                .unwrap();
                assert_eq!(&codes[m.range()], &want_codes[..], "W={w}: codes");
                let got: Vec<u32> = scales[m.first_tile..m.first_tile + m.tiles()]
                    .iter()
                    .map(|&(s, _)| s.to_bits())
                    .collect();
                let want: Vec<u32> = want_scales.iter().map(|s| s.to_bits()).collect();
                assert_eq!(got, want, "W={w}: scales");
            }
            let nan_tiles = scales.iter().filter(|(s, _)| s.is_nan()).count();
            assert_eq!(nan_tiles, 2, "W={w}: the NaN's tile and the inf's");
            let rest: Vec<u32> = layout
                .rest
                .iter()
                .flat_map(|r| values[r.clone()].iter().map(|v| v.to_bits()))
                .collect();
            let got: Vec<u32> = resolved[layout.tiles..]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(got, rest, "W={w}: the norms and biases");
        }
    }

    /// Each rank's slot of the first all-gather holds its own tiles and rest elements: the
    /// whole header at W = 1, a part of it at W > 1.
    #[test]
    fn the_first_gather_sends_each_rank_its_own_part() {
        let (layout, _, shard) = unit(1);
        assert_eq!(layout.slot(1, shard), (layout.tiles, layout.rest_len));
        for w in [2, 5, 8] {
            let (layout, _, shard) = unit(w);
            let (tiles, rest) = layout.slot(w, shard);
            assert!(tiles < layout.tiles, "W={w}: {tiles} tiles a slot");
            assert!(rest <= layout.rest_len, "W={w}");
            // every tile is touched by some rank's part, and only by those
            let mut touched = vec![false; layout.tiles];
            for r in 0..w {
                layout
                    .part(r * shard, shard)
                    .tiles
                    .for_each(|t| touched[t] = true);
            }
            assert!(touched.iter().all(|&t| t), "W={w}");
        }
    }

    #[test]
    fn the_layout_of_a_block_names_its_linear_weights_and_the_rest() {
        let cfg = model::ModelConfig::gpt2(1, 144, 4, 8, 50);
        let unit = model::ModelLayout::new(&cfg).units[1].clone();
        let layout = LinearLayout::of(&unit);
        // c_attn (144, 432), c_proj (144, 144), c_fc (144, 576), mlp c_proj (576, 144)
        let tiles: usize = [(2, 4), (2, 2), (2, 5), (5, 2)]
            .iter()
            .map(|(a, b)| a * b)
            .sum();
        assert_eq!(layout.matrices.len(), 4);
        assert_eq!(layout.tiles, tiles);
        let weights: usize = layout.matrices.iter().map(|m| m.rows * m.cols).sum();
        assert_eq!(layout.rest_len + weights, unit.numel);
        // ln_1, ln_2 (weight and bias) and the four biases: 4 x 144 + 432 + 144 + 576 + 144
        assert_eq!(layout.rest_len, 4 * 144 + 432 + 144 + 576 + 144);
        let embedding = model::ModelLayout::new(&cfg).units[0].clone();
        assert!(LinearLayout::of(&embedding).matrices.is_empty());
    }
}
