//! Causal grouped-query self-attention (Llama's): `NH` query heads share `KV` key/value heads,
//! query head `h` reading kv head `h / (NH / KV)` (HF `repeat_kv`). `KV = NH` is plain
//! multi-head attention, `KV = 1` multi-query.
//!
//! Size letters: `B` batch, `T` positions, `NH` query heads, `KV` key/value heads,
//! `G = NH / KV` query heads a group, `hs` head size.
//!
//! This is the reference (basic candle ops; it runs on any device, CUDA included, and is what
//! the GPU runs until kernels are written). Flash-style like `attention.rs`: forward saves
//! `q, k, v`, the output `y` and the per-row log-sum-exp of the scores, and backward recomputes
//! the probabilities from them, so nothing of size `(B, NH, T, T)` outlives a call.
//!
//! The grouping is a reshape, never a copy of k or v: the `G` query heads of a group are stacked
//! along the rows, `(B, KV, G*T, hs)`, against their group's `(B, KV, T, hs)`, so that the
//! backward's `dk`, `dv` come out of one matmul already summed over the group.
//!
//! Precision: the score and output matmuls run in the input dtype; the scaling, mask and
//! softmax in f32 (f64 for f64 inputs), the probabilities cast back for `att @ v`, as HF's
//! eager attention does (`softmax(..., dtype=torch.float32).to(query.dtype)`).

use candle_core::{Tensor, D};

use super::attention::causal_mask;
use super::rmsnorm::stat_dtype;
use crate::error::{ModelError, Result};

/// What [`gqa_attention_forward`] saves for [`gqa_attention_backward`].
#[derive(Clone, Debug)]
pub struct GqaSaved {
    /// The forward's queries `(B, T, NH*hs)`.
    pub q: Tensor,
    /// The forward's keys and values `(B, T, KV*hs)`.
    pub k: Tensor,
    pub v: Tensor,
    /// The forward's output `(B, T, NH*hs)`.
    pub y: Tensor,
    /// `lse[b, h, t] = log(sum_s exp(score[t, s]))` over the causal row, `(B, NH, T)`: f32
    /// (f64 for f64 inputs).
    pub lse: Tensor,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
}

/// `(B, T, H*hs)` -> `(B, H, T, hs)`, contiguous.
fn heads(x: &Tensor, h: usize) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    Ok(x.reshape((b, t, h, c / h))?.transpose(1, 2)?.contiguous()?)
}

/// Queries `(B, T, NH*hs)` -> `(B, KV, G*T, hs)`: head `h = kv*G + g` at rows `g*T..(g+1)*T`.
fn grouped(q: &Tensor, kv: usize, g: usize) -> Result<Tensor> {
    let (b, t, c) = q.dims3()?;
    let hs = c / (kv * g);
    Ok(q.reshape((b, t, kv, g, hs))?
        .permute((0, 2, 3, 1, 4))?
        .contiguous()?
        .reshape((b, kv, g * t, hs))?)
}

/// `(B, KV, G*T, hs)` -> `(B, T, NH*hs)`: undoes [`grouped`].
fn ungrouped(x: &Tensor, t: usize) -> Result<Tensor> {
    let (b, kv, gt, hs) = x.dims4()?;
    let g = gt / t;
    Ok(x.reshape((b, kv, g, t, hs))?
        .permute((0, 3, 1, 2, 4))?
        .contiguous()?
        .reshape((b, t, kv * g * hs))?)
}

/// Scaled, masked scores `q k^T / sqrt(hs) + mask` in the statistics' dtype, `(B, KV, G, T, T)`.
fn scores(qg: &Tensor, k: &Tensor, g: usize) -> Result<Tensor> {
    let (b, kv, gt, hs) = qg.dims4()?;
    let t = gt / g;
    let sd = stat_dtype(qg.dtype());
    let mask = causal_mask(t, sd, qg.device())?;
    Ok(qg
        .matmul(&k.t()?)?
        .to_dtype(sd)?
        .affine(1.0 / (hs as f64).sqrt(), 0.0)?
        .reshape((b, kv, g, t, t))?
        .broadcast_add(&mask)?)
}

/// Checks the heads and shapes; returns `(B, T, hs, G)`.
fn sizes(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    n_head: usize,
    n_kv_head: usize,
) -> Result<(usize, usize, usize, usize)> {
    let (b, t, c) = q.dims3()?;
    if n_kv_head == 0
        || n_head == 0
        || !n_head.is_multiple_of(n_kv_head)
        || !c.is_multiple_of(n_head)
    {
        return Err(ModelError::Shape {
            field: "n_kv_head",
            reason: format!("{n_head} query heads of {c} channels in {n_kv_head} kv groups"),
        });
    }
    let hs = c / n_head;
    for x in [k, v] {
        if x.dims() != [b, t, n_kv_head * hs] {
            return Err(ModelError::ShapeMismatch {
                what: "gqa k, v",
                expected: vec![b, t, n_kv_head * hs],
                got: x.dims().to_vec(),
            });
        }
    }
    Ok((b, t, hs, n_head / n_kv_head))
}

/// `y = softmax(q k^T / sqrt(hs) + mask) v` per query head, each reading its group's k and v,
/// heads merged back.
///
/// Shapes: `q (B, T, NH*hs)`, `k, v (B, T, KV*hs)` -> `y (B, T, NH*hs)`. Saves `q, k, v, y`
/// and `lse (B, NH, T)`.
/// An error if `n_kv_head` does not divide `n_head`, `n_head` does not divide `q`'s channels,
/// or `k` or `v` is not `(B, T, KV*hs)`.
pub fn gqa_attention_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    n_head: usize,
    n_kv_head: usize,
) -> Result<(Tensor, GqaSaved)> {
    let (b, t, _, g) = sizes(q, k, v, n_head, n_kv_head)?;
    let qg = grouped(q, n_kv_head, g)?;
    let (kh, vh) = (heads(k, n_kv_head)?, heads(v, n_kv_head)?);
    let preatt = scores(&qg, &kh, g)?;
    // Numerically stable softmax over the last dim; the diagonal is never masked, so the max is finite.
    let max = preatt.max_keepdim(D::Minus1)?;
    let e = preatt.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let att = e.broadcast_div(&sum)?.to_dtype(q.dtype())?;
    // (B, KV, G, T, 1) -> (B, NH, T): h = kv*G + g.
    let lse = (sum.log()? + max)?.reshape((b, n_head, t))?;
    let y = att.reshape((b, n_kv_head, g * t, t))?.matmul(&vh)?;
    let y = ungrouped(&y, t)?;
    let saved = GqaSaved {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        y: y.clone(),
        lse,
        n_head,
        n_kv_head,
    };
    Ok((y, saved))
}

/// Gradients of [`gqa_attention_forward`]: `dy (B, T, NH*hs)` -> `(dq (B, T, NH*hs),
/// dk (B, T, KV*hs), dv (B, T, KV*hs))`, `dk` and `dv` summed over the `G` query heads that
/// share them. The probabilities are recomputed from `lse`. Returned, not accumulated.
pub fn gqa_attention_backward(dy: &Tensor, saved: &GqaSaved) -> Result<(Tensor, Tensor, Tensor)> {
    let GqaSaved {
        q,
        k,
        v,
        lse,
        n_head,
        n_kv_head,
        ..
    } = saved;
    let (n_head, kv) = (*n_head, *n_kv_head);
    let (b, t, hs, g) = sizes(q, k, v, n_head, kv)?;
    let dtype = q.dtype();
    let qg = grouped(q, kv, g)?;
    let (kh, vh) = (heads(k, kv)?, heads(v, kv)?);
    // att = exp(preatt - lse): the forward's softmax; masked entries give exp(-inf) = 0.
    let lse = lse.reshape((b, kv, g, t, 1))?;
    let att = scores(&qg, &kh, g)?.broadcast_sub(&lse)?.exp()?; // (B, KV, G, T, T)
    let att_lo = att.to_dtype(dtype)?.reshape((b, kv, g * t, t))?;
    let dyg = grouped(dy, kv, g)?; // (B, KV, G*T, hs)
                                   // y = att @ v: dv sums the G query heads of a group (the rows G*T)
    let datt = dyg
        .matmul(&vh.t()?)?
        .to_dtype(att.dtype())?
        .reshape((b, kv, g, t, t))?;
    let dv = att_lo.t()?.matmul(&dyg)?; // (B, KV, T, hs)
                                        // att = softmax(preatt): dpreatt = att * (datt - sum(att * datt)); masked entries have att = 0.
    let inner = (&att * &datt)?.sum_keepdim(D::Minus1)?;
    let scale = 1.0 / (hs as f64).sqrt();
    let dpreatt = (&att * datt.broadcast_sub(&inner)?)?
        .affine(scale, 0.0)?
        .to_dtype(dtype)?
        .reshape((b, kv, g * t, t))?;
    // preatt = q @ k^T * scale
    let dq = dpreatt.matmul(&kh)?; // (B, KV, G*T, hs)
    let dk = dpreatt.t()?.matmul(&qg)?; // (B, KV, T, hs)
    let merge = |x: Tensor| -> Result<Tensor> {
        Ok(x.transpose(1, 2)?.contiguous()?.reshape((b, t, kv * hs))?)
    };
    Ok((ungrouped(&dq, t)?, merge(dk)?, merge(dv)?))
}
