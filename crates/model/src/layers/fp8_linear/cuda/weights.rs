//! A linear layer's weight as the FP8 GEMMs read it: quantised from bf16 into 128 x 128 tiles
//! (`fp8_quantize_tiles`, one launch for all of a packed projection's weights), or the codes
//! FP8 qwZ gathered, rearranged for the forward (`fp8_transpose_tiles`). The forward reads `w^T`'s codes `(OUT, IN)` (K = IN), the input
//! gradient `w`'s `(IN, OUT)` (K = OUT); each pass quantises the one it reads.
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::{DType, Tensor};
use kernels::profile::Family;

use super::{aligned, kernel, tile_grid, Operand, Weight, BLOCK};
use crate::error::Result;
use crate::gemm::ScaleMode;
use crate::gpu;
use crate::layers::fp8_linear::Transposed;
use crate::layers::Fp8Weight;
use crate::linears::LinearWeight;

/// A weight as the GEMM that contracts over its IN reads it (the forward: its transposed
/// codes `(OUT, IN)`, scales `[OB][round_up(IB, 4)]`), or with `!forward` as the input
/// gradient's reads it (its codes `(IN, OUT)`, scales `[IB][round_up(OB, 4)]`): quantised
/// here from bf16, or rearranged from the codes and tile scales FP8 qwZ gathered (the same
/// bytes: `fp8_quantize_tiles` is `quant::quantize_fp8_e4m3_tiles` bit for bit).
pub(super) fn weight_operand(w: &LinearWeight, forward: bool) -> Result<Operand> {
    match w {
        LinearWeight::Dense(t) => {
            let (codes, codes_t) = quantize_tiles(t, !forward, forward)?;
            Ok(match forward {
                true => codes_t.expect("asked for w^T's codes"),
                false => codes.expect("asked for w's codes"),
            })
        }
        LinearWeight::Fp8(q) if forward => match q.transposed() {
            Some(t) => Ok(Operand {
                codes: t.codes.clone(),
                scales: t.scales.clone(),
                mode: ScaleMode::Blk128x128,
            }),
            None => gathered_transposed(q),
        },
        LinearWeight::Fp8(q) => {
            let ob = q.dims().1.div_ceil(BLOCK);
            let scales = q
                .scales()
                .pad_with_zeros(1, 0, ob.next_multiple_of(4) - ob)?;
            Ok(Operand {
                codes: aligned(q.codes().clone())?,
                scales: aligned(scales)?,
                mode: ScaleMode::Blk128x128,
            })
        }
    }
}

/// A weight FP8 qwZ gathered, `(IN, OUT)` codes and `[IB][OB]` tile scales, as the forward
/// reads it: `w^T`'s codes `(OUT, IN)` and scales `[OB][round_up(IB, 4)]`
/// (`fp8_transpose_tiles`: the bytes [`quantize_tiles`] writes for the dense weight, moved).
pub fn gathered_transposed(q: &Fp8Weight) -> Result<Operand> {
    let dev = gpu::device(q.codes())?;
    let _span = kernels::profile::scope_cuda(&dev, Family::Quantisation);
    let (inp, out) = q.dims();
    let (ib, ob) = (inp.div_ceil(BLOCK), out.div_ceil(BLOCK));
    let ld_t = ib.next_multiple_of(4);
    // Fp8Weight::new checked the dtypes and that the scales are [IB][OB].
    let (codes, scales) = (q.codes().contiguous()?, q.scales().contiguous()?);
    let codes_t = gpu::uninit((out, inp), DType::U8, &dev)?;
    // Every scale, the padding of each row included (zeros), is written by the kernel.
    let scales_t = gpu::uninit((ob, ld_t), DType::F32, &dev)?;
    let func = kernel(&dev, "fp8_transpose_tiles")?;
    let cfg = tile_grid(ob, ib);
    let (pc, ps) = (gpu::ptr(&codes)?, gpu::ptr(&scales)?);
    let (pt, pst) = (gpu::ptr(&codes_t)?, gpu::ptr(&scales_t)?);
    // SAFETY: codes (IN, OUT) u8 and scales (IB, OB) f32 contiguous on this device; codes_t
    // OUT x IN bytes and scales_t OB x ld_t f32 fresh, every one written (the padding by each
    // row's last tile); IN, OUT fit i32 (takes_weight); arguments in kernel order.
    unsafe {
        func.launch(
            cfg,
            &[
                &pc,
                &ps,
                &pt,
                &pst,
                &(inp as i32),
                &(out as i32),
                &(ld_t as i32),
            ],
        )?;
    }
    Ok(Operand {
        codes: codes_t,
        scales: scales_t,
        mode: ScaleMode::Blk128x128,
    })
}

/// The most weights one [`quantize_tiles_batch`] launch takes (fp8.cu's `FP8_TILE_BATCH`).
const TILE_BATCH: usize = 4;

/// fp8.cu's `Fp8TileBatch`, passed by value: each weight's addresses (0: an orientation not
/// written), row stride, OUT, w's scale row length and its first column of tiles in the grid.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TileBatch {
    w: [u64; TILE_BATCH],
    codes: [u64; TILE_BATCH],
    codes_t: [u64; TILE_BATCH],
    scales_fwd: [u64; TILE_BATCH],
    scales_bwd: [u64; TILE_BATCH],
    ldw: [i64; TILE_BATCH],
    cols: [i32; TILE_BATCH],
    ld_bwd: [i32; TILE_BATCH],
    first_ob: [i32; TILE_BATCH],
    count: i32,
    pad: i32,
}

// The kernel's static_assert holds the C side to the same size.
const _: () = assert!(std::mem::size_of::<TileBatch>() == 248);

// SAFETY: plain integers, `repr(C)`, laid out as fp8.cu's Fp8TileBatch (the sizes asserted on
// both sides); the kernel reads it as a parameter.
unsafe impl DeviceRepr for TileBatch {}

/// [`weight_operand`] of each of a packed projection's weights (`ws` share IN): dense weights
/// quantised in one launch ([`quantize_tiles_batch`]: k and v of a Llama block are 16 to 64
/// tiles each, too few CTAs to fill the GPU alone), gathered ones rearranged one by one.
pub(super) fn weight_operands(ws: &[LinearWeight], forward: bool) -> Result<Vec<Operand>> {
    let dense: Option<Vec<&Tensor>> = ws
        .iter()
        .map(|w| match w {
            LinearWeight::Dense(t) => Some(t),
            LinearWeight::Fp8(_) => None,
        })
        .collect();
    match dense {
        Some(ts) if !ts.is_empty() && ts.len() <= TILE_BATCH => {
            let both = quantize_tiles_batch(&ts, !forward, forward)?;
            Ok(both
                .into_iter()
                .map(|(codes, codes_t)| match forward {
                    true => codes_t.expect("asked for w^T's codes"),
                    false => codes.expect("asked for w's codes"),
                })
                .collect())
        }
        _ => ws.iter().map(|w| weight_operand(w, forward)).collect(),
    }
}

/// [`quantize_weight`] of each of `ws` (at most four, sharing IN), in one launch: the same
/// bytes as a launch a weight, as `tests/gpu/fp8.rs` asserts.
pub fn quantize_weights(ws: &[&Tensor]) -> Result<Vec<Weight>> {
    Ok(quantize_tiles_batch(ws, true, true)?
        .into_iter()
        .map(|(codes, codes_t)| Weight {
            codes: codes.expect("asked for w's codes"),
            codes_t: codes_t.expect("asked for w^T's codes"),
        })
        .collect())
}

/// Each of `ws` (linear weights `(IN, OUT)`) as an [`Fp8Weight`] holding both passes'
/// orientations, made in one read of the bf16 weight: the codes the forward and the input
/// gradient would each make of it, bit for bit. Weights sharing IN go four to a launch
/// ([`quantize_tiles_batch`]); `None` for a weight the quantisers do not take (its layers then
/// multiply it as they would have).
pub fn quantize_for_both_passes(ws: &[Tensor]) -> Result<Vec<Option<Fp8Weight>>> {
    let mut out: Vec<Option<Fp8Weight>> = vec![None; ws.len()];
    let mut by_in: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        if !super::takes(w) {
            continue;
        }
        let inp = w.dim(0)?;
        match by_in.iter_mut().find(|(k, _)| *k == inp) {
            Some((_, group)) => group.push(i),
            None => by_in.push((inp, vec![i])),
        }
    }
    for (_, group) in by_in {
        for launch in group.chunks(TILE_BATCH) {
            let batch: Vec<&Tensor> = launch.iter().map(|&i| &ws[i]).collect();
            for (&i, (codes, codes_t)) in
                launch.iter().zip(quantize_tiles_batch(&batch, true, true)?)
            {
                let (codes, codes_t) = (
                    codes.expect("asked for w's codes"),
                    codes_t.expect("asked for w^T's codes"),
                );
                // The kernel pads each row of w's scales to a multiple of 4; the weight's are
                // [IB][OB] (the backward's operand pads them again).
                let ob = codes.codes.dim(1)?.div_ceil(BLOCK);
                let w = Fp8Weight::new(codes.codes, codes.scales.narrow(1, 0, ob)?)?;
                out[i] = Some(w.with_transposed(Transposed {
                    codes: codes_t.codes,
                    scales: codes_t.scales,
                })?);
            }
        }
    }
    Ok(out)
}

/// [`quantize_tiles`] of each of `ws` (`(IN, OUT_i)` bf16 contiguous, at most [`TILE_BATCH`])
/// in one launch of `fp8_quantize_tiles`, whose grid runs the weights' column tiles side by
/// side.
fn quantize_tiles_batch(
    ws: &[&Tensor],
    want_codes: bool,
    want_codes_t: bool,
) -> Result<Vec<(Option<Operand>, Option<Operand>)>> {
    let first = ws.first().ok_or_else(|| batch_error("no weights"))?;
    if ws.len() > TILE_BATCH {
        return Err(batch_error("more weights than one launch takes"));
    }
    let dev = gpu::device(first)?;
    let _span = kernels::profile::scope_cuda(&dev, Family::Quantisation);
    let inp = first.dim(0)?;
    let ib = inp.div_ceil(BLOCK);
    let ld_fwd = ib.next_multiple_of(4);
    let mut batch = TileBatch {
        count: ws.len() as i32,
        ..TileBatch::default()
    };
    // Every buffer the kernel writes stays alive until the launch has been queued: one dropped
    // before it (a scale the caller does not want) would go back to the allocator while its
    // address sits in the batch, and the next weight's buffers could be handed that memory.
    let mut buffers = Vec::with_capacity(ws.len());
    let mut tiles = 0;
    for (j, w) in ws.iter().enumerate() {
        let (rows, out) = w.dims2()?;
        if rows != inp || !w.is_contiguous() || w.dtype() != DType::BF16 {
            return Err(batch_error("weights of another IN, dtype or layout"));
        }
        let ob = out.div_ceil(BLOCK);
        let ld_bwd = ob.next_multiple_of(4);
        let codes = want_codes
            .then(|| gpu::uninit((inp, out), DType::U8, &dev))
            .transpose()?;
        let codes_t = want_codes_t
            .then(|| gpu::uninit((out, inp), DType::U8, &dev))
            .transpose()?;
        // Every scale, the padding of each row included (zeros), is written by the kernel.
        let scales_fwd = gpu::uninit((ob, ld_fwd), DType::F32, &dev)?;
        let scales_bwd = gpu::uninit((ib, ld_bwd), DType::F32, &dev)?;
        let address = |t: &Option<Tensor>| t.as_ref().map_or(Ok(0), gpu::ptr);
        batch.w[j] = gpu::ptr(w)?;
        batch.codes[j] = address(&codes)?;
        batch.codes_t[j] = address(&codes_t)?;
        batch.scales_fwd[j] = gpu::ptr(&scales_fwd)?;
        batch.scales_bwd[j] = gpu::ptr(&scales_bwd)?;
        batch.ldw[j] = out as i64;
        batch.cols[j] = out as i32;
        batch.ld_bwd[j] = ld_bwd as i32;
        batch.first_ob[j] = tiles as i32;
        tiles += ob;
        buffers.push((codes, codes_t, scales_fwd, scales_bwd));
    }
    let func = kernel(&dev, "fp8_quantize_tiles")?;
    // SAFETY: each w (IN, OUT_j) bf16 contiguous on this device; its codes, codes_t IN x OUT_j
    // bytes fresh, every one written (or null, never touched), its scales ob_j x ld_fwd and
    // ib x ld_bwd_j f32, every one written (the padding by each row's last tile), all held in
    // `buffers` until the launch is queued (a later free is ordered after the kernel on the
    // stream); the grid's columns are the weights' tiles in order (first_ob); IN and each OUT
    // fit i32 (the callers' takes_weight); arguments in kernel order.
    unsafe {
        func.launch(
            tile_grid(tiles, ib),
            &[&batch, &(inp as i32), &(ld_fwd as i32)],
        )?;
    }
    let operand = |codes: Tensor, scales: Tensor| Operand {
        codes,
        scales,
        mode: ScaleMode::Blk128x128,
    };
    Ok(buffers
        .into_iter()
        .map(|(codes, codes_t, scales_fwd, scales_bwd)| {
            (
                codes.map(|c| operand(c, scales_bwd)),
                codes_t.map(|c| operand(c, scales_fwd)),
            )
        })
        .collect())
}

fn batch_error(what: &str) -> crate::error::ModelError {
    crate::error::ModelError::Candle(candle_core::Error::Msg(format!(
        "FP8: a packed projection's weight quantisation: {what}"
    )))
}

/// `w (IN, OUT)` in 128 x 128 tiles, both orientations.
pub fn quantize_weight(w: &Tensor) -> Result<Weight> {
    let (codes, codes_t) = quantize_tiles(w, true, true)?;
    Ok(Weight {
        codes: codes.expect("asked for w's codes"),
        codes_t: codes_t.expect("asked for w^T's codes"),
    })
}

/// `w (IN, OUT)` in 128 x 128 tiles: the codes for the input gradient where `want_codes`,
/// the transposed ones for the forward where `want_codes_t` (a pass reads one of the two).
fn quantize_tiles(
    w: &Tensor,
    want_codes: bool,
    want_codes_t: bool,
) -> Result<(Option<Operand>, Option<Operand>)> {
    let mut one = quantize_tiles_batch(&[w], want_codes, want_codes_t)?;
    Ok(one.pop().expect("one weight in, one out"))
}
