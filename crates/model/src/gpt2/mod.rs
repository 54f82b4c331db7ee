//! GPT-2's units on one device: forward and backward of the embedding (`wte` and the learned
//! positions `wpe`), one transformer block, the final LayerNorm, and the LM head tied to `wte`
//! with its loss. [`crate::Model`] walks them; nothing outside the crate names them but tests.
//!
//! Size letters: `B` batch, `T` tokens per sequence (`<= cfg.seq_len`), `N = B*T`, `C` = `n_embd`,
//! `NH` = `n_head`, `hs = C/NH`, `V` = `vocab_size`.
//!
//! Each unit's parameters arrive as its flat buffer: a 1-D tensor of length `>= unit.numel`
//! (the ZeRO engine may pad the end), viewed by name through [`UnitLayout`]. Each backward
//! *returns* the unit's flat gradient, 1-D of length exactly `unit.numel`, in the dtype of the
//! parameters; it never accumulates. Accumulating over micro-batches is the engine's job.
//!
//! A block is pre-LayerNorm GPT-2:
//! `x2 = x + c_proj(attn(c_attn(ln_1(x))))`, `out = x2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x2))))`.

pub mod family;
use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::decode::{cached_attention, check_one_sequence, LayerCache};
use crate::error::{ModelError, Result};
use crate::layers::{
    attention_backward, attention_forward, layernorm_backward, layernorm_forward, matmul_forward,
    matmul_gelu_forward, residual_matmul_forward, AttSaved, LnSaved, Loss, TokenIndex,
};
use crate::layout::{UnitKind, UnitLayout};
use crate::linears::{LinearFormat, SavedInput};
use crate::recompute::Recompute;
use crate::schedule::UnitParams;
use crate::units::{self, check_acts, check_params, check_tokens, flatten_grads, FlatGrad, Kept};

// ------------------------------------------------------------------------------------------
// Embedding unit

/// `out (B, T, C) = wte[tokens] + wpe[:T]` from the embedding unit's flat `params` and
/// `tokens (B, T)` u32: the unit's forward around the layer's
/// [`layers::embedding_forward`](crate::layers::embedding_forward).
pub fn embedding_unit_forward(
    cfg: &ModelConfig,
    params: &Tensor,
    tokens: &Tensor,
) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Embedding, 0);
    check_params(params, &unit, "embedding")?;
    check_tokens(cfg, tokens, "tokens")?;
    let wte = unit.param("wte.weight").view(params)?;
    let wpe = unit.param("wpe.weight").view(params)?;
    crate::layers::embedding_forward(tokens, &wte, &wpe)
}

/// Flat gradient of the embedding unit (`wte` rows scattered from `dout (B, T, C)`, `wpe` rows
/// `0..T` summed over the batch, the rest zero). Dtype of `dout`. Returned, not accumulated.
pub fn embedding_unit_backward(
    cfg: &ModelConfig,
    tokens: &TokenIndex,
    dout: &Tensor,
    onto: Option<Tensor>,
) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Embedding, 0);
    let (b, t) = check_tokens(cfg, tokens.tokens(), "tokens")?;
    if dout.dims() != [b, t, cfg.n_embd] {
        return Err(ModelError::ShapeMismatch {
            what: "embedding dout",
            expected: vec![b, t, cfg.n_embd],
            got: dout.dims().to_vec(),
        });
    }
    // Onto the tied head's gradient where given: its token rows by the kernel, in place, its
    // position rows (the head's are zero) added here.
    let (onto_wte, onto_wpe) = match onto {
        Some(o) => {
            let (wte, wpe) = (unit.param("wte.weight"), unit.param("wpe.weight"));
            (Some(wte.view(&o)?), Some(wpe.view(&o)?))
        }
        None => (None, None),
    };
    let (dwte, dwpe) = crate::layers::embedding_backward_onto(
        dout,
        tokens,
        cfg.vocab_size,
        cfg.seq_len,
        onto_wte,
    )?;
    let dwpe = match onto_wpe {
        Some(o) => (o + dwpe)?,
        None => dwpe,
    };
    flatten_grads(&unit, vec![("wte.weight", dwte), ("wpe.weight", dwpe)])
}

// ------------------------------------------------------------------------------------------
// Transformer block

/// Every activation a block's backward reads. `N = B*T`.
#[derive(Clone, Debug)]
struct BlockActs {
    /// Block input `(B, T, C)`.
    x: Tensor,
    /// `ln_1(x)` `(N, C)` as c_attn's backward reads it (FP8: its column blocks alone), and
    /// the norm's statistics.
    ln1: SavedInput,
    ln1_saved: LnSaved,
    /// Attention's input `qkv`, output `y (B, T, C)` (heads merged) and row log-sum-exps.
    att: AttSaved,
    /// Residual after attention, `(N, C)`.
    x2: Tensor,
    /// `ln_2(x2)` `(N, C)` as c_fc's backward reads it, and the norm's statistics.
    ln2: SavedInput,
    ln2_saved: LnSaved,
    /// `c_fc` output (pre-GELU) `(N, 4C)`, and after GELU as mlp.c_proj's backward reads it:
    /// both come out of one GEMM on the GPU in bf16, and backward reads both (recomputing
    /// `gelu(h)` would cost a pass over `(N, 4C)`); under FP8 `gelu(h)` is kept as its column
    /// blocks.
    h: Tensor,
    hg: SavedInput,
}

/// What [`block_forward`] keeps for [`block_backward`]: every `BlockActs`, or the block's
/// input `(B, T, C)` alone, the rest recomputed. (GPT-2's block keeps no MLP half apart:
/// [`Recompute::Attention`] is refused.)
#[derive(Clone, Debug)]
pub struct BlockSaved(Kept<BlockActs, ()>);

impl BlockSaved {
    /// What was kept: everything, or the input alone.
    pub fn recompute(&self) -> Recompute {
        self.0.mode()
    }
}

/// Forward of one block, keeping every activation: the block's output too when `want_out`.
/// Backward's recomputation does not want it: the MLP's projection, a third of the block's
/// forward FLOPs, feeds only the output, which backward never reads.
fn block_forward_full(
    cfg: &ModelConfig,
    lin: LinearFormat,
    params: &UnitParams,
    x: &Tensor,
    want_out: bool,
) -> Result<(Option<Tensor>, BlockActs)> {
    let unit = UnitLayout::new(cfg, UnitKind::Block(0), 0);
    let flat = params.flat();
    check_params(flat, &unit, "block")?;
    let (b, t) = check_acts(cfg, x, "block input")?;
    let c = cfg.n_embd;
    let p = |name: &str| unit.param(name).view(flat);
    let lw = |name: &str| params.linear(unit.param(name));
    let xf = x.reshape((b * t, c))?;
    // ln_1 into c_attn (under FP8 its output exists only as the layer's codes)
    let ln_1 = (&p("ln_1.weight")?, &p("ln_1.bias")?);
    let (w, bias) = (lw("attn.c_attn.weight")?, p("attn.c_attn.bias")?);
    let (ln1_saved, qkv, ln1) = lin.layernorm_linear_forward(&xf, ln_1, &w, &bias)?;
    let (y, att) = attention_forward(&qkv.reshape((b, t, 3 * c))?, cfg.n_head)?;
    let y = y.reshape((b * t, c))?;
    let x2 = lin.residual_forward(&xf, &y, &lw("attn.c_proj.weight")?, &p("attn.c_proj.bias")?)?;
    // ln_2 into c_fc and GELU, into c_proj with the residual (c_proj only where the output is
    // wanted: a recomputation never reads it)
    let ln_2 = (&p("ln_2.weight")?, &p("ln_2.bias")?);
    let fc = (&lw("mlp.c_fc.weight")?, &p("mlp.c_fc.bias")?);
    let proj = (&lw("mlp.c_proj.weight")?, &p("mlp.c_proj.bias")?);
    let mlp = lin.layernorm_mlp_forward(&x2, ln_2, fc, proj, want_out)?;
    let out = mlp.out.map(|o| o.reshape((b, t, c))).transpose()?;
    let (ln2, ln2_saved, h, hg) = (mlp.n, mlp.ln, mlp.h, mlp.g);
    let acts = BlockActs {
        x: x.clone(),
        ln1,
        ln1_saved,
        att,
        x2,
        ln2,
        ln2_saved,
        h,
        hg,
    };
    Ok((out, acts))
}

/// One transformer block: `x (B, T, C)` -> `out (B, T, C)` from the block's flat `params`.
/// Its four projections multiply in `lin` ([`LinearFormat`]: the compute dtype, or FP8).
///
/// With `recompute` [`Recompute::Full`], [`BlockSaved`] holds only `x` (activation
/// checkpointing) and [`block_backward`] reruns this forward (all of it but the MLP projection,
/// whose output it does not read); gradients are bitwise the same either way.
/// [`Recompute::Attention`] is refused. Without recomputation, it holds `ln1, ln2, x2, y (N,
/// C)`, `qkv (N, 3C)`, `h, gelu(h) (N, 4C)`, attention's row log-sum-exps `(B, NH, T)` and the
/// LayerNorm statistics.
pub fn block_forward(
    cfg: &ModelConfig,
    lin: LinearFormat,
    params: &UnitParams,
    x: &Tensor,
    recompute: Recompute,
) -> Result<(Tensor, BlockSaved)> {
    if recompute == Recompute::Attention {
        return Err(ModelError::Shape {
            field: "recompute",
            reason: "\"attention\" is for Llama-family blocks; a gpt2 block takes true or false"
                .into(),
        });
    }
    let (out, acts) = block_forward_full(cfg, lin, params, x, true)?;
    let out = out.expect("asked for the output");
    let saved = Kept::new(acts, recompute, |a| (a.x, ()));
    Ok((out, BlockSaved(saved)))
}

/// Gradients of [`block_forward`]: `dout (B, T, C)` -> `(dx (B, T, C), flat dparams)`.
/// The flat gradient has length exactly the block's numel; it is returned, not accumulated.
pub fn block_backward(
    cfg: &ModelConfig,
    lin: LinearFormat,
    params: &UnitParams,
    saved: &BlockSaved,
    dout: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let acts = saved.0.acts(
        |x| Ok(block_forward_full(cfg, lin, params, x, false)?.1),
        |x, ()| Ok(block_forward_full(cfg, lin, params, x, false)?.1),
    )?;
    let a: &BlockActs = &acts;
    let unit = UnitLayout::new(cfg, UnitKind::Block(0), 0);
    let flat = params.flat();
    check_params(flat, &unit, "block")?;
    let (b, t) = check_acts(cfg, &a.x, "block input")?;
    let c = cfg.n_embd;
    if dout.dims() != [b, t, c] {
        return Err(ModelError::ShapeMismatch {
            what: "block dout",
            expected: vec![b, t, c],
            got: dout.dims().to_vec(),
        });
    }
    let p = |name: &str| unit.param(name).view(flat);
    let lw = |name: &str| params.linear(unit.param(name));
    let grads = FlatGrad::new(&unit, flat.dtype(), flat.device())?;
    let slot = |name: &str| grads.slot(name);
    let dout = dout.reshape((b * t, c))?;

    // out = x2 + hg @ mlp.c_proj + b, hg = gelu(h), h = ln2 @ c_fc + b
    let (proj, fc) = ("mlp.c_proj.weight", "mlp.c_fc.weight");
    let (dln2, [dw_proj, db_proj, dw_fc, db_fc]) = lin.mlp_backward_into(
        &dout,
        (&a.hg, &a.h),
        &a.ln2,
        (&lw(proj)?, &lw(fc)?),
        (Some(&slot(proj)?), Some(&slot(fc)?)),
    )?;
    grads.put(proj, &dw_proj)?;
    grads.put("mlp.c_proj.bias", &db_proj)?;
    grads.put(fc, &dw_fc)?;
    grads.put("mlp.c_fc.bias", &db_fc)?;
    // ln2 = ln_2(x2); x2 also feeds the residual, whose gradient is dout
    let (dx2, dw, db) =
        layernorm_backward(&dln2, &a.ln2_saved, &a.x2, &p("ln_2.weight")?, Some(&dout))?;
    grads.put("ln_2.weight", &dw)?;
    grads.put("ln_2.bias", &db)?;
    // x2 = x + y @ c_proj + b
    let y = a.att.y.reshape((b * t, c))?;
    let proj = "attn.c_proj.weight";
    let y = SavedInput::Dense(y);
    let (dy, dw, db) = lin.backward_into(&dx2, &y, &lw(proj)?, Some(&slot(proj)?), true)?;
    grads.put(proj, &dw)?;
    grads.put("attn.c_proj.bias", &db.expect("asked for db"))?;
    // y = attention(qkv)
    let dqkv = attention_backward(&dy.reshape((b, t, c))?, &a.att)?.reshape((b * t, 3 * c))?;
    // qkv = ln1 @ c_attn + b
    let qkv = "attn.c_attn.weight";
    let (dln1, dw, db) = lin.backward_into(&dqkv, &a.ln1, &lw(qkv)?, Some(&slot(qkv)?), true)?;
    grads.put(qkv, &dw)?;
    grads.put("attn.c_attn.bias", &db.expect("asked for db"))?;
    // ln1 = ln_1(x); x also feeds the residual, whose gradient is dx2
    let xf = a.x.reshape((b * t, c))?;
    let (dx, dw, db) =
        layernorm_backward(&dln1, &a.ln1_saved, &xf, &p("ln_1.weight")?, Some(&dx2))?;
    grads.put("ln_1.weight", &dw)?;
    grads.put("ln_1.bias", &db)?;
    let dx = dx.reshape((b, t, c))?;
    let flat = grads.finish()?;
    Ok((dx, flat))
}

// ------------------------------------------------------------------------------------------
// Final LayerNorm unit

/// What [`final_norm_forward`] keeps: the input `x (B, T, C)` and its row statistics.
#[derive(Clone, Debug)]
pub struct NormSaved {
    x: Tensor,
    ln: LnSaved,
}

/// `ln_f(x)`: `x (B, T, C)` -> `(B, T, C)`.
pub fn final_norm_forward(
    cfg: &ModelConfig,
    params: &Tensor,
    x: &Tensor,
) -> Result<(Tensor, NormSaved)> {
    let unit = UnitLayout::new(cfg, UnitKind::FinalNorm, 0);
    check_params(params, &unit, "ln_f")?;
    let (b, t) = check_acts(cfg, x, "final norm input")?;
    let c = cfg.n_embd;
    let p = |name: &str| unit.param(name).view(params);
    let (out, ln) = layernorm_forward(
        &x.reshape((b * t, c))?,
        &p("ln_f.weight")?,
        &p("ln_f.bias")?,
    )?;
    let saved = NormSaved { x: x.clone(), ln };
    Ok((out.reshape((b, t, c))?, saved))
}

/// Gradients of [`final_norm_forward`]: `dout (B, T, C)` -> `(dx (B, T, C), flat dparams (2C))`.
/// Returned, not accumulated.
pub fn final_norm_backward(
    cfg: &ModelConfig,
    params: &Tensor,
    saved: &NormSaved,
    dout: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let unit = UnitLayout::new(cfg, UnitKind::FinalNorm, 0);
    check_params(params, &unit, "ln_f")?;
    let (b, t) = check_acts(cfg, &saved.x, "final norm input")?;
    let c = cfg.n_embd;
    if dout.dims() != [b, t, c] {
        return Err(ModelError::ShapeMismatch {
            what: "final norm dout",
            expected: vec![b, t, c],
            got: dout.dims().to_vec(),
        });
    }
    let w = unit.param("ln_f.weight").view(params)?;
    let xf = saved.x.reshape((b * t, c))?;
    let (dx, dw, db) = layernorm_backward(&dout.reshape((b * t, c))?, &saved.ln, &xf, &w, None)?;
    let flat = flatten_grads(&unit, vec![("ln_f.weight", dw), ("ln_f.bias", db)])?;
    Ok((dx.reshape((b, t, c))?, flat))
}

// ------------------------------------------------------------------------------------------
// Tied LM head and loss

/// The tied head and loss: [`lm_head_loss`], with the gradients when `grad`.
pub(crate) fn head_loss(
    cfg: &ModelConfig,
    embedding_params: &Tensor,
    x: &Tensor,
    targets: &Tensor,
    grad: bool,
) -> Result<(Loss, Option<(Tensor, Tensor)>)> {
    let unit = UnitLayout::new(cfg, UnitKind::Embedding, 0);
    units::head_loss(
        cfg,
        (&unit, "wte.weight"),
        embedding_params,
        x,
        targets,
        grad,
    )
}

/// Tied LM head + mean cross-entropy over all `B*T` positions. `embedding_params` is the
/// embedding unit's flat buffer (`wte` is its first `V*C` elements); `x (B, T, C)` is the output
/// of the final norm; `targets (B, T)` u32. Logits `(N, V) = x @ wte^T`, one tensor at a time.
pub fn lm_head_loss(
    cfg: &ModelConfig,
    embedding_params: &Tensor,
    x: &Tensor,
    targets: &Tensor,
) -> Result<f64> {
    head_loss(cfg, embedding_params, x, targets, false)?
        .0
        .value()
}

/// [`lm_head_loss`] plus gradients: `(loss, dx (B, T, C), flat d(embedding unit))`, the flat
/// gradient having only its `wte` part nonzero. Returned, not accumulated.
pub fn lm_head_loss_backward(
    cfg: &ModelConfig,
    embedding_params: &Tensor,
    x: &Tensor,
    targets: &Tensor,
) -> Result<(f64, Tensor, Tensor)> {
    let (loss, grads) = head_loss(cfg, embedding_params, x, targets, true)?;
    let (dx, flat) = grads.expect("requested gradients");
    Ok((loss.value()?, dx, flat))
}

// ------------------------------------------------------------------------------------------
// Incremental decoding: the units above for the next T positions of one sequence, with the
// keys and values of the earlier ones in a KV cache (see crate::decode).

/// [`embedding_unit_forward`] at positions `start..start + T`:
/// `out (1, T, C) = wte[tokens] + wpe[start..start + T]`, for `tokens (1, T)` u32 fed after
/// `start` cached positions. An error if `start + T > seq_len` (there is no `wpe` row beyond).
pub fn embedding_decode(
    cfg: &ModelConfig,
    params: &Tensor,
    tokens: &Tensor,
    start: usize,
) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Embedding, 0);
    check_params(params, &unit, "embedding")?;
    let (_, t) = check_tokens(cfg, tokens, "tokens")?;
    if start + t > cfg.seq_len {
        return Err(ModelError::SequenceTooLong {
            got: start + t,
            max: cfg.seq_len,
        });
    }
    let wte = unit.param("wte.weight").view(params)?;
    let wpe = unit.param("wpe.weight").view(params)?;
    crate::layers::embedding_forward(tokens, &wte, &wpe.narrow(0, start, t)?)
}

/// [`block_forward`] for `x (1, T, C)`, the next `T` positions of a sequence whose earlier
/// positions' keys and values are in `cache` (which this extends by `T`): the same layers
/// (`ln_1`, `c_attn`, `c_proj` with its residual, `ln_2`, `c_fc` with GELU, the MLP projection
/// with its residual), the attention being [`cached_attention`] of the new queries against
/// the cache. Returns `out (1, T, C)`; keeps nothing (no backward).
pub fn block_decode(
    cfg: &ModelConfig,
    params: &Tensor,
    x: &Tensor,
    cache: &mut LayerCache,
) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Block(0), 0);
    check_params(params, &unit, "block")?;
    let t = check_one_sequence(cfg, x, "block input")?;
    let c = cfg.n_embd;
    let p = |name: &str| unit.param(name).view(params);
    let xf = x.reshape((t, c))?;
    let (ln1, _) = layernorm_forward(&xf, &p("ln_1.weight")?, &p("ln_1.bias")?)?;
    let qkv = matmul_forward(&ln1, &p("attn.c_attn.weight")?, &p("attn.c_attn.bias")?)?;
    let qkv = qkv.reshape((1, t, 3 * c))?;
    let (q, k, v) = (
        qkv.narrow(2, 0, c)?,
        qkv.narrow(2, c, c)?,
        qkv.narrow(2, 2 * c, c)?,
    );
    let y = cached_attention(&q, &k, &v, cfg.n_head, cache)?.reshape((t, c))?;
    let x2 = residual_matmul_forward(&xf, &y, &p("attn.c_proj.weight")?, &p("attn.c_proj.bias")?)?;
    let (ln2, _) = layernorm_forward(&x2, &p("ln_2.weight")?, &p("ln_2.bias")?)?;
    let (_, hg) = matmul_gelu_forward(&ln2, &p("mlp.c_fc.weight")?, &p("mlp.c_fc.bias")?)?;
    let w = p("mlp.c_proj.weight")?;
    let out = residual_matmul_forward(&x2, &hg, &w, &p("mlp.c_proj.bias")?)?;
    Ok(out.reshape((1, t, c))?)
}

/// The logits `(V)` of the last position of `x (1, T, C)` (a block stack's output):
/// [`final_norm_forward`] of that row (`norm_params`, the `ln_f` unit's buffer), then the tied
/// head, `ln_f(x_last) @ wte^T` (`embedding_params`, the embedding unit's buffer). In the
/// parameters' dtype.
pub fn logits_decode(
    cfg: &ModelConfig,
    norm_params: &Tensor,
    embedding_params: &Tensor,
    x: &Tensor,
) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Embedding, 0);
    let t = check_one_sequence(cfg, x, "lm head input")?;
    let (y, _) = final_norm_forward(cfg, norm_params, &x.narrow(1, t - 1, 1)?)?;
    units::last_logits(cfg, (&unit, "wte.weight"), embedding_params, &y)
}
