//! FP8 qwZ's steps, each on the device of its tensors: on the CPU the host arithmetic below (the
//! reference), on the GPU one kernel of `crates/kernels/cuda/fp8.cu` a step (`cuda.rs`), queued
//! where `place` says (the gather job's communication stream) and bitwise equal to the CPU
//! (tests/gpu/fp8_qwz.rs). Absmax values are held in f32 buffers: they are never negative, so
//! their bits order as their values and the GPU takes the max of them as u32.

use candle_core::{DType, Device, Tensor};
use kernels::place::Place;

use super::layout::{overlap, LinearLayout};
use crate::{Result, ZeroError};

/// My slot of the first all-gather, `headers[rank * h..(rank + 1) * h]` (`h = slot.0 + slot.1`,
/// [`LinearLayout::slot`]): the partial absmax of each tile my shard touches (inf where one of
/// mine is inf or NaN), then my shard's norm and bias elements, each part zero-padded to the
/// slot. `values` is my shard `[at, at + len)` in the compute dtype.
pub fn partial_header_into(
    place: &Place,
    layout: &LinearLayout,
    slot: (usize, usize),
    values: &Tensor,
    at: usize,
    headers: &Tensor,
    rank: usize,
) -> Result<()> {
    let h = slot.0 + slot.1;
    check("headers", headers, DType::F32, (rank + 1) * h)?;
    match headers.device() {
        Device::Cpu => {
            let _ = place;
            let header = partial_header(layout, slot, &host(values)?, at);
            Ok(headers.slice_set(&Tensor::new(header, &Device::Cpu)?, 0, rank * h)?)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            super::cuda::partial_header(dev, place, layout, slot, values, at, headers, rank)
        }
        #[allow(unreachable_patterns)]
        d => Err(unsupported(d)),
    }
}

/// `resolved` ([`LinearLayout::resolved_len`]) from the gathered slots `headers` and their
/// [`LinearLayout::resolve_map`]: each tile's absmax the max of the ranks' words for it, each
/// norm and bias element the word of the rank that holds it.
pub fn resolve_into(
    place: &Place,
    layout: &LinearLayout,
    map: &[i32],
    headers: &Tensor,
    resolved: &Tensor,
) -> Result<()> {
    check("headers", headers, DType::F32, map.len())?;
    check(
        "resolved header",
        resolved,
        DType::F32,
        layout.resolved_len(),
    )?;
    match headers.device() {
        Device::Cpu => {
            let _ = place;
            let out = resolve(layout, map, &host(headers)?);
            Ok(resolved.slice_set(&Tensor::new(out, &Device::Cpu)?, 0, 0)?)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => super::cuda::resolve(dev, place, layout, map, headers, resolved),
        #[allow(unreachable_patterns)]
        d => Err(unsupported(d)),
    }
}

/// My shard's codes into `codes[at..at + len]`: each weight element `e4m3_encode(x m)` with
/// its tile's multiplier from `resolved` (0 in a tile whose scale is NaN), 0 outside the
/// weights: [`quant::quantize_fp8_e4m3_tiles`] of each whole weight, wherever `at` falls.
pub fn encode_into(
    place: &Place,
    layout: &LinearLayout,
    resolved: &Tensor,
    values: &Tensor,
    at: usize,
    codes: &Tensor,
) -> Result<()> {
    check(
        "resolved header",
        resolved,
        DType::F32,
        layout.resolved_len(),
    )?;
    check("codes", codes, DType::U8, at + values.elem_count())?;
    match codes.device() {
        Device::Cpu => {
            let _ = place;
            let scales = tile_scales(layout, &host(resolved)?);
            let mine = encode(layout, &scales, &host(values)?, at);
            Ok(codes.slice_set(&Tensor::new(mine, &Device::Cpu)?, 0, at)?)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => super::cuda::encode(dev, place, layout, resolved, values, at, codes),
        #[allow(unreachable_patterns)]
        d => Err(unsupported(d)),
    }
}

/// Every tile's scale ([`quant::fp8_e4m3_scale`] of its resolved absmax; NaN for a tile
/// holding an inf or NaN) into `scales` (`tiles` f32), and the unit's flat buffer `flat` (the
/// compute dtype, padded): the norms and biases at their places, zeros elsewhere.
pub fn finish_into(
    place: &Place,
    layout: &LinearLayout,
    resolved: &Tensor,
    scales: &Tensor,
    flat: &Tensor,
) -> Result<()> {
    check(
        "resolved header",
        resolved,
        DType::F32,
        layout.resolved_len(),
    )?;
    check("tile scales", scales, DType::F32, layout.tiles)?;
    let ends = layout.rest.iter().map(|r| r.end);
    let numel = ends
        .chain(layout.matrices.iter().map(|m| m.range().end))
        .max();
    check("gathered buffer", flat, flat.dtype(), numel.unwrap_or(0))?;
    match flat.device() {
        Device::Cpu => {
            let _ = place;
            let resolved = host(resolved)?;
            let s: Vec<f32> = tile_scales(layout, &resolved)
                .iter()
                .map(|&(s, _)| s)
                .collect();
            scales.slice_set(&Tensor::new(s, &Device::Cpu)?, 0, 0)?;
            let mut out = vec![0f32; flat.elem_count()];
            let mut k = layout.tiles;
            for r in &layout.rest {
                out[r.clone()].copy_from_slice(&resolved[k..k + r.len()]);
                k += r.len();
            }
            let out = Tensor::new(out, &Device::Cpu)?.to_dtype(flat.dtype())?;
            Ok(flat.slice_set(&out, 0, 0)?)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => super::cuda::finish(dev, place, layout, resolved, scales, flat),
        #[allow(unreachable_patterns)]
        d => Err(unsupported(d)),
    }
}

/// A device this build has no FP8 qwZ for (a GPU without `--features cuda`, Metal).
fn unsupported(d: &Device) -> ZeroError {
    candle_core::Error::Msg(format!("FP8 qwZ has no kernels on {d:?}")).into()
}

/// `t` is a vector of `dtype` with at least `len` elements.
fn check(what: &'static str, t: &Tensor, dtype: DType, len: usize) -> Result<()> {
    match t.rank() == 1 && t.dtype() == dtype && t.elem_count() >= len {
        true => Ok(()),
        false => Err(ZeroError::ShardBuffer {
            what,
            detail: format!(
                "{:?} of {:?}: FP8 qwZ wants a vector of {dtype:?}, {len} elements or more",
                t.dims(),
                t.dtype()
            ),
        }),
    }
}

/// A CPU tensor's values as f32.
fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// [`partial_header_into`]'s slot, on the host.
pub(super) fn partial_header(
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

/// [`resolve_into`] on the host.
pub(super) fn resolve(layout: &LinearLayout, map: &[i32], headers: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; layout.resolved_len()];
    for (&d, &v) in map.iter().zip(headers) {
        let Ok(d) = usize::try_from(d) else { continue };
        match d < layout.tiles {
            true => out[d] = out[d].max(v),
            false => out[d] = v,
        }
    }
    out
}

/// Each tile's (scale, multiplier) from its absmax: [`quant::fp8_e4m3_scale`], NaN for a tile
/// holding an inf or NaN.
pub(super) fn tile_scales(layout: &LinearLayout, resolved: &[f32]) -> Vec<(f32, f32)> {
    resolved[..layout.tiles]
        .iter()
        .map(|&a| quant::fp8_e4m3_scale(a))
        .collect()
}

/// [`encode_into`]'s codes of my shard, on the host.
pub(super) fn encode(
    layout: &LinearLayout,
    scales: &[(f32, f32)],
    values: &[f32],
    at: usize,
) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::super::layout::{tests::unit, TILE};
    use super::*;

    /// Every rank's codes, and the resolved absmax and rest, of a world of `w` ranks, as the
    /// codec computes them from its shards.
    fn world(layout: &LinearLayout, values: &[f32], w: usize, shard: usize) -> (Vec<u8>, Vec<f32>) {
        let slot = layout.slot(w, shard);
        let headers: Vec<f32> = (0..w)
            .flat_map(|r| {
                partial_header(layout, slot, &values[r * shard..(r + 1) * shard], r * shard)
            })
            .collect();
        let resolved = resolve(layout, &layout.resolve_map(w, shard), &headers);
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
}
