//! Where a unit's linear weights lie, as FP8 qwZ encodes them: each weight's 128 x 128 tiles
//! numbered over the unit, the unit's other elements (norms, biases: the *rest*), what part of
//! them a rank's shard holds, and the slots of the gather's first all-gather.

use std::ops::Range;

use model::UnitLayout;

/// The side of a weight's scale tile.
pub(super) const TILE: usize = 128;

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
    pub(super) fn tile_cols(&self) -> usize {
        self.cols.div_ceil(TILE)
    }

    pub(super) fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE) * self.tile_cols()
    }

    pub(super) fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.rows * self.cols
    }

    /// The unit's tile of element `e` of this weight.
    pub(super) fn tile_of(&self, e: usize) -> usize {
        let k = e - self.offset;
        let (i, j) = (k / self.cols, k % self.cols);
        self.first_tile + (i / TILE) * self.tile_cols() + j / TILE
    }
}

/// Where a unit's linear weights lie in its flat buffer, as FP8 qwZ encodes it: the weights
/// ([`UnitLayout::linear_weights`]), their tiles, and the unit's other elements (the rest).
#[derive(Clone, Debug, PartialEq, Eq)]
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
        // The weights in buffer order (`UnitLayout::params` is, offsets increasing),
        // which the tile numbering and `part` rely on.
        debug_assert!(matrices.windows(2).all(|p| p[0].range().end <= p[1].offset));
        let mut rest = Vec::new();
        let mut at = 0;
        for r in matrices.iter().map(Matrix::range) {
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
    pub(super) fn part(&self, at: usize, len: usize) -> Part {
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

    /// Where each word of the first all-gather's slots (`w` ranks with shards of `shard`
    /// elements, [`LinearLayout::slot`]) goes in the resolved header: a tile's absmax (an index
    /// below `tiles`: the max of every rank's word for it), a norm or bias element (copied
    /// from the one rank that holds it), or nowhere (-1: a slot's padding). The same map
    /// resolves the slots on the CPU and on the GPU.
    pub fn resolve_map(&self, w: usize, shard: usize) -> Vec<i32> {
        let slot = self.slot(w, shard);
        let h = slot.0 + slot.1;
        let mut map = vec![-1i32; w * h];
        let index = |d: usize| i32::try_from(d).expect("a unit's header fits an i32 index");
        for (r, theirs) in map.chunks_mut(h).enumerate() {
            let part = self.part(r * shard, shard);
            for (i, t) in part.tiles.enumerate() {
                theirs[i] = index(t);
            }
            let mut k = slot.0;
            for (piece, to) in &part.rest {
                for (j, word) in theirs[k..k + piece.len()].iter_mut().enumerate() {
                    *word = index(self.tiles + to + j);
                }
                k += piece.len();
            }
        }
        map
    }
}

/// A rank's part of a unit ([`LinearLayout::part`]): the tiles its elements touch and its
/// pieces of the rest (unit offsets, and where each starts in the rest).
pub(super) struct Part {
    pub tiles: Range<usize>,
    pub rest: Vec<(Range<usize>, usize)>,
}

impl Part {
    pub(super) fn rest_len(&self) -> usize {
        self.rest.iter().map(|(r, _)| r.len()).sum()
    }
}

/// The part of `range` inside `[at, at + len)`, as unit offsets (empty where none is).
pub(super) fn overlap(range: &Range<usize>, at: usize, len: usize) -> Range<usize> {
    range.start.max(at)..range.end.min(at + len)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A unit of a norm (`head` elements), a `(r0, c0)` weight, a bias, a `(r1, c1)` weight,
    /// padded to `padded`: its layout and values, with a zero tile, signed zeros, an inf, a
    /// NaN, values under the amax floor and magnitudes 2^20 apart.
    pub(in crate::codec::fp8) fn unit(w: usize) -> (LinearLayout, Vec<f32>, usize) {
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
