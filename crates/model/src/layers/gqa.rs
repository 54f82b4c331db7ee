//! Causal grouped-query self-attention (Llama's): `NH` query heads share `KV` key/value heads,
//! query head `h` reading kv head `h / (NH / KV)` (HF `repeat_kv`). `KV = NH` is plain
//! multi-head attention, `KV = 1` multi-query.
//!
//! Size letters: `B` batch, `T` positions, `NH` query heads, `KV` key/value heads,
//! `G = NH / KV` query heads a group, `hs` head size.
//!
//! The layer reads `q, k, v` where one projection wrote them, the packed `qkv (B, T, W)`,
//! `W = (NH + 2 KV) hs` with columns `[q heads | k heads | v heads]`, and its backward writes
//! `dqkv` in the same layout ([`gqa_packed_forward`], [`gqa_packed_backward`]); the functions on
//! separate `q, k, v` pack them first. On the GPU it is cuDNN's fused SDPA with `KV` heads for
//! K and V (crates/model/src/cudnn/), reading and writing the packed buffers in place; the
//! reference (basic candle ops) runs elsewhere and for shapes cuDNN does not take. Flash-style
//! like `attention.rs`: forward saves `qkv`, the output `y` and the per-row log-sum-exp of the
//! scores, and backward recomputes the probabilities from them, so nothing of size
//! `(B, NH, T, T)` outlives a call.
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

/// What [`gqa_packed_forward`] saves for [`gqa_packed_backward`].
#[derive(Clone, Debug)]
pub struct GqaSaved {
    /// The forward's packed input `(B, T, (NH + 2 KV) hs)`.
    pub qkv: Tensor,
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
    sizes(q, k, v, n_head, n_kv_head)?;
    gqa_packed_forward(&Tensor::cat(&[q, k, v], 2)?, n_head, n_kv_head)
}

/// [`gqa_attention_forward`] on the packed `qkv (B, T, (NH + 2 KV) hs)` -> `y (B, T, NH hs)`.
/// Saves `qkv`, `y` and `lse (B, NH, T)`. An error if the heads do not divide as
/// [`gqa_attention_forward`] says or `qkv`'s width is not `(NH + 2 KV) hs`.
pub fn gqa_packed_forward(
    qkv: &Tensor,
    n_head: usize,
    n_kv_head: usize,
) -> Result<(Tensor, GqaSaved)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(qkv) {
        let _span = kernels::profile::scope(qkv.device(), kernels::profile::Family::Attention);
        if let Some(r) = cuda::forward(qkv, n_head, n_kv_head)? {
            return Ok(r);
        }
        super::attention_declined("gqa::forward", qkv)?;
    }
    let (q, k, v) = split(qkv, n_head, n_kv_head)?;
    let (q, k, v) = (&q, &k, &v);
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
        qkv: qkv.clone(),
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
    let dqkv = gqa_packed_backward(dy, saved)?;
    split(&dqkv, saved.n_head, saved.n_kv_head)
}

/// Gradients of [`gqa_packed_forward`]: `dy (B, T, NH hs)` -> `dqkv (B, T, (NH + 2 KV) hs)`,
/// the packed layout of the forward's input, `dk` and `dv` summed over the query heads of
/// their group. Returned, not accumulated.
pub fn gqa_packed_backward(dy: &Tensor, saved: &GqaSaved) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(dy) {
        let _span = kernels::profile::scope(dy.device(), kernels::profile::Family::Attention);
        if let Some(r) = cuda::backward(dy, saved)? {
            return Ok(r);
        }
        super::attention_declined("gqa::backward", dy)?;
    }
    let GqaSaved {
        qkv,
        lse,
        n_head,
        n_kv_head,
        ..
    } = saved;
    let (n_head, kv) = (*n_head, *n_kv_head);
    let (q, k, v) = split(qkv, n_head, kv)?;
    let (q, k, v) = (&q, &k, &v);
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
    Ok(Tensor::cat(
        &[ungrouped(&dq, t)?, merge(dk)?, merge(dv)?],
        2,
    )?)
}

/// Why cuDNN does not take the packed `qkv` for `pass` (`Ok(())` when it does): for the GPU
/// tests, which must know that the fused path ran rather than the reference on the GPU.
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn gqa_cudnn_support(
    qkv: &Tensor,
    n_head: usize,
    n_kv_head: usize,
    backward: bool,
) -> Result<std::result::Result<(), String>> {
    cuda::support(qkv, n_head, n_kv_head, backward)
}

/// `qkv (B, T, (NH + 2 KV) hs)` -> `(q (B, T, NH hs), k, v (B, T, KV hs))`, contiguous.
fn split(qkv: &Tensor, n_head: usize, n_kv_head: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, t, w) = qkv.dims3()?;
    let heads = n_head + 2 * n_kv_head;
    if n_head == 0 || n_kv_head == 0 || w % heads != 0 {
        return Err(ModelError::Shape {
            field: "n_kv_head",
            reason: format!(
                "a packed qkv of {w} channels does not hold {n_head} query and 2 x {n_kv_head} \
                 key/value heads (b {b}, t {t})"
            ),
        });
    }
    let hs = w / heads;
    let part = |from: usize, heads: usize| -> Result<Tensor> {
        Ok(qkv.narrow(2, from * hs, heads * hs)?.contiguous()?)
    };
    Ok((
        part(0, n_head)?,
        part(n_head, n_kv_head)?,
        part(n_head + n_kv_head, n_kv_head)?,
    ))
}

#[cfg(feature = "cuda")]
mod cuda {
    //! cuDNN's fused SDPA with `KV` heads for K and V (crates/model/src/cudnn/), on the packed
    //! `qkv (B, T, W)`: nothing permuted, repeated or copied.
    use super::GqaSaved;
    use crate::error::Result;
    use crate::gpu;
    use candle_core::{DType, Tensor};

    /// The cuDNN shape of a packed `qkv` that suits it: bf16, contiguous, 16-byte aligned,
    /// `hs` a multiple of 8 up to 128, the heads dividing.
    fn shape(qkv: &Tensor, n_head: usize, kv: usize) -> Result<Option<crate::cudnn::Shape>> {
        if qkv.dtype() != DType::BF16 || !qkv.is_contiguous() || n_head == 0 || kv == 0 {
            return Ok(None);
        }
        let (b, t, w) = qkv.dims3()?;
        let heads = n_head + 2 * kv;
        if !w.is_multiple_of(heads) || !n_head.is_multiple_of(kv) || b == 0 || t == 0 {
            return Ok(None);
        }
        let hs = w / heads;
        if !crate::kernel_plan::cudnn_takes_head_size(hs) || !gpu::ptr(qkv)?.is_multiple_of(16) {
            return Ok(None);
        }
        Ok(Some(crate::cudnn::Shape {
            batch: b,
            heads: n_head,
            kv_heads: kv,
            seq: t,
            head_size: hs,
        }))
    }

    pub(super) fn support(
        qkv: &Tensor,
        n_head: usize,
        n_kv_head: usize,
        backward: bool,
    ) -> Result<std::result::Result<(), String>> {
        let Some(s) = shape(qkv, n_head, n_kv_head)? else {
            return Ok(Err("the input's dtype, layout or head size".into()));
        };
        let pass = if backward {
            crate::cudnn::Pass::Backward
        } else {
            crate::cudnn::Pass::Forward
        };
        crate::cudnn::support(&gpu::device(qkv)?, pass, s)
    }

    pub(super) fn forward(
        qkv: &Tensor,
        n_head: usize,
        n_kv_head: usize,
    ) -> Result<Option<(Tensor, GqaSaved)>> {
        let Some(s) = shape(qkv, n_head, n_kv_head)? else {
            return Ok(None);
        };
        let dev = gpu::device(qkv)?;
        let y = gpu::uninit((s.batch, s.seq, n_head * s.head_size), DType::BF16, &dev)?;
        let lse = gpu::uninit((s.batch, n_head, s.seq), DType::F32, &dev)?;
        let args = crate::cudnn::ForwardArgs {
            qkv: gpu::ptr(qkv)?,
            y: gpu::ptr(&y)?,
            lse: gpu::ptr(&lse)?,
        };
        if !crate::cudnn::forward(&dev, s, &args)? {
            return Ok(None);
        }
        let saved = GqaSaved {
            qkv: qkv.clone(),
            y: y.clone(),
            lse,
            n_head,
            n_kv_head,
        };
        Ok(Some((y, saved)))
    }

    pub(super) fn backward(dy: &Tensor, saved: &GqaSaved) -> Result<Option<Tensor>> {
        let Some(s) = shape(&saved.qkv, saved.n_head, saved.n_kv_head)? else {
            return Ok(None);
        };
        let c = saved.n_head * s.head_size;
        let (b, t) = (s.batch, s.seq);
        let takes = dy.dtype() == DType::BF16
            && saved.y.dtype() == DType::BF16
            && saved.lse.dtype() == DType::F32
            && dy.dims() == [b, t, c]
            && saved.y.dims() == [b, t, c]
            && saved.lse.dims() == [b, saved.n_head, t]
            && dy.is_contiguous()
            && saved.y.is_contiguous()
            && saved.lse.is_contiguous();
        if !takes {
            return Ok(None);
        }
        let (p_dy, p_y) = (gpu::ptr(dy)?, gpu::ptr(&saved.y)?);
        if (p_dy | p_y) % 16 != 0 {
            return Ok(None);
        }
        let dev = gpu::device(dy)?;
        let dqkv = gpu::uninit((b, t, s.row()), DType::BF16, &dev)?;
        let args = crate::cudnn::BackwardArgs {
            qkv: gpu::ptr(&saved.qkv)?,
            y: p_y,
            lse: gpu::ptr(&saved.lse)?,
            dy: p_dy,
            dqkv: gpu::ptr(&dqkv)?,
        };
        if !crate::cudnn::backward(&dev, s, &args)? {
            return Ok(None);
        }
        Ok(Some(dqkv))
    }
}
