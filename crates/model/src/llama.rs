//! The Llama family's units on one device: forward and backward of the token embedding, one
//! decoder block, the final RMSNorm, and the LM head (tied or not) with its loss. The GPT-2
//! units are in `units.rs`; these mirror them.
//!
//! Size letters: `B` batch, `T` tokens per sequence (`<= cfg.seq_len`), `N = B*T`, `C` =
//! `n_embd`, `NH` = `n_head`, `KV` = `n_kv_head`, `hs = C/NH`, `F` = `ffn_hidden`, `V` =
//! `vocab_size`.
//!
//! Each unit's parameters arrive as its flat buffer (1-D, length `>= unit.numel`; the engine
//! may pad the end), viewed by name through [`UnitLayout`] with the names of `llama_rows` in
//! layout.rs. Linear weights are stored `(in, out)`, so a projection is `x.matmul(w)`; there
//! are no biases. Each backward *returns* the unit's flat gradient, 1-D of length exactly
//! `unit.numel`, in the parameters' dtype; it never accumulates.
//!
//! A block is HF's `LlamaDecoderLayer`:
//! `h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))`, `n1 = rms(x)`;
//! `out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))`, `n2 = rms(h)`.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use model::{init_unit_range, llama, ModelConfig, ModelLayout};
//! let cfg = ModelConfig::llama(1, 8, 2, 1, 12, 4, 10, true);
//! let layout = ModelLayout::new(&cfg);
//! let p: Vec<Tensor> = layout.units.iter().map(|u| {
//!     let mut buf = vec![0f32; u.numel];
//!     init_unit_range(&cfg, u, 0, 0, &mut buf);
//!     Tensor::from_vec(buf, u.numel, &Device::Cpu).unwrap()
//! }).collect();
//! let tokens = Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu).unwrap();
//! let targets = Tensor::new(&[[2u32, 3, 4, 5]], &Device::Cpu).unwrap();
//! let x = llama::embedding_forward(&cfg, &p[0], &tokens).unwrap();
//! let (x, _) = llama::block_forward(&cfg, &p[1], &x, false).unwrap();
//! let (x, _) = llama::final_norm_forward(&cfg, &p[2], &x).unwrap();
//! let (loss, _) = llama::head_loss(&cfg, &p[0], &x, &targets, false).unwrap();
//! assert!((loss - 10f64.ln()).abs() < 0.05); // near-uniform predictions at init
//! ```

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{
    crossentropy_forward_backward, gqa_attention_backward, gqa_attention_forward,
    matmul_backward_no_bias, rmsnorm_backward, rmsnorm_forward, rope_backward, rope_forward,
    rope_tables, swiglu_backward, swiglu_forward,
};
use crate::layout::{UnitKind, UnitLayout};
use crate::units::{check_acts, check_params, check_tokens, flatten_grads};

pub use crate::layers::{GqaSaved, RmsSaved, RopeTables};

/// An error unless `dout` is `(B, T, C)`.
fn check_dout(
    cfg: &ModelConfig,
    dout: &Tensor,
    (b, t): (usize, usize),
    what: &'static str,
) -> Result<()> {
    if dout.dims() != [b, t, cfg.n_embd] {
        return Err(ModelError::ShapeMismatch {
            what,
            expected: vec![b, t, cfg.n_embd],
            got: dout.dims().to_vec(),
        });
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Embedding unit

/// `out (B, T, C) = embed_tokens[tokens]` from the embedding unit's flat `params` and
/// `tokens (B, T)` u32 (no positions: the blocks rotate q and k instead).
pub fn embedding_forward(cfg: &ModelConfig, params: &Tensor, tokens: &Tensor) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Embedding, 0);
    check_params(params, &unit, "embedding")?;
    let (b, t) = check_tokens(cfg, tokens, "tokens")?;
    let w = unit.param("embed_tokens.weight").view(params)?;
    Ok(w.index_select(&tokens.flatten_all()?, 0)?
        .reshape((b, t, cfg.n_embd))?)
}

/// Flat gradient of the embedding unit: the rows of `dout (B, T, C)` added into
/// `embed_tokens`' rows of their tokens (in the order the tokens appear), the rest zero. Dtype
/// of `dout`. Returned, not accumulated.
pub fn embedding_backward(cfg: &ModelConfig, tokens: &Tensor, dout: &Tensor) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Embedding, 0);
    let (b, t) = check_tokens(cfg, tokens, "tokens")?;
    check_dout(cfg, dout, (b, t), "embedding dout")?;
    let dw = Tensor::zeros((cfg.vocab_size, cfg.n_embd), dout.dtype(), dout.device())?.index_add(
        &tokens.flatten_all()?,
        &dout.reshape((b * t, cfg.n_embd))?,
        0,
    )?;
    flatten_grads(&unit, vec![("embed_tokens.weight", dw)])
}

// ------------------------------------------------------------------------------------------
// Decoder block

/// Every activation a block's backward reads. `N = B*T`.
#[derive(Clone, Debug)]
struct LlamaBlockActs {
    /// Block input `(B, T, C)`.
    x: Tensor,
    /// The rotary tables for this batch's `T`.
    rope: RopeTables,
    /// `input_layernorm(x)` `(N, C)` and its statistics.
    n1: Tensor,
    rms1: RmsSaved,
    /// Attention's inputs (q and k after the rotation), output and row log-sum-exps.
    att: GqaSaved,
    /// Residual after attention, `(N, C)`.
    h: Tensor,
    /// `post_attention_layernorm(h)` `(N, C)` and its statistics.
    n2: Tensor,
    rms2: RmsSaved,
    /// `gate_proj(n2)`, `up_proj(n2)` and `silu(gate) * up`, `(N, F)` each.
    gate: Tensor,
    up: Tensor,
    act: Tensor,
}

/// What [`block_forward`] keeps for [`block_backward`].
#[derive(Clone, Debug)]
pub struct LlamaBlockSaved(BlockSavedInner);

#[derive(Clone, Debug)]
enum BlockSavedInner {
    /// All activations (see `LlamaBlockActs`).
    Full(Box<LlamaBlockActs>),
    /// Only the block input `(B, T, C)`; backward recomputes the forward.
    Input(Tensor),
}

impl LlamaBlockSaved {
    /// Whether only the input was kept (activation checkpointing).
    pub fn is_recompute(&self) -> bool {
        matches!(self.0, BlockSavedInner::Input(_))
    }
}

/// Forward of one block, keeping every activation; the block's output too when `want_out`
/// (backward's recomputation skips `down_proj`, whose output it never reads).
fn block_forward_full(
    cfg: &ModelConfig,
    params: &Tensor,
    x: &Tensor,
    want_out: bool,
) -> Result<(Option<Tensor>, LlamaBlockActs)> {
    let unit = UnitLayout::new(cfg, UnitKind::Block(0), 0);
    check_params(params, &unit, "block")?;
    let (b, t) = check_acts(cfg, x, "block input")?;
    let (c, nh, kv, hs) = (cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim());
    let p = |name: &str| unit.param(name).view(params);
    let rope = rope_tables(t, hs, cfg.rope_theta, x.dtype(), x.device())?;
    let xf = x.reshape((b * t, c))?;
    let (n1, rms1) = rmsnorm_forward(&xf, &p("input_layernorm.weight")?, cfg.norm_eps)?;
    let q = n1.matmul(&p("self_attn.q_proj.weight")?)?;
    let k = n1.matmul(&p("self_attn.k_proj.weight")?)?;
    let v = n1.matmul(&p("self_attn.v_proj.weight")?)?;
    let q = rope_forward(&q.reshape((b, t, nh, hs))?, &rope)?.reshape((b, t, c))?;
    let k = rope_forward(&k.reshape((b, t, kv, hs))?, &rope)?.reshape((b, t, kv * hs))?;
    let (y, att) = gqa_attention_forward(&q, &k, &v.reshape((b, t, kv * hs))?, nh, kv)?;
    let h = (&xf
        + y.reshape((b * t, c))?
            .matmul(&p("self_attn.o_proj.weight")?)?)?;
    let (n2, rms2) = rmsnorm_forward(&h, &p("post_attention_layernorm.weight")?, cfg.norm_eps)?;
    let gate = n2.matmul(&p("mlp.gate_proj.weight")?)?;
    let up = n2.matmul(&p("mlp.up_proj.weight")?)?;
    let act = swiglu_forward(&gate, &up)?;
    let out = if want_out {
        let down = act.matmul(&p("mlp.down_proj.weight")?)?;
        Some((&h + down)?.reshape((b, t, c))?)
    } else {
        None
    };
    let acts = LlamaBlockActs {
        x: x.clone(),
        rope,
        n1,
        rms1,
        att,
        h,
        n2,
        rms2,
        gate,
        up,
        act,
    };
    Ok((out, acts))
}

/// One decoder block: `x (B, T, C)` -> `out (B, T, C)` from the block's flat `params`
/// (`eps` = `cfg.norm_eps`, the rotary tables of `cfg.rope_theta` for this batch's `T`).
///
/// With `recompute`, [`LlamaBlockSaved`] holds only `x` (activation checkpointing) and
/// [`block_backward`] reruns this forward (all but `down_proj`); gradients are bitwise the same
/// either way. Without it, it holds `n1, n2, h (N, C)`, attention's rotated `q (N, C)`,
/// `k, v (N, KV*hs)`, output `(N, C)` and row log-sum-exps `(B, NH, T)`, `gate, up,
/// silu(gate)*up (N, F)`, the RMSNorm statistics and the rotary tables.
pub fn block_forward(
    cfg: &ModelConfig,
    params: &Tensor,
    x: &Tensor,
    recompute: bool,
) -> Result<(Tensor, LlamaBlockSaved)> {
    let (out, acts) = block_forward_full(cfg, params, x, true)?;
    let out = out.expect("asked for the output");
    let saved = if recompute {
        BlockSavedInner::Input(acts.x)
    } else {
        BlockSavedInner::Full(Box::new(acts))
    };
    Ok((out, LlamaBlockSaved(saved)))
}

/// Gradients of [`block_forward`]: `dout (B, T, C)` -> `(dx (B, T, C), flat dparams)`.
/// The flat gradient has length exactly the block's numel; it is returned, not accumulated.
pub fn block_backward(
    cfg: &ModelConfig,
    params: &Tensor,
    saved: &LlamaBlockSaved,
    dout: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let recomputed;
    let a: &LlamaBlockActs = match &saved.0 {
        BlockSavedInner::Full(a) => a,
        BlockSavedInner::Input(x) => {
            recomputed = block_forward_full(cfg, params, x, false)?.1;
            &recomputed
        }
    };
    let unit = UnitLayout::new(cfg, UnitKind::Block(0), 0);
    check_params(params, &unit, "block")?;
    let (b, t) = check_acts(cfg, &a.x, "block input")?;
    check_dout(cfg, dout, (b, t), "block dout")?;
    let (c, nh, kv, hs) = (cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim());
    let p = |name: &str| unit.param(name).view(params);
    let dout = dout.reshape((b * t, c))?;

    // out = h + act @ down_proj
    let (dact, dw_down) = matmul_backward_no_bias(&dout, &a.act, &p("mlp.down_proj.weight")?)?;
    // act = silu(gate) * up
    let (dgate, dup) = swiglu_backward(&dact, &a.gate, &a.up)?;
    // gate = n2 @ gate_proj, up = n2 @ up_proj
    let (dn2_g, dw_gate) = matmul_backward_no_bias(&dgate, &a.n2, &p("mlp.gate_proj.weight")?)?;
    let (dn2_u, dw_up) = matmul_backward_no_bias(&dup, &a.n2, &p("mlp.up_proj.weight")?)?;
    let dn2 = (dn2_g + dn2_u)?;
    // n2 = post_attention_layernorm(h); h also feeds the residual, whose gradient is dout
    let w_post = p("post_attention_layernorm.weight")?;
    let (dh, dw_post) = rmsnorm_backward(&dn2, &a.rms2, &a.h, &w_post, Some(&dout))?;
    // h = x + y @ o_proj
    let y = a.att.y.reshape((b * t, c))?;
    let (dy, dw_o) = matmul_backward_no_bias(&dh, &y, &p("self_attn.o_proj.weight")?)?;
    // y = attn(q, k, v)
    let (dq, dk, dv) = gqa_attention_backward(&dy.reshape((b, t, c))?, &a.att)?;
    // q = rope(q_proj(n1)), k = rope(k_proj(n1))
    let dq = rope_backward(&dq.reshape((b, t, nh, hs))?, &a.rope)?.reshape((b * t, c))?;
    let dk = rope_backward(&dk.reshape((b, t, kv, hs))?, &a.rope)?.reshape((b * t, kv * hs))?;
    let dv = dv.reshape((b * t, kv * hs))?;
    let (dn1_q, dw_q) = matmul_backward_no_bias(&dq, &a.n1, &p("self_attn.q_proj.weight")?)?;
    let (dn1_k, dw_k) = matmul_backward_no_bias(&dk, &a.n1, &p("self_attn.k_proj.weight")?)?;
    let (dn1_v, dw_v) = matmul_backward_no_bias(&dv, &a.n1, &p("self_attn.v_proj.weight")?)?;
    let dn1 = ((dn1_q + dn1_k)? + dn1_v)?;
    // n1 = input_layernorm(x); x also feeds the residual, whose gradient is dh
    let xf = a.x.reshape((b * t, c))?;
    let w_in = p("input_layernorm.weight")?;
    let (dx, dw_in) = rmsnorm_backward(&dn1, &a.rms1, &xf, &w_in, Some(&dh))?;

    let flat = flatten_grads(
        &unit,
        vec![
            ("input_layernorm.weight", dw_in),
            ("self_attn.q_proj.weight", dw_q),
            ("self_attn.k_proj.weight", dw_k),
            ("self_attn.v_proj.weight", dw_v),
            ("self_attn.o_proj.weight", dw_o),
            ("post_attention_layernorm.weight", dw_post),
            ("mlp.gate_proj.weight", dw_gate),
            ("mlp.up_proj.weight", dw_up),
            ("mlp.down_proj.weight", dw_down),
        ],
    )?;
    Ok((dx.reshape((b, t, c))?, flat))
}

// ------------------------------------------------------------------------------------------
// Final RMSNorm unit (with the untied LM head's weight)

/// What [`final_norm_forward`] keeps: the input `x (B, T, C)` and its row statistics.
#[derive(Clone, Debug)]
pub struct LlamaNormSaved {
    x: Tensor,
    rms: RmsSaved,
}

/// `norm(x)`: `x (B, T, C)` -> `(B, T, C)`, from the `norm` unit's flat `params`.
pub fn final_norm_forward(
    cfg: &ModelConfig,
    params: &Tensor,
    x: &Tensor,
) -> Result<(Tensor, LlamaNormSaved)> {
    let unit = UnitLayout::new(cfg, UnitKind::FinalNorm, 0);
    check_params(params, &unit, "norm")?;
    let (b, t) = check_acts(cfg, x, "final norm input")?;
    let c = cfg.n_embd;
    let w = unit.param("norm.weight").view(params)?;
    let (out, rms) = rmsnorm_forward(&x.reshape((b * t, c))?, &w, cfg.norm_eps)?;
    let saved = LlamaNormSaved { x: x.clone(), rms };
    Ok((out.reshape((b, t, c))?, saved))
}

/// Gradients of [`final_norm_forward`]: `dout (B, T, C)` -> `(dx (B, T, C), flat dparams)`.
/// When the head is untied the unit also holds `lm_head.weight`, whose part of the flat
/// gradient is zero here ([`head_loss`] returns it). Returned, not accumulated.
pub fn final_norm_backward(
    cfg: &ModelConfig,
    params: &Tensor,
    saved: &LlamaNormSaved,
    dout: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let unit = UnitLayout::new(cfg, UnitKind::FinalNorm, 0);
    check_params(params, &unit, "norm")?;
    let (b, t) = check_acts(cfg, &saved.x, "final norm input")?;
    check_dout(cfg, dout, (b, t), "final norm dout")?;
    let c = cfg.n_embd;
    let w = unit.param("norm.weight").view(params)?;
    let xf = saved.x.reshape((b * t, c))?;
    let (dx, dw) = rmsnorm_backward(&dout.reshape((b * t, c))?, &saved.rms, &xf, &w, None)?;
    let mut grads = vec![("norm.weight", dw)];
    if let Some(head) = unit.try_param("lm_head.weight") {
        let zeros = Tensor::zeros(head.shape.as_slice(), params.dtype(), params.device())?;
        grads.push(("lm_head.weight", zeros));
    }
    let flat = flatten_grads(&unit, grads)?;
    Ok((dx.reshape((b, t, c))?, flat))
}

// ------------------------------------------------------------------------------------------
// LM head and loss

/// The unit that holds the LM head's weight and that weight's short name: the embedding's
/// `embed_tokens` when tied, the final norm's `lm_head` otherwise.
pub fn head_unit(cfg: &ModelConfig) -> (UnitLayout, &'static str) {
    if cfg.tie_embeddings {
        (
            UnitLayout::new(cfg, UnitKind::Embedding, 0),
            "embed_tokens.weight",
        )
    } else {
        (
            UnitLayout::new(cfg, UnitKind::FinalNorm, 0),
            "lm_head.weight",
        )
    }
}

/// LM head + mean cross-entropy over all `B*T` positions: logits `(N, V) = x @ W^T` with `W`
/// `(V, C)` the head's weight, a view of `head_params`, the flat buffer of the unit
/// [`head_unit`] names (the embedding when tied, the final norm otherwise). `x (B, T, C)` is
/// the final norm's output, `targets (B, T)` u32.
///
/// With `grad`, also `(dx (B, T, C), flat gradient of the head's unit)`, nonzero only in `W`'s
/// part. Returned, not accumulated: the caller adds it to that unit's other gradient.
pub fn head_loss(
    cfg: &ModelConfig,
    head_params: &Tensor,
    x: &Tensor,
    targets: &Tensor,
    grad: bool,
) -> Result<(f64, Option<(Tensor, Tensor)>)> {
    let (unit, name) = head_unit(cfg);
    check_params(head_params, &unit, "lm head")?;
    let (b, t) = check_acts(cfg, x, "lm head input")?;
    let (tb, tt) = check_tokens(cfg, targets, "targets")?;
    if (tb, tt) != (b, t) {
        return Err(ModelError::ShapeMismatch {
            what: "targets",
            expected: vec![b, t],
            got: vec![tb, tt],
        });
    }
    let c = cfg.n_embd;
    let w = unit.param(name).view(head_params)?;
    let (loss, grads) =
        crossentropy_forward_backward(&x.reshape((b * t, c))?, &w, &targets.flatten_all()?, grad)?;
    let Some((dx, dw)) = grads else {
        return Ok((loss, None));
    };
    let mut parts = Vec::with_capacity(unit.params.len());
    for spec in &unit.params {
        if spec.name == unit.param(name).name {
            parts.push((name, dw.clone()));
        } else {
            let zeros = Tensor::zeros(spec.shape.as_slice(), dw.dtype(), dw.device())?;
            parts.push((spec.name.as_str(), zeros));
        }
    }
    let flat = flatten_grads(&unit, parts)?;
    Ok((loss, Some((dx.reshape((b, t, c))?, flat))))
}
