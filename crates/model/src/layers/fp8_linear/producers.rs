//! The FP8 layers whose input is made by the kernel before them (issue 40, "the cast fused
//! into the producer"): SwiGLU into the down projection (and its gradient into the gate and up
//! projections' backward), RMSNorm into packed projections, LayerNorm into a layer (GPT-2's
//! ln_1, and ln_2 with c_fc, GELU and c_proj after it), GELU's gradient into c_fc's backward.
//! On the GPU the producer's output exists only as the FP8 codes its kernel writes
//! (`cuda::fused`); elsewhere, or where a kernel declines, the producer runs in bf16 and the
//! layers quantise its output: the same numbers.

use candle_core::Tensor;

use super::{
    cols_backward_saved_of, cols_forward_of, cols_forward_saving_of, linear_forward_saving_of,
    linear_gelu_forward_saving_of, saved_input_of, saved_whole_of, Fp8Input,
};
#[cfg(feature = "cuda")]
use super::{cuda, fp8_shape_error, Fp8Cols};
use crate::error::Result;
use crate::layers::{LnSaved, RmsSaved};
use crate::linears::{LinearWeight, MlpForward, SavedInput};

/// SwiGLU of the packed `gu (N, 2F)` into the down projection: `(residual + act @ w_down when
/// want_out, what down's backward keeps of act)`, `act = silu(gate) * up`. Down's weight
/// gradient scales act a whole column at a time ([`super::whole_columns`]). On the GPU act is
/// never made in bf16: `fp8_quantize_swiglu` writes its 1 x 128 codes from `gu` and reduces its
/// columns' absmax, which is all the backward keeps (SwiGLU's backward kernel makes act^T's
/// codes, [`swiglu_mlp_backward_of`]). Elsewhere [`crate::layers::swiglu_packed_forward`],
/// then [`cols_forward_of`] and [`saved_whole_of`].
pub(crate) fn swiglu_down_forward_of(
    gu: &Tensor,
    w_down: &[LinearWeight],
    residual: Option<&Tensor>,
    want_out: bool,
) -> Result<(Option<Tensor>, Fp8Input)> {
    #[cfg(feature = "cuda")]
    if crate::layers::on_gpu(gu) {
        if let Some((rows, absmax)) = cuda::fused::quantize_swiglu(gu, want_out)? {
            let dims = gu.dims2().map(|(n, f2)| (n, f2 / 2))?;
            let y = match rows {
                Some(xq) => Some(
                    cuda::cols_forward_quantised(&xq, w_down, None, residual)?.ok_or_else(
                        || fp8_shape_error("the down projection of a SwiGLU output", dims),
                    )?,
                ),
                None => None,
            };
            let cols = Fp8Cols::SwigluAbsmax(absmax);
            let dtype = gu.dtype();
            return Ok((y, Fp8Input { dtype, dims, cols }));
        }
    }
    let act = crate::layers::swiglu_packed_forward(gu)?;
    let y = match want_out {
        true => Some(cols_forward_of(&act, w_down, None, residual)?),
        false => None,
    };
    Ok((y, saved_whole_of(&act)?))
}

/// RMSNorm (after the residual add, where `delta` is given) into packed projections: `(h, the
/// norm's statistics, [n @ w_0 | n @ w_1 | ...], what their backward keeps of n)`, `n =
/// rmsnorm(h)`, `h = x + delta` or `x` itself. On the GPU n is never made in bf16: the norm's
/// kernel writes h and the statistics alone, and `fp8_quantize_rmsnorm` makes n's codes from
/// them in one read. Elsewhere [`crate::layers::add_rmsnorm_forward`] or [`crate::layers::rmsnorm_forward`],
/// then [`cols_forward_saving_of`]: the same numbers.
pub(crate) fn rmsnorm_cols_forward_saving_of(
    x: &Tensor,
    delta: Option<&Tensor>,
    norm_w: &Tensor,
    eps: f64,
    ws: &[LinearWeight],
    bias: Option<&Tensor>,
) -> Result<(Tensor, RmsSaved, Tensor, Fp8Input)> {
    #[cfg(feature = "cuda")]
    if crate::layers::on_gpu(x) {
        if let Some((h, rms)) = crate::layers::rmsnorm::rmsnorm_statistics(x, delta, norm_w, eps)? {
            if let Some((nq, nt)) = cuda::fused::quantize_rmsnorm(&h, &rms.rstd, norm_w)? {
                let dims = h.dims2()?;
                let y = cuda::cols_forward_quantised(&nq, ws, bias, None)?
                    .ok_or_else(|| fp8_shape_error("the projections after an RMSNorm", dims))?;
                let cols = Fp8Cols::Codes(nt);
                let dtype = x.dtype();
                return Ok((h, rms, y, Fp8Input { dtype, dims, cols }));
            }
        }
    }
    let (h, n, rms) = match delta {
        Some(d) => crate::layers::add_rmsnorm_forward(x, d, norm_w, eps)?,
        None => {
            let (n, rms) = crate::layers::rmsnorm_forward(x, norm_w, eps)?;
            (x.clone(), n, rms)
        }
    };
    let (y, kept) = cols_forward_saving_of(&n, ws, bias, None)?;
    Ok((h, rms, y, kept))
}

/// LayerNorm into a linear layer with a bias (GPT-2's ln_1 into c_attn, ln_2 into c_fc with
/// GELU after it): `(the norm's statistics, h = n @ w + b, gelu(h) where gelu, what the layer's
/// backward keeps of n)`, `n = layernorm(x)`. On the GPU n is never made in bf16: the norm's
/// kernel writes its statistics alone and `fp8_quantize_layernorm` makes n's codes from x and
/// them in one read. Elsewhere [`crate::layers::layernorm_forward`], then [`linear_forward_saving_of`]
/// or [`linear_gelu_forward_saving_of`]: the same numbers.
pub(crate) fn layernorm_linear_forward_saving_of(
    x: &Tensor,
    (ln_w, ln_b): (&Tensor, &Tensor),
    w: &LinearWeight,
    b: &Tensor,
    gelu: bool,
) -> Result<(LnSaved, Tensor, Option<Tensor>, Fp8Input)> {
    #[cfg(feature = "cuda")]
    if crate::layers::on_gpu(x) {
        if let Some((ln, nq, n)) = layernorm_quantised(x, (ln_w, ln_b))? {
            let h = cuda::cols_forward_quantised(&nq, std::slice::from_ref(w), Some(b), None)?
                .ok_or_else(|| fp8_shape_error("the projection after a LayerNorm", n.dims))?;
            let g = gelu.then(|| crate::layers::gelu_forward(&h)).transpose()?;
            return Ok((ln, h, g, n));
        }
    }
    let (n, ln) = crate::layers::layernorm_forward(x, ln_w, ln_b)?;
    Ok(match gelu {
        true => {
            let (h, g, kept) = linear_gelu_forward_saving_of(&n, w, b)?;
            (ln, h, Some(g), kept)
        }
        false => {
            let (y, kept) = linear_forward_saving_of(&n, w, b, None)?;
            (ln, y, None, kept)
        }
    })
}

/// GPT-2's MLP after its norm in FP8: `ln_2(x)` into c_fc, its bias and GELU, into c_proj
/// with its bias and the residual `x` (c_proj only where `want_out`: a recomputation never
/// reads the block's output). On the GPU the biases are added in the GEMMs' epilogues, and
/// neither the normalised rows nor `gelu(h)` is made in bf16: [`layernorm_linear_forward_saving_of`]'s
/// quantiser for the first, and `fp8_quantize_gelu`, which reads `h` and writes `gelu(h)`'s
/// codes, for the second. Elsewhere (or where a kernel declines) the same numbers through bf16.
pub(crate) fn layernorm_mlp_forward_of(
    x: &Tensor,
    ln: (&Tensor, &Tensor),
    (w_fc, b_fc): (&LinearWeight, &Tensor),
    (w_proj, b_proj): (&LinearWeight, &Tensor),
    want_out: bool,
) -> Result<MlpForward> {
    #[cfg(feature = "cuda")]
    if crate::layers::on_gpu(x) {
        if let Some((ln, nq, n)) = layernorm_quantised(x, ln)? {
            let dims = x.dims2()?;
            let h =
                cuda::cols_forward_quantised(&nq, std::slice::from_ref(w_fc), Some(b_fc), None)?
                    .ok_or_else(|| fp8_shape_error("the projection after a LayerNorm", dims))?;
            let n = SavedInput::Fp8(n);
            if let Some((gq, gt)) = cuda::fused::quantize_gelu(&h, want_out)? {
                let g_dims = h.dims2()?;
                let out = match gq {
                    Some(gq) => {
                        let ws = std::slice::from_ref(w_proj);
                        Some(
                            cuda::cols_forward_quantised(&gq, ws, Some(b_proj), Some(x))?
                                .ok_or_else(|| fp8_shape_error("GELU's output", g_dims))?,
                        )
                    }
                    None => None,
                };
                let cols = Fp8Cols::Codes(gt);
                let g = SavedInput::Fp8(Fp8Input {
                    dtype: h.dtype(),
                    dims: g_dims,
                    cols,
                });
                return Ok(MlpForward { ln, h, n, out, g });
            }
            let g = crate::layers::gelu_forward(&h)?;
            let (out, g) = gelu_proj_of(x, &g, (w_proj, b_proj), want_out)?;
            return Ok(MlpForward { ln, h, n, out, g });
        }
    }
    let (ln, h, g, n) = layernorm_linear_forward_saving_of(x, ln, w_fc, b_fc, true)?;
    let g = g.expect("asked for gelu(h)");
    let (out, g) = gelu_proj_of(x, &g, (w_proj, b_proj), want_out)?;
    Ok(MlpForward {
        ln,
        h,
        n: SavedInput::Fp8(n),
        out,
        g,
    })
}

/// c_proj of a bf16 `gelu(h)` with its bias and the residual `x` where `want_out`, and what
/// its backward keeps of `gelu(h)`.
fn gelu_proj_of(
    x: &Tensor,
    g: &Tensor,
    (w, b): (&LinearWeight, &Tensor),
    want_out: bool,
) -> Result<(Option<Tensor>, SavedInput)> {
    Ok(match want_out {
        true => {
            let (out, kept) = linear_forward_saving_of(g, w, b, Some(x))?;
            (Some(out), SavedInput::Fp8(kept))
        }
        false => (None, SavedInput::Fp8(saved_input_of(g)?)),
    })
}

/// The normalised rows of `layernorm(x)` as FP8 codes made from `x` and the norm's statistics
/// (`fp8_quantize_layernorm`): `(the statistics, the 1 x 128 blocks, what a layer's backward
/// keeps)`, or `None` where a kernel declines.
#[cfg(feature = "cuda")]
fn layernorm_quantised(
    x: &Tensor,
    (ln_w, ln_b): (&Tensor, &Tensor),
) -> Result<Option<(LnSaved, cuda::Operand, Fp8Input)>> {
    let Some(ln) = crate::layers::layernorm::layernorm_statistics(x, ln_w, ln_b)? else {
        return Ok(None);
    };
    let quantised = cuda::fused::quantize_layernorm(x, &ln.mean, &ln.rstd, ln_w, ln_b)?;
    Ok(match quantised {
        Some((nq, nt)) => {
            let cols = Fp8Cols::Codes(nt);
            let (dtype, dims) = (x.dtype(), x.dims2()?);
            Some((ln, nq, Fp8Input { dtype, dims, cols }))
        }
        None => None,
    })
}

/// The backward of a Llama MLP from the residual gradient `dout (N, C)`: down, SwiGLU and
/// the gate|up projection before it, `(dn2, dw_down, [dw_gate_up])`, from the packed `gu (N,
/// 2F)`, what down kept of act ([`swiglu_down_forward_of`]) and what gate|up kept of its input
/// `n2` (`gate_up` is its one packed weight `(C, 2F)`; the halves as two weights take the
/// unfused path). On the GPU neither dgu nor act is made in bf16: `dact = dout @ w_down^T`
/// (dout quantised with its whole columns' scales for down's weight gradient), then
/// `fp8_quantize_swiglu_grad` writes dgu's codes both ways and act^T's from `dact` and `gu`,
/// then down's weight gradient and gate|up's GEMMs. Elsewhere [`cols_backward_saved_of`] of
/// down, [`crate::layers::swiglu_packed_backward`], then [`cols_backward_saved_of`] of gate|up:
/// the same numbers.
pub(crate) fn swiglu_mlp_backward_of(
    dout: &Tensor,
    gu: &Tensor,
    (act, n2): (&Fp8Input, &Fp8Input),
    (w_down, gate_up): (&LinearWeight, &[LinearWeight]),
    (down_into, gate_up_into): (Option<Tensor>, &[Option<Tensor>]),
) -> Result<(Tensor, Tensor, Vec<Tensor>)> {
    #[cfg(feature = "cuda")]
    if let Fp8Cols::SwigluAbsmax(absmax) = &act.cols {
        let (_, f) = act.dims;
        let (dact, dt) = cuda::input_grad_whole(dout, w_down, f)?
            .ok_or_else(|| fp8_shape_error("the down projection's input", act.dims))?;
        let fused = cuda::fused::quantize_swiglu_grad(&dact, gu, Some(absmax))?;
        let (dgu, act_t) = match fused {
            Some(cuda::fused::SwigluGrad {
                dgu,
                act_t: Some(act_t),
            }) => (Some(dgu), act_t),
            // F not a multiple of 128: act from gu in bf16, its codes with the forward's scales.
            _ => {
                let a = crate::layers::swiglu_packed_forward(gu)?;
                (None, cuda::quantize_cols_whole(&a, absmax)?)
            }
        };
        let dw_down = cuda::weight_grad(&dt, &act_t, down_into)?;
        if let (Some(dgu), [_], Fp8Cols::Codes(xt)) = (dgu, gate_up, &n2.cols) {
            let (dn2, dws) =
                cuda::cols_backward_quantised(&[dgu], xt, n2.dims, gate_up, gate_up_into)?
                    .ok_or_else(|| {
                        fp8_shape_error("the gate and up projections' input", n2.dims)
                    })?;
            return Ok((dn2, dw_down, dws));
        }
        let dgu = crate::layers::swiglu_packed_backward(&dact, gu)?;
        let (dn2, dws) = cols_backward_saved_of(&dgu, n2, gate_up, gate_up_into)?;
        return Ok((dn2, dw_down, dws));
    }
    let down = std::slice::from_ref(w_down);
    let (dact, mut dw) = cols_backward_saved_of(dout, act, down, &[down_into])?;
    let dgu = crate::layers::swiglu_packed_backward(&dact, gu)?;
    let (dn2, dws) = cols_backward_saved_of(&dgu, n2, gate_up, gate_up_into)?;
    Ok((dn2, dw.pop().expect("one weight"), dws))
}

/// The backward of GELU and of the layer with a bias before it (GPT-2's c_fc): `(dx, dw, db)`
/// from `dg` (the gradient of `gelu(h)`), the layer's output `h (N, OUT)` and what it kept of
/// its input `x` (`w` its weight `(IN, OUT)`). On the GPU `dh = dg * gelu'(h)` is never made in
/// bf16: `fp8_quantize_gelu_grad` writes its codes from `dg` and `h`, and the bias gradient
/// (`dh`'s column sums) from the same read. Elsewhere [`crate::layers::gelu_backward_bias_grad`]
/// then [`cols_backward_saved_of`].
pub(crate) fn gelu_linear_backward_of(
    dg: &Tensor,
    h: &Tensor,
    x: &Fp8Input,
    w: &LinearWeight,
    into: Option<Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let ws = std::slice::from_ref(w);
    #[cfg(feature = "cuda")]
    if let (true, Fp8Cols::Codes(xt)) = (crate::layers::on_gpu(h), &x.cols) {
        if let Some((dq, dt, db)) = cuda::fused::quantize_gelu_grad(dg, h)? {
            let (dx, mut dws) =
                cuda::cols_backward_quantised(&[(dq, dt)], xt, x.dims, ws, &[into])?.ok_or_else(
                    || fp8_shape_error("the input of the layer before a GELU", x.dims),
                )?;
            return Ok((dx, dws.pop().expect("one weight"), db));
        }
    }
    let (dh, db) = crate::layers::gelu_backward_bias_grad(dg, h)?;
    let (dx, mut dws) = cols_backward_saved_of(&dh, x, ws, &[into])?;
    Ok((dx, dws.pop().expect("one weight"), db))
}
