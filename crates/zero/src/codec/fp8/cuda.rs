//! The launchers of FP8 qwZ's steps on the GPU (`crates/kernels/cuda/fp8.cu`, its "FP8 qwZ"
//! section): each step of `steps.rs` as kernels queued where `place` says, reading my shard in
//! bf16. The CPU functions of `steps.rs` are their reference.

use candle_core::cuda_backend::cudarc::driver::{result as driver, LaunchConfig};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Tensor};
use kernels::launch::{self, Kernel, Module};
use kernels::place::{address, Place};

use super::layout::{overlap, LinearLayout, Matrix, TILE};
use crate::{Result, ZeroError};

/// CTAs at most of the grid-stride kernels.
const GRID: usize = 1024;
/// Threads a CTA; the segment kernels run a warp a segment.
const THREADS: usize = 256;

fn func(dev: &CudaDevice, place: &Place, name: &str) -> Result<Kernel> {
    let module = Module::new(&kernels::FP8, &[], kernels::Flavour::Fast);
    Ok(Kernel::placed(dev, place, module, name).map_err(candle_core::Error::wrap)?)
}

fn bf16(what: &'static str, t: &Tensor) -> Result<()> {
    match t.dtype() {
        DType::BF16 => Ok(()),
        d => Err(ZeroError::ShardBuffer {
            what,
            detail: format!(
                "{d:?}: FP8 qwZ on the GPU reads and writes bf16 (train.precision = \"fp8\")"
            ),
        }),
    }
}

/// Zeroes `bytes` bytes at `at` on `place`'s stream.
fn zero(dev: &CudaDevice, place: &Place, at: u64, bytes: usize) -> Result<()> {
    let stream = place.stream(dev);
    stream.context().bind_to_thread().w()?;
    if bytes > 0 {
        // SAFETY: the caller passes a range inside a live buffer, queued on the stream that
        // orders its other uses.
        unsafe { driver::memset_d8_async(at, 0, bytes, stream.cu_stream()) }.w()?;
    }
    Ok(())
}

/// The part of weight `m` inside my shard `[at, at + len)` as the segment kernels take it:
/// (lo, hi, segments), a segment a row's elements in one tile column; `None` if none is mine.
fn segments(m: &Matrix, at: usize, len: usize) -> Option<(i64, i64, i64)> {
    let o = overlap(&m.range(), at, len);
    if o.is_empty() {
        return None;
    }
    let row = |e: usize| (e - m.offset) / m.cols;
    let rows = row(o.end - 1) - row(o.start) + 1;
    Some((o.start as i64, o.end as i64, (rows * m.tile_cols()) as i64))
}

fn segment_grid(segs: i64) -> LaunchConfig {
    launch::grid((segs as usize).div_ceil(THREADS / 32), THREADS)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn partial_header(
    dev: &CudaDevice,
    place: &Place,
    layout: &LinearLayout,
    slot: (usize, usize),
    values: &Tensor,
    at: usize,
    headers: &Tensor,
    rank: usize,
) -> Result<()> {
    bf16("my shard", values)?;
    let (len, h) = (values.elem_count(), slot.0 + slot.1);
    let x = address(values)?;
    let base = address(headers)? + (rank * h * 4) as u64;
    zero(dev, place, base, h * 4)?;
    let part = layout.part(at, len);
    let absmax = func(dev, place, "fp8_gather_absmax")?;
    for m in &layout.matrices {
        let Some((lo, hi, segs)) = segments(m, at, len) else {
            continue;
        };
        let (at, off) = (at as i64, m.offset as i64);
        let (cols, tile_cols) = (m.cols as i32, m.tile_cols() as i32);
        let tile0 = m.first_tile as i64 - part.tiles.start as i64;
        // SAFETY: (const bf16*, i64 x5, int, int, i64, i64, u32*): x holds my len elements from
        // unit offset at, and the slot the tiles of my part (LinearLayout::slot).
        unsafe {
            absmax.launch(
                segment_grid(segs),
                &[
                    &x, &at, &off, &lo, &hi, &cols, &tile_cols, &segs, &tile0, &base,
                ],
            )
        }
        .map_err(candle_core::Error::wrap)?;
    }
    let widen = func(dev, place, "fp8_gather_widen")?;
    let mut k = slot.0;
    for (piece, _) in &part.rest {
        let n = piece.len() as i64;
        let from = x + ((piece.start - at) * 2) as u64;
        let to = base + (k * 4) as u64;
        // SAFETY: (const bf16*, i64, float*): n elements of my shard into my slot.
        unsafe {
            widen.launch(
                launch::spread(piece.len(), THREADS, GRID),
                &[&from, &n, &to],
            )
        }
        .map_err(candle_core::Error::wrap)?;
        k += piece.len();
    }
    Ok(())
}

pub(super) fn resolve(
    dev: &CudaDevice,
    place: &Place,
    layout: &LinearLayout,
    map: &[i32],
    headers: &Tensor,
    resolved: &Tensor,
) -> Result<()> {
    let stream = place.stream(dev);
    // Uploaded on the job's stream and freed in its order, after the kernel has read it.
    let map_dev = stream.clone_htod(map).w()?;
    let out = address(resolved)?;
    zero(dev, place, out, layout.tiles * 4)?;
    let f = func(dev, place, "fp8_gather_resolve")?;
    let (h, m) = (address(headers)?, launch::addr(&map_dev, &stream));
    let (n, tiles) = (map.len() as i64, layout.tiles as i32);
    // SAFETY: (const u32*, const int*, i64, int, u32*): n words and map entries, each entry
    // below resolved_len (LinearLayout::resolve_map).
    unsafe {
        f.launch(
            launch::spread(map.len(), THREADS, GRID),
            &[&h, &m, &n, &tiles, &out],
        )
    }
    .map_err(candle_core::Error::wrap)?;
    drop(map_dev);
    Ok(())
}

pub(super) fn encode(
    dev: &CudaDevice,
    place: &Place,
    layout: &LinearLayout,
    resolved: &Tensor,
    values: &Tensor,
    at: usize,
    codes: &Tensor,
) -> Result<()> {
    bf16("my shard", values)?;
    let len = values.elem_count();
    let (x, amax) = (address(values)?, address(resolved)?);
    let out = address(codes)? + at as u64;
    zero(dev, place, out, len)?;
    let f = func(dev, place, "fp8_gather_encode")?;
    for m in &layout.matrices {
        let Some((lo, hi, segs)) = segments(m, at, len) else {
            continue;
        };
        let (at, off) = (at as i64, m.offset as i64);
        let (cols, tile_cols) = (m.cols as i32, m.tile_cols() as i32);
        let tile0 = m.first_tile as i64;
        // SAFETY: (const bf16*, i64 x5, int, int, i64, i64, const u32*, u8*): x and out hold my
        // len elements from unit offset at; amax every tile's.
        unsafe {
            f.launch(
                segment_grid(segs),
                &[
                    &x, &at, &off, &lo, &hi, &cols, &tile_cols, &segs, &tile0, &amax, &out,
                ],
            )
        }
        .map_err(candle_core::Error::wrap)?;
    }
    Ok(())
}

pub(super) fn finish(
    dev: &CudaDevice,
    place: &Place,
    layout: &LinearLayout,
    resolved: &Tensor,
    scales: &Tensor,
    flat: &Tensor,
) -> Result<()> {
    bf16("gathered buffer", flat)?;
    debug_assert_eq!(TILE, 128, "fp8.cu's tiles");
    let (r, s, out) = (address(resolved)?, address(scales)?, address(flat)?);
    let tiles = layout.tiles as i64;
    let f = func(dev, place, "fp8_gather_scales")?;
    // SAFETY: (const u32*, i64, float*): tiles words each.
    unsafe {
        f.launch(
            launch::spread(layout.tiles, THREADS, GRID),
            &[&r, &tiles, &s],
        )
    }
    .map_err(candle_core::Error::wrap)?;
    zero(dev, place, out, flat.elem_count() * 2)?;
    let narrow = func(dev, place, "fp8_gather_narrow")?;
    let mut k = layout.tiles;
    for piece in &layout.rest {
        let n = piece.len() as i64;
        let (from, to) = (r + (k * 4) as u64, out + (piece.start * 2) as u64);
        // SAFETY: (const float*, i64, bf16*): n resolved words into their place in the unit.
        unsafe {
            narrow.launch(
                launch::spread(piece.len(), THREADS, GRID),
                &[&from, &n, &to],
            )
        }
        .map_err(candle_core::Error::wrap)?;
        k += piece.len();
    }
    Ok(())
}
