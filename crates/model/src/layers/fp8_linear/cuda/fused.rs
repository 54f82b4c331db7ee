//! The FP8 quantisers fused into the kernel that makes their tensor (`kernels/cuda/fp8.cu`), for
//! tensors that under FP8 compute only FP8 GEMMs read, so that they are never written in bf16:
//! SwiGLU's output and gradient (`fp8_quantize_swiglu`, `fp8_quantize_swiglu_grad`: the down
//! projection reads `act = silu(gate) * up` only as codes, the gate and up projections `dgu`;
//! down's weight gradient reads `act^T` with one scale a whole column, which the forward
//! reduces and the backward encodes from the gate and up it reads for `dgu`), the
//! norms' outputs (`fp8_quantize_rmsnorm`, `fp8_quantize_layernorm`: the projections after a norm
//! read them only as codes), GELU's output after GPT-2's c_fc (`fp8_quantize_gelu`) and its
//! gradient into c_fc's backward (`fp8_quantize_gelu_grad`, with c_fc's bias gradient). The
//! codes are those of [`super::quantize_both`] (a gradient) or [`super::quantize_input`] (a
//! layer's input: the norms' and GELU's outputs) of the bf16 tensors that `swiglu_packed_forward`,
//! `swiglu_packed_backward`, `rmsnorm_forward`, `layernorm_forward`, `gelu_forward` and
//! `gelu_backward_bias_grad` make,
//! bit for bit (the arithmetic is `swiglu.cuh`'s, `rmsnorm.cuh`'s, `layernorm.cuh`'s and
//! `gelu.cuh`'s, shared with the unfused kernels), which `tests/gpu/fp8_fused.rs` asserts.
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Tensor};
use kernels::launch::Arg;
use kernels::profile::Family;

use super::{kernel, tile_grid, Operand, BLOCK};
use crate::error::Result;
use crate::gemm::ScaleMode;
use crate::gpu;
use crate::layers::fp8_linear::GPU_MULTIPLE;
use crate::layers::gelu::{GELU_A, GELU_S};

/// `(N, F)` of a packed `gu (N, 2F)` the kernels take: bf16, contiguous, 16-byte aligned, N and
/// F multiples of [`GPU_MULTIPLE`] (the GEMMs' sides) within i32.
fn shape(gu: &Tensor) -> Result<Option<(usize, usize)>> {
    let Ok((n, f2)) = gu.dims2() else {
        return Ok(None);
    };
    let f = f2 / 2;
    let fits = gu.dtype() == DType::BF16
        && gu.is_contiguous()
        && f2 % 2 == 0
        && n > 0
        && f > 0
        && n.is_multiple_of(GPU_MULTIPLE)
        && f.is_multiple_of(GPU_MULTIPLE)
        && n <= i32::MAX as usize
        && f2 <= i32::MAX as usize
        && gpu::ptr(gu)? % 16 == 0;
    Ok(fits.then_some((n, f)))
}

/// Fresh outputs of a `(n, f)` matrix quantised both ways, `halves` of them one after the
/// other: row codes `(halves, n, f)` and scales `(halves, ceil(f / 128), n)`, column codes
/// `(halves, f, n)` and their scales in `cols_mode` (`halves` of [`super::transpose_scales`]:
/// 128 x 1 blocks for a gradient, 128 x 128 tiles for a layer's input).
struct Outputs {
    codes: Tensor,
    scales: Tensor,
    codes_t: Tensor,
    scales_t: Tensor,
    cols_mode: ScaleMode,
}

impl Outputs {
    fn new(
        dev: &candle_core::cuda_backend::CudaDevice,
        halves: usize,
        (n, f): (usize, usize),
        cols_mode: ScaleMode,
    ) -> Result<Outputs> {
        let mut scales_t = vec![halves];
        scales_t.extend(super::transpose_scales(cols_mode, n, f));
        Ok(Outputs {
            codes: gpu::uninit((halves, n, f), DType::U8, dev)?,
            scales: gpu::uninit((halves, f.div_ceil(BLOCK), n), DType::F32, dev)?,
            codes_t: gpu::uninit((halves, f, n), DType::U8, dev)?,
            scales_t: gpu::uninit(scales_t, DType::F32, dev)?,
            cols_mode,
        })
    }

    /// Half `h` as the GEMMs' operands: `(rows, cols)` as [`super::quantize_both`] (blocks)
    /// or [`super::quantize_input`] (tiles) returns them.
    fn half(&self, h: usize) -> Result<(Operand, Operand)> {
        let operand = |codes: &Tensor, scales: &Tensor, mode| -> Result<Operand> {
            Ok(Operand {
                codes: codes.get(h)?,
                scales: scales.get(h)?,
                mode,
            })
        };
        Ok((
            operand(&self.codes, &self.scales, ScaleMode::Vec128)?,
            operand(&self.codes_t, &self.scales_t, self.cols_mode)?,
        ))
    }
}

/// The grid over the `(n, f)` tiles of act, a half of dgu, or a norm's output.
fn config(n: usize, f: usize) -> LaunchConfig {
    tile_grid(f.div_ceil(BLOCK), n.div_ceil(BLOCK))
}

/// `act = silu(gate) * up` of the packed `gu (N, 2F)` as the down projection reads it: its
/// 1 x 128 blocks where `rows_blocks` (the forward's operand; a recomputation, which never
/// reads down's output, skips them) and its columns' absmax over the N rows (`(F)` u32, the
/// f32 bits): down's weight gradient scales act^T a whole column at a time, and
/// [`quantize_swiglu_grad`] encodes it with these in the backward, so the forward keeps no
/// codes of it. `None` where `gu` is not one the kernel takes.
pub fn quantize_swiglu(
    gu: &Tensor,
    rows_blocks: bool,
) -> Result<Option<(Option<Operand>, Tensor)>> {
    let Some((n, f)) = shape(gu)? else {
        return Ok(None);
    };
    let dev = gpu::device(gu)?;
    let absmax = Tensor::zeros(f, DType::U32, gu.device())?;
    let _span = kernels::profile::scope_cuda(&dev, Family::Quantisation);
    let out = match rows_blocks {
        true => Some((
            gpu::uninit((n, f), DType::U8, &dev)?,
            gpu::uninit((f.div_ceil(BLOCK), n), DType::F32, &dev)?,
        )),
        false => None,
    };
    let (pc, ps) = match &out {
        Some((c, s)) => (gpu::ptr(c)?, gpu::ptr(s)?),
        None => (0, 0),
    };
    let (pgu, pm, null) = (gpu::ptr(gu)?, gpu::ptr(&absmax)?, 0u64);
    let func = kernel(&dev, "fp8_quantize_swiglu")?;
    // SAFETY: gu (N, 2F) bf16 contiguous and 16-byte aligned, F % 16 == 0 (shape); the row
    // outputs fresh, each written once by the kernel (null ones never touched); the absmax
    // (F) u32 zeroed, max'ed into; no column codes (null); arguments in kernel order.
    unsafe {
        func.launch(
            config(n, f),
            &[&pgu, &pc, &ps, &null, &null, &(n as i32), &(f as i32), &pm],
        )?;
    }
    let rows = out.map(|(codes, scales)| Operand {
        codes,
        scales,
        mode: ScaleMode::Vec128,
    });
    Ok(Some((rows, absmax)))
}

/// SwiGLU's gradient `dgu = [dgate | dup] (N, 2F)` from `dact (N, F)` and `gu (N, 2F)`, in
/// both blockings (`(rows, cols)`, as [`super::quantize_both`] of `dgu`): the packed gate|up
/// projection's dout; and where `act_absmax` is given (the `(F)` absmax [`quantize_swiglu`]
/// reduced in the forward), `act^T`'s codes `(F, N)` with one scale a whole column
/// ([`ScaleMode::Outer`], as [`super::quantize_cols_whole`] of the bf16 act): down's weight
/// gradient operand, from the gate and up the kernel reads anyway. `None` where the kernel does
/// not take the tensors (also where F is not a multiple of 128, so that no block straddles the
/// halves).
pub fn quantize_swiglu_grad(
    dact: &Tensor,
    gu: &Tensor,
    act_absmax: Option<&Tensor>,
) -> Result<Option<SwigluGrad>> {
    let Some((n, f)) = shape(gu)? else {
        return Ok(None);
    };
    let dact_fits = f.is_multiple_of(BLOCK)
        && dact.dtype() == DType::BF16
        && dact.is_contiguous()
        && dact.dims() == [n, f]
        && gpu::ptr(dact)? % 16 == 0
        && act_absmax.is_none_or(|m| m.dtype() == DType::U32 && m.dims() == [f]);
    if !dact_fits {
        return Ok(None);
    }
    let dev = gpu::device(gu)?;
    let _span = kernels::profile::scope_cuda(&dev, Family::Quantisation);
    let out = Outputs::new(&dev, 1, (n, 2 * f), ScaleMode::Vec128)?;
    let act_out = match act_absmax {
        Some(m) => Some((
            m,
            gpu::uninit((f, n), DType::U8, &dev)?,
            gpu::uninit(f, DType::F32, &dev)?,
        )),
        None => None,
    };
    let (pm, pac, pas) = match &act_out {
        Some((m, c, s)) => (gpu::ptr(m)?, gpu::ptr(c)?, gpu::ptr(s)?),
        None => (0, 0, 0),
    };
    let (pd, pgu) = (gpu::ptr(dact)?, gpu::ptr(gu)?);
    let (pc, ps) = (gpu::ptr(&out.codes)?, gpu::ptr(&out.scales)?);
    let (pt, pst) = (gpu::ptr(&out.codes_t)?, gpu::ptr(&out.scales_t)?);
    let func = kernel(&dev, "fp8_quantize_swiglu_grad")?;
    // SAFETY: dact (N, F) and gu (N, 2F) bf16 contiguous and 16-byte aligned, F % 128 == 0;
    // the outputs are dgu's (N, 2F) both ways, fresh, every element written once (each half's
    // tiles by its CTAs), and where asked act^T's (F, N) codes and (F) scales, fresh, written
    // once by the dup CTAs, from the (F) u32 absmax; arguments in kernel order.
    unsafe {
        func.launch(
            config(n, 2 * f),
            &[
                &pd,
                &pgu,
                &pc,
                &ps,
                &pt,
                &pst,
                &(n as i32),
                &(f as i32),
                &pm,
                &pac,
                &pas,
            ],
        )?;
    }
    let act_t = act_out.map(|(_, codes, scales)| Operand {
        codes,
        scales,
        mode: ScaleMode::Outer,
    });
    Ok(Some(SwigluGrad {
        dgu: out.half(0)?,
        act_t,
    }))
}

/// What [`quantize_swiglu_grad`] makes: `dgu`'s codes both ways (`(rows, cols)`), and `act^T`'s
/// with whole columns' scales where the forward's absmax was given.
pub struct SwigluGrad {
    pub dgu: (Operand, Operand),
    pub act_t: Option<Operand>,
}

/// `(N, C)` of a tile quantiser's input `x` (a norm's input, a layer's output), with its
/// per-row statistics `stats` (`N` f32 each) and its per-channel `vectors` (weight, bias: `(C)`
/// bf16 each): every tensor contiguous, the bf16 ones 16-byte aligned, N and C multiples of
/// [`GPU_MULTIPLE`] within i32.
fn tile_shape(
    x: &Tensor,
    stats: &[&Tensor],
    vectors: &[&Tensor],
) -> Result<Option<(usize, usize)>> {
    let Ok((n, c)) = x.dims2() else {
        return Ok(None);
    };
    let bf16_fits = |t: &Tensor| -> Result<bool> {
        Ok(t.dtype() == DType::BF16 && t.is_contiguous() && gpu::ptr(t)? % 16 == 0)
    };
    let mut fits = bf16_fits(x)?
        && n > 0
        && c > 0
        && n.is_multiple_of(GPU_MULTIPLE)
        && c.is_multiple_of(GPU_MULTIPLE)
        && n <= i32::MAX as usize
        && c <= i32::MAX as usize;
    for v in vectors {
        fits = fits && bf16_fits(v)? && v.dims() == [c];
    }
    for s in stats {
        fits = fits && s.dtype() == DType::F32 && s.is_contiguous() && s.elem_count() == n;
    }
    Ok(fits.then_some((n, c)))
}

/// RMSNorm's output `n = bf16(bf16(h * rstd) * w)` of `h (N, C)` with its rows' `rstd (N)` f32
/// and the norm's weight `w (C)`, in both blockings (`(rows, cols)`, as
/// [`super::quantize_input`] of the `n` that `rmsnorm_forward` writes): the input of the
/// projections after the norm; `None` where the kernel does not take the tensors.
pub fn quantize_rmsnorm(
    h: &Tensor,
    rstd: &Tensor,
    w: &Tensor,
) -> Result<Option<(Operand, Operand)>> {
    let Some((n, c)) = tile_shape(h, &[rstd], &[w])? else {
        return Ok(None);
    };
    let args = [gpu::ptr(h)?, gpu::ptr(rstd)?, gpu::ptr(w)?];
    // SAFETY (the launch): h (N, C) and w (C) bf16 contiguous and 16-byte aligned, rstd (N)
    // f32 contiguous (tile_shape); the kernel's arguments are these, then the outputs.
    let (rows, cols) =
        unsafe { quantize_tiles_of(h, "fp8_quantize_rmsnorm", &args, (n, c), INPUT, &[])? };
    Ok(Some((rows.expect("asked for the row blocks"), cols)))
}

/// LayerNorm's output `n = (x - mean) * rstd * w + b` of `x (N, C)` with its rows' `mean` and
/// `rstd` (`N` f32 each) and the norm's weight and bias `(C)`, in both blockings (as
/// [`super::quantize_input`] of the `n` that `layernorm_forward` writes): GPT-2's projections'
/// input after a norm; `None` where the kernel does not take the tensors.
pub fn quantize_layernorm(
    x: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    w: &Tensor,
    b: &Tensor,
) -> Result<Option<(Operand, Operand)>> {
    let Some((n, c)) = tile_shape(x, &[mean, rstd], &[w, b])? else {
        return Ok(None);
    };
    let args = [
        gpu::ptr(x)?,
        gpu::ptr(mean)?,
        gpu::ptr(rstd)?,
        gpu::ptr(w)?,
        gpu::ptr(b)?,
    ];
    // SAFETY (the launch): x (N, C), w and b (C) bf16 contiguous and 16-byte aligned, mean and
    // rstd N f32 contiguous (tile_shape); the kernel's arguments are these, then the outputs.
    let (rows, cols) =
        unsafe { quantize_tiles_of(x, "fp8_quantize_layernorm", &args, (n, c), INPUT, &[])? };
    Ok(Some((rows.expect("asked for the row blocks"), cols)))
}

/// GELU after an FP8 layer (whose GEMM added its bias), `gelu(h)` of `h (N, OUT)` as the next
/// projection reads it: its 1 x 128 blocks where `rows_blocks` (a recomputation, which never
/// reads that projection's output, skips them) and its 128 x 128 tiles of the transpose (what
/// the projection's backward keeps), as [`super::quantize_input`] of the `gelu(h)` that
/// `gelu_forward` writes;
/// `None` where the kernel does not take the tensor.
pub fn quantize_gelu(h: &Tensor, rows_blocks: bool) -> Result<Option<(Option<Operand>, Operand)>> {
    let Some((n, c)) = tile_shape(h, &[], &[])? else {
        return Ok(None);
    };
    let args = [gpu::ptr(h)?];
    let (a, s) = (GELU_A as f32, GELU_S as f32);
    // SAFETY (the launch): h (N, OUT) bf16 contiguous and 16-byte aligned (tile_shape); the
    // kernel's arguments are it, the outputs, then GELU's constants.
    let quantised = unsafe {
        quantize_tiles_of(
            h,
            "fp8_quantize_gelu",
            &args,
            (n, c),
            Want {
                rows_blocks,
                cols_mode: ScaleMode::Blk128x128,
            },
            &[&a, &s],
        )?
    };
    Ok(Some(quantised))
}

/// GELU's backward into the layer before it: `dh = dout * gelu'(h)` of `dout, h (N, OUT)`, in
/// both blockings (`(rows, cols)`, as [`super::quantize_both`] of the `dh` that
/// `gelu_backward_bias_grad` writes: GPT-2's c_fc's dout), and the bias gradient of that layer
/// (`dh`'s column sums, each tile's in the kernel, then the tiles' in order: deterministic, and
/// within f32 rounding of `gelu_backward_bias_grad`'s, which sums in another order); `None`
/// where the kernel does not take the tensors.
pub fn quantize_gelu_grad(dout: &Tensor, h: &Tensor) -> Result<Option<(Operand, Operand, Tensor)>> {
    let Some((n, c)) = tile_shape(h, &[], &[])? else {
        return Ok(None);
    };
    if dout.dims() != h.dims() || !dout.is_contiguous() || dout.dtype() != DType::BF16 {
        return Ok(None);
    }
    if gpu::ptr(dout)? % 16 != 0 {
        return Ok(None);
    }
    let dev = gpu::device(h)?;
    let slices = n.div_ceil(BLOCK);
    let partials = gpu::uninit((slices, c), DType::F32, &dev)?;
    let args = [gpu::ptr(dout)?, gpu::ptr(h)?, gpu::ptr(&partials)?];
    let (a, s) = (GELU_A as f32, GELU_S as f32);
    // SAFETY (the launch): dout and h (N, OUT) bf16 contiguous and 16-byte aligned
    // (tile_shape and the checks above), partials (ceil(N / 128), OUT) f32 fresh, each element
    // written once (a tile's columns by its CTA); the kernel's arguments are these, the
    // outputs, then GELU's constants.
    let (rows, cols) =
        unsafe { quantize_tiles_of(h, "fp8_quantize_gelu_grad", &args, (n, c), DOUT, &[&a, &s])? };
    let db = crate::layers::linear::bias_grad::column_partials_sum(&dev, &partials, slices, c)?;
    Ok(Some((rows.expect("asked for the row blocks"), cols, db)))
}

/// What a fused quantiser writes: the row blocks where `rows_blocks`, and the transpose scaled
/// in `cols_mode` (the kernel's: the norms and GELU write tiles, GELU's gradient blocks).
struct Want {
    rows_blocks: bool,
    cols_mode: ScaleMode,
}

/// A layer's input, both ways: the forward's 1 x 128 blocks, the weight gradient's tiles.
const INPUT: Want = Want {
    rows_blocks: true,
    cols_mode: ScaleMode::Blk128x128,
};
/// A layer's dout, both ways: the input gradient's 1 x 128 blocks, the weight gradient's
/// 128 x 1.
const DOUT: Want = Want {
    rows_blocks: true,
    cols_mode: ScaleMode::Vec128,
};

/// Launches the tile quantiser `name` over `(n, c)` with `inputs` (its leading arguments),
/// then fresh outputs (the row blocks' null unless `want.rows_blocks`), `n`, `c` and `extra`.
///
/// # Safety
/// `inputs` and `extra` are what `name` takes before and after the outputs, the addresses
/// valid for `(n, c)` as it reads and writes them.
unsafe fn quantize_tiles_of(
    x: &Tensor,
    name: &str,
    inputs: &[u64],
    (n, c): (usize, usize),
    want: Want,
    extra: &[&dyn Arg],
) -> Result<(Option<Operand>, Operand)> {
    let dev = gpu::device(x)?;
    let _span = kernels::profile::scope_cuda(&dev, Family::Quantisation);
    let out = Outputs::new(&dev, 1, (n, c), want.cols_mode)?;
    let (pc, ps) = match want.rows_blocks {
        true => (gpu::ptr(&out.codes)?, gpu::ptr(&out.scales)?),
        false => (0, 0),
    };
    let (pt, pst) = (gpu::ptr(&out.codes_t)?, gpu::ptr(&out.scales_t)?);
    let (rows, cols) = (n as i32, c as i32);
    let func = kernel(&dev, name)?;
    let mut args: Vec<&dyn Arg> = inputs.iter().map(|p| p as &dyn Arg).collect();
    let outputs: [&dyn Arg; 6] = [&pc, &ps, &pt, &pst, &rows, &cols];
    args.extend(outputs);
    args.extend_from_slice(extra);
    // SAFETY: the inputs as the caller promises; the outputs fresh, each element written once
    // by the kernel (the row blocks' not at all when null; the tiles' scales with their
    // padding), laid out as `name` writes them (`want.cols_mode` is its kind); arguments in
    // kernel order.
    unsafe { func.launch(config(n, c), &args)? };
    let (rows, cols) = out.half(0)?;
    Ok((want.rows_blocks.then_some(rows), cols))
}
