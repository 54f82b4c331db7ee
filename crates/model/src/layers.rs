//! The layers of GPT-2, each as a forward and a backward free function side by side
//! (the layout of llm.c's `train_gpt2.c`).
//!
//! Size letters: `B` batch, `T` sequence length of this batch, `N = B*T` positions,
//! `C` channels (`n_embd`), `NH` heads, `hs = C/NH`, `V` vocabulary.
//!
//! Everything here is built from basic candle [`Tensor`] ops (matmul, broadcasts, reductions,
//! `exp`, `tanh`, `index_select`, ...) and is generic over the float dtype of its inputs. We do
//! not use candle-nn: its fused `layer_norm`/`softmax_last_dim` record no gradient, and here we
//! write every gradient ourselves anyway. Backward functions *return* gradients; they never
//! accumulate into buffers (the caller, ultimately the ZeRO engine, does that).

use candle_core::{DType, Device, Tensor, D};

use crate::error::Result;

/// LayerNorm epsilon (GPT-2's `layer_norm_epsilon`).
pub const LN_EPS: f64 = 1e-5;

// ------------------------------------------------------------------------------------------
// LayerNorm

/// What [`layernorm_forward`] saves for [`layernorm_backward`] (besides the input itself).
#[derive(Clone, Debug)]
pub struct LnSaved {
    /// Per-row mean, `(N, 1)`.
    pub mean: Tensor,
    /// Per-row `1 / sqrt(var + eps)`, `(N, 1)`.
    pub rstd: Tensor,
}

/// `out = (x - mean) * rstd * w + b` over the last dimension.
///
/// Shapes: `x (N, C)`, `w (C)`, `b (C)` -> `out (N, C)`; saves `mean`, `rstd` `(N, 1)`.
pub fn layernorm_forward(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(Tensor, LnSaved)> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    let rstd = var.affine(1.0, LN_EPS)?.sqrt()?.recip()?;
    let out = xc
        .broadcast_mul(&rstd)?
        .broadcast_mul(w)?
        .broadcast_add(b)?;
    Ok((out, LnSaved { mean, rstd }))
}

/// Gradients of [`layernorm_forward`]: returns `(dx (N, C), dw (C), db (C))`.
///
/// Shapes: `dout (N, C)`, `x (N, C)` (the forward input), `w (C)`.
pub fn layernorm_backward(
    dout: &Tensor,
    saved: &LnSaved,
    x: &Tensor,
    w: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    // xhat = (x - mean) * rstd
    let xhat = x.broadcast_sub(&saved.mean)?.broadcast_mul(&saved.rstd)?;
    let db = dout.sum(0)?;
    let dw = (dout * &xhat)?.sum(0)?;
    // out = xhat * w + b
    let dnorm = dout.broadcast_mul(w)?;
    // dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    let m1 = dnorm.mean_keepdim(D::Minus1)?;
    let m2 = (&dnorm * &xhat)?.mean_keepdim(D::Minus1)?;
    let dx = dnorm
        .broadcast_sub(&m1)?
        .sub(&xhat.broadcast_mul(&m2)?)?
        .broadcast_mul(&saved.rstd)?;
    Ok((dx, dw, db))
}

// ------------------------------------------------------------------------------------------
// Linear (HF Conv1D: weight stored (in, out))

/// `out = x @ w + b`.
///
/// Shapes: `x (N, IN)`, `w (IN, OUT)`, `b (OUT)` -> `out (N, OUT)`. Backward needs `x` and `w`.
pub fn matmul_forward(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    Ok(x.matmul(w)?.broadcast_add(b)?)
}

/// Gradients of [`matmul_forward`]: returns `(dx (N, IN), dw (IN, OUT), db (OUT))`.
pub fn matmul_backward(dout: &Tensor, x: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let dx = dout.matmul(&w.t()?)?;
    let dw = x.t()?.matmul(dout)?;
    let db = dout.sum(0)?;
    Ok((dx, dw, db))
}

// ------------------------------------------------------------------------------------------
// GELU, tanh approximation

const GELU_A: f64 = 0.044715;
/// sqrt(2 / pi)
const GELU_S: f64 = 0.797_884_560_802_865_4;

/// `gelu(h) = 0.5 h (1 + tanh(s (h + a h^3)))`, `s = sqrt(2/pi)`, `a = 0.044715`; any shape.
/// Backward needs `h`.
pub fn gelu_forward(h: &Tensor) -> Result<Tensor> {
    // candle's `gelu` is exactly this formula (one fused pass); `gelu_erf` would be the erf form.
    Ok(h.gelu()?)
}

/// Gradient of [`gelu_forward`]: `dh = dout * (0.5 (1 + t) + 0.5 h (1 - t^2) s (1 + 3 a h^2))`
/// with `t = tanh(s (h + a h^3))`.
pub fn gelu_backward(dout: &Tensor, h: &Tensor) -> Result<Tensor> {
    let h2 = h.sqr()?;
    let t = (h * h2.affine(GELU_A, 1.0)?)?.affine(GELU_S, 0.0)?.tanh()?;
    let left = t.affine(0.5, 0.5)?;
    let sech2 = t.sqr()?.affine(-1.0, 1.0)?;
    let dinner = h2.affine(0.5 * 3.0 * GELU_A * GELU_S, 0.5 * GELU_S)?;
    let local = (left + ((h * sech2)? * dinner)?)?;
    Ok((dout * local)?)
}

// ------------------------------------------------------------------------------------------
// Causal multi-head self-attention (the part between c_attn and c_proj)

/// What [`attention_forward`] saves for [`attention_backward`].
#[derive(Clone, Debug)]
pub struct AttSaved {
    /// Queries, keys, values, each `(B, NH, T, hs)`, contiguous.
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// Softmax probabilities `(B, NH, T, T)`, zero above the diagonal.
    pub att: Tensor,
}

/// Additive causal mask `(T, T)`: 0 on and below the diagonal, `-inf` above.
pub fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let m: Vec<f32> = (0..t * t)
        .map(|ij| {
            if ij % t > ij / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Ok(Tensor::from_vec(m, (t, t), device)?.to_dtype(dtype)?)
}

/// `y = softmax(q k^T / sqrt(hs) + mask) v`, heads merged back.
///
/// Shapes: `qkv (B, T, 3C)` with columns `[q | k | v]`, each split into `NH` heads of `hs`
/// (HF GPT2 `split_heads`) -> `y (B, T, C)`. Saves `q, k, v (B, NH, T, hs)` and `att (B, NH, T, T)`.
pub fn attention_forward(qkv: &Tensor, n_head: usize) -> Result<(Tensor, AttSaved)> {
    let (b, t, c3) = qkv.dims3()?;
    let c = c3 / 3;
    let hs = c / n_head;
    // (B, T, 3, NH, hs) -> (3, B, NH, T, hs): one copy, then q/k/v are contiguous views.
    let qkv = qkv
        .reshape((b, t, 3, n_head, hs))?
        .permute((2, 0, 3, 1, 4))?
        .contiguous()?;
    let (q, k, v) = (qkv.get(0)?, qkv.get(1)?, qkv.get(2)?);
    let scale = 1.0 / (hs as f64).sqrt();
    let mask = causal_mask(t, qkv.dtype(), qkv.device())?;
    let preatt = q
        .matmul(&k.t()?)?
        .affine(scale, 0.0)?
        .broadcast_add(&mask)?;
    // Numerically stable softmax over the last dim; the diagonal is never masked, so the max is finite.
    let max = preatt.max_keepdim(D::Minus1)?;
    let e = preatt.broadcast_sub(&max)?.exp()?;
    let att = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))?;
    Ok((y, AttSaved { q, k, v, att }))
}

/// Gradient of [`attention_forward`]: `dy (B, T, C)` -> `dqkv (B, T, 3C)`.
pub fn attention_backward(dy: &Tensor, saved: &AttSaved) -> Result<Tensor> {
    let AttSaved { q, k, v, att } = saved;
    let (b, n_head, t, hs) = q.dims4()?;
    let c = n_head * hs;
    let dy = dy
        .reshape((b, t, n_head, hs))?
        .transpose(1, 2)?
        .contiguous()?;
    // y = att @ v
    let datt = dy.matmul(&v.t()?)?;
    let dv = att.t()?.matmul(&dy)?;
    // att = softmax(preatt): dpreatt = att * (datt - sum(att * datt)); masked entries have att = 0.
    let inner = (att * &datt)?.sum_keepdim(D::Minus1)?;
    let scale = 1.0 / (hs as f64).sqrt();
    let dpreatt = (att * datt.broadcast_sub(&inner)?)?.affine(scale, 0.0)?;
    // preatt = q @ k^T * scale
    let dq = dpreatt.matmul(k)?;
    let dk = dpreatt.t()?.matmul(q)?;
    // (3, B, NH, T, hs) -> (B, T, 3, NH, hs) -> (B, T, 3C), undoing the split.
    Ok(Tensor::stack(&[dq, dk, dv], 0)?
        .permute((1, 3, 0, 2, 4))?
        .reshape((b, t, 3 * c))?)
}

// ------------------------------------------------------------------------------------------
// Embedding

/// `out[b, t] = wte[tokens[b, t]] + wpe[t]`.
///
/// Shapes: `tokens (B, T)` u32, `wte (V, C)`, `wpe (>= T, C)` -> `out (B, T, C)`. Backward needs `tokens`.
pub fn embedding_forward(tokens: &Tensor, wte: &Tensor, wpe: &Tensor) -> Result<Tensor> {
    let (b, t) = tokens.dims2()?;
    let c = wte.dim(1)?;
    let tok = wte
        .index_select(&tokens.flatten_all()?, 0)?
        .reshape((b, t, c))?;
    Ok(tok.broadcast_add(&wpe.narrow(0, 0, t)?)?)
}

/// Gradients of [`embedding_forward`]: returns `(dwte (V, C), dwpe (T_max, C))`, rows of `wpe`
/// at or beyond `T` getting zero. `dout (B, T, C)`.
pub fn embedding_backward(
    dout: &Tensor,
    tokens: &Tensor,
    vocab_size: usize,
    max_t: usize,
) -> Result<(Tensor, Tensor)> {
    let (b, t, c) = dout.dims3()?;
    let (dtype, dev) = (dout.dtype(), dout.device());
    let dout2 = dout.reshape((b * t, c))?;
    let dwte =
        Tensor::zeros((vocab_size, c), dtype, dev)?.index_add(&tokens.flatten_all()?, &dout2, 0)?;
    let mut dwpe = dout.sum(0)?;
    if t < max_t {
        dwpe = Tensor::cat(&[dwpe, Tensor::zeros((max_t - t, c), dtype, dev)?], 0)?;
    }
    Ok((dwte, dwpe))
}

// ------------------------------------------------------------------------------------------
// Tied LM head + cross-entropy

/// Rows of logits handled at once by [`crossentropy_forward_backward`]: about this many elements.
///
/// Chunking bounds the `(rows, V)` temporaries at ~16 MiB in f32. On CPU that is the difference
/// between ~4 fresh 200 MB allocations (each paid again in page faults) and buffers the
/// allocator reuses; on GPU it only bounds memory.
pub const CE_CHUNK_ELEMS: usize = 1 << 22;

/// Mean cross-entropy of `logits = x @ wte^T` against `targets`, optionally with gradients.
///
/// Shapes: `x (N, C)`, `wte (V, C)`, `targets (N)` u32. Returns the loss and, when `grad`, the
/// pair `(dx (N, C), dwte (V, C))` of `d loss`. Stable: `lse = m + log(sum(exp(logits - m)))`
/// with `m` the row max. The softmax runs in f32 for half-precision inputs. Rows are processed
/// in chunks of about [`CE_CHUNK_ELEMS`] logits; nothing of size `(N, V)` is kept.
pub fn crossentropy_forward_backward(
    x: &Tensor,
    wte: &Tensor,
    targets: &Tensor,
    grad: bool,
) -> Result<(f64, Option<(Tensor, Tensor)>)> {
    crossentropy_chunked(x, wte, targets, grad, CE_CHUNK_ELEMS)
}

/// [`crossentropy_forward_backward`] with an explicit chunk size in logits (for benchmarks and tests).
pub fn crossentropy_chunked(
    x: &Tensor,
    wte: &Tensor,
    targets: &Tensor,
    grad: bool,
    chunk_elems: usize,
) -> Result<(f64, Option<(Tensor, Tensor)>)> {
    let (n, _c) = x.dims2()?;
    let v = wte.dim(0)?;
    let dtype = x.dtype();
    let ce_dtype = match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        d => d,
    };
    let inv_n = 1.0 / n as f64;
    let rows = (chunk_elems / v.max(1)).clamp(1, n.max(1));
    let wte_t = wte.t()?;
    let mut loss_sum = Tensor::zeros((), ce_dtype, x.device())?;
    let mut dx_parts = Vec::new();
    let mut dwte = Tensor::zeros(wte.shape(), dtype, wte.device())?;
    for r0 in (0..n).step_by(rows) {
        let r = rows.min(n - r0);
        let xc = x.narrow(0, r0, r)?;
        let tc = targets.narrow(0, r0, r)?.reshape((r, 1))?;
        let logits = xc.matmul(&wte_t)?.to_dtype(ce_dtype)?; // (r, V)
        let max = logits.max_keepdim(1)?;
        let e = logits.broadcast_sub(&max)?.exp()?;
        let sum = e.sum_keepdim(1)?; // (r, 1)
                                     // loss_i = lse_i - logits[i, target_i]
        let lse = (sum.log()? + &max)?;
        loss_sum = (loss_sum + (lse - logits.gather(&tc, 1)?)?.sum_all()?)?;
        if grad {
            // dlogits = (softmax - onehot) / N. The dense softmax part goes through the two
            // matmuls here; the one-hot part is applied after the loop as a gather / scatter of
            // rows of wte and x, so no pass over (r, V) is spent on it.
            let p = e
                .broadcast_mul(&sum.affine(n as f64, 0.0)?.recip()?)?
                .to_dtype(dtype)?;
            dx_parts.push(p.matmul(wte)?);
            dwte = (dwte + p.t()?.matmul(&xc)?)?;
        }
    }
    let loss = loss_sum.to_dtype(DType::F64)?.to_scalar::<f64>()? * inv_n; // NaN if n == 0
    if !grad {
        return Ok((loss, None));
    }
    let dx = if dx_parts.is_empty() {
        x.zeros_like()?
    } else {
        Tensor::cat(&dx_parts, 0)?
    };
    // The one-hot part: dlogits[i, target_i] -= 1/N.
    let dx = (dx - wte.index_select(targets, 0)?.affine(inv_n, 0.0)?)?;
    let dwte = dwte.index_add(targets, &x.affine(-inv_n, 0.0)?, 0)?;
    Ok((loss, Some((dx, dwte))))
}
