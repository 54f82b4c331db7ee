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
//! `llama/style.rs`. Linear weights are stored `(in, out)`, so a projection is `x.matmul(w)`;
//! Llama has no biases (Qwen2 has them on q, k and v: `cfg.qkv_bias`). Each backward *returns* the unit's flat gradient, 1-D of length exactly
//! `unit.numel`, in the parameters' dtype; it never accumulates.
//!
//! A block is HF's `LlamaDecoderLayer`:
//! `h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))`, `n1 = rms(x)`;
//! `out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))`, `n2 = rms(h)`. Qwen2's adds
//! biases to q_proj, k_proj and v_proj; Qwen3's normalises each head of q and k before the
//! rotation (`q_norm`, `k_norm`), and its heads may be wider than `C / NH` (q is `NH hs` wide,
//! o_proj `(NH hs, C)`).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use model::{init_unit_range, llama, LinearFormat, ModelConfig, ModelLayout, Recompute};
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
//! let p1 = p[1].clone().into();
//! let (x, _) = llama::block_forward(&cfg, LinearFormat::Dense, &p1, &x, Recompute::Off).unwrap();
//! let (x, _) = llama::final_norm_forward(&cfg, &p[2], &x).unwrap();
//! let (loss, _) = llama::head_loss(&cfg, &p[0], &x, &targets, false).unwrap();
//! let loss = loss.value().unwrap(); // read on the host here
//! assert!((loss - 10f64.ln()).abs() < 0.05); // near-uniform predictions at init
//! ```

pub mod family;
mod hf_config;
pub mod rope_config;
pub mod style;
use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::decode::{cached_attention, check_one_sequence, LayerCache};
use crate::error::{ModelError, Result};
use crate::layers::{
    add_rmsnorm_forward, bias_grad, gqa_packed_backward, gqa_packed_forward, qk_norm_forward,
    qk_norm_rope_backward, qk_norm_rope_forward, rmsnorm_backward, rmsnorm_backward_into,
    rmsnorm_forward, rope_qk_backward, rope_qk_forward, rope_tables, swiglu_packed_forward, Loss,
    QkNormSaved, TokenIndex,
};
use crate::layout::{UnitKind, UnitLayout};
use crate::linears::{LinearFormat, LinearWeight, SavedInput};
use crate::recompute::Recompute;
use crate::schedule::UnitParams;
use crate::units::{self, check_acts, check_params, check_tokens, flatten_grads, FlatGrad, Kept};

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
pub fn embedding_backward(
    cfg: &ModelConfig,
    tokens: &TokenIndex,
    dout: &Tensor,
    onto: Option<Tensor>,
) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Embedding, 0);
    let (b, t) = check_tokens(cfg, tokens.tokens(), "tokens")?;
    check_dout(cfg, dout, (b, t), "embedding dout")?;
    // GPT-2's token rows without its positions (on the GPU its deterministic kernel; the
    // position rows it also sums are dropped), added onto the tied head's gradient where given
    // (the unit is the token table alone, so its flat gradient is the table's).
    let onto = onto
        .map(|o| o.reshape((cfg.vocab_size, cfg.n_embd)))
        .transpose()?;
    let (dw, _) = crate::layers::embedding_backward_onto(dout, tokens, cfg.vocab_size, t, onto)?;
    flatten_grads(&unit, vec![("embed_tokens.weight", dw)])
}

// ------------------------------------------------------------------------------------------
// Decoder block

/// Every activation a block's backward reads. `N = B*T`, `W = (NH + 2 KV) hs`.
#[derive(Clone, Debug)]
struct LlamaBlockActs {
    /// The attention half's: from the block's input to the attention's output.
    attn: AttentionHalf,
    /// Residual after attention, `(N, C)`.
    h: Tensor,
    /// `post_attention_layernorm(h)` `(N, C)` as gate|up's backward reads it, and the norm's
    /// statistics.
    n2: SavedInput,
    rms2: RmsSaved,
    /// `[gate_proj(n2) | up_proj(n2)]` `(N, 2F)`, and `silu(gate) * up` `(N, F)` as down's
    /// backward reads it.
    gu: Tensor,
    act: SavedInput,
}

/// What the attention half of a block makes: `N = B*T`, `W = (NH + 2 KV) hs`.
#[derive(Clone, Debug)]
struct AttentionHalf {
    /// Block input `(B, T, C)`.
    x: Tensor,
    /// The rotary tables for this batch's `T`.
    rope: RopeTables,
    /// `input_layernorm(x)` `(N, C)` as q|k|v's backward reads it (FP8: its column blocks
    /// alone), and the norm's statistics.
    n1: SavedInput,
    rms1: RmsSaved,
    /// With qk-norm: q's and k's heads before their norm, and the norms' statistics.
    qk: Option<QkNormSaved>,
    /// Attention's packed input (q and k after the rotation) `(B, T, W)`, output and row
    /// log-sum-exps.
    att: GqaSaved,
}

/// What [`block_forward`] keeps for [`block_backward`] ([`Recompute`]): every
/// `LlamaBlockActs`; the block's input `(B, T, C)` alone, the rest recomputed; or the input
/// and the MLP half's activations ([`MlpKept`]), the attention half's recomputed.
#[derive(Clone, Debug)]
pub struct LlamaBlockSaved(Kept<LlamaBlockActs, MlpKept>);

impl LlamaBlockSaved {
    /// What was kept, as the mode that kept it.
    pub fn recompute(&self) -> Recompute {
        self.0.mode()
    }
}

/// What [`Recompute::Attention`] keeps besides the block's input: the residual after
/// attention `h (N, C)` and gate|up's output `gu (N, 2F)`, from which the backward makes `n2`
/// and `silu(gate) * up` again in two element-wise passes, so that none of the MLP's GEMMs nor
/// o_proj's runs twice.
#[derive(Clone, Debug)]
struct MlpKept {
    h: Tensor,
    gu: Tensor,
}

/// The block's weights: each packed projection one matrix (`style.rs`' [`style::QKV`],
/// [`style::GATE_UP`]).
struct BlockWeights {
    input_norm: Tensor,
    /// q_proj|k_proj|v_proj `(C, (NH + 2 KV) hs)`.
    qkv: LinearWeight,
    /// Their biases `((NH + 2 KV) hs)` (Qwen2).
    qkv_bias: Option<Tensor>,
    /// q_norm and k_norm `(hs)` (Qwen3).
    qk_norm: Option<[Tensor; 2]>,
    o: LinearWeight,
    post_norm: Tensor,
    /// gate_proj|up_proj `(C, 2F)`.
    gate_up: LinearWeight,
    down: LinearWeight,
}

const QK_NORM_NAMES: [&str; 2] = ["self_attn.q_norm.weight", "self_attn.k_norm.weight"];

impl BlockWeights {
    fn view(cfg: &ModelConfig, unit: &UnitLayout, params: &UnitParams) -> Result<BlockWeights> {
        let lw = |name: &str| params.linear(unit.param(name));
        let params = params.flat();
        let p = |name: &str| unit.param(name).view(params);
        let qk_norm = match cfg.qk_norm {
            true => Some([p(QK_NORM_NAMES[0])?, p(QK_NORM_NAMES[1])?]),
            false => None,
        };
        Ok(BlockWeights {
            input_norm: p("input_layernorm.weight")?,
            qkv: lw(style::QKV)?,
            qkv_bias: cfg.qkv_bias.then(|| p(style::QKV_BIAS)).transpose()?,
            qk_norm,
            o: lw("self_attn.o_proj.weight")?,
            post_norm: p("post_attention_layernorm.weight")?,
            gate_up: lw(style::GATE_UP)?,
            down: lw("mlp.down_proj.weight")?,
        })
    }
}

/// The attention half of a block up to the attention's output `y (B, T, NH hs)` (in `att`),
/// with the block's weights viewed from `params`: the first norm into q|k|v's projection, q and
/// k normalised per head (Qwen3) and turned by the rotation (one pass on the GPU), then the
/// attention. [`block_forward_full`] goes on to o_proj and the MLP; a [`Recompute::Attention`]
/// backward stops here.
fn attention_half(
    cfg: &ModelConfig,
    lin: LinearFormat,
    params: &UnitParams,
    x: &Tensor,
) -> Result<(BlockWeights, AttentionHalf)> {
    let unit = UnitLayout::new(cfg, UnitKind::Block(0), 0);
    check_params(params.flat(), &unit, "block")?;
    let w = BlockWeights::view(cfg, &unit, params)?;
    let (b, t) = check_acts(cfg, x, "block input")?;
    let (c, nh, kv, hs) = (cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim);
    let rope = rope_tables(
        t,
        hs,
        cfg.rope_theta,
        &cfg.rope_scaling,
        x.dtype(),
        x.device(),
    )?;
    let xf = x.reshape((b * t, c))?;
    // n1 = input_layernorm(x), into [q_proj | k_proj | v_proj]
    let eps = cfg.norm_eps;
    let bias = w.qkv_bias.as_ref();
    let qkv_w = std::slice::from_ref(&w.qkv);
    let first = lin.rmsnorm_cols_forward_saving(&xf, None, &w.input_norm, eps, qkv_w, bias)?;
    let (n1, rms1) = (first.n, first.rms);
    let qkv = first.y.reshape((b, t, (nh + 2 * kv) * hs))?;
    // q and k normalised per head (Qwen3), then turned by the rotation: one pass on the GPU
    let (qkv, qk) = match &w.qk_norm {
        Some([wq, wk]) => {
            let (qkv, saved) = qk_norm_rope_forward(qkv, wq, wk, &rope, nh, kv, cfg.norm_eps)?;
            (qkv, Some(saved))
        }
        None => (rope_qk_forward(qkv, &rope, nh, kv)?, None),
    };
    let (_, att) = gqa_packed_forward(&qkv, nh, kv)?;
    let half = AttentionHalf {
        x: x.clone(),
        rope,
        n1,
        rms1,
        qk,
        att,
    };
    Ok((w, half))
}

impl AttentionHalf {
    /// Every activation of the block: this half's and the MLP half's.
    fn with_mlp(
        self,
        h: Tensor,
        (n2, rms2): (SavedInput, RmsSaved),
        gu: Tensor,
        act: SavedInput,
    ) -> LlamaBlockActs {
        LlamaBlockActs {
            attn: self,
            h,
            n2,
            rms2,
            gu,
            act,
        }
    }
}

/// Forward of one block, keeping every activation; the block's output too when `want_out`
/// (backward's recomputation skips `down_proj`, whose output it never reads).
fn block_forward_full(
    cfg: &ModelConfig,
    lin: LinearFormat,
    params: &UnitParams,
    x: &Tensor,
    want_out: bool,
) -> Result<(Option<Tensor>, LlamaBlockActs)> {
    let (w, half) = attention_half(cfg, lin, params, x)?;
    let (b, t) = check_acts(cfg, x, "block input")?;
    let (c, nh, hs) = (cfg.n_embd, cfg.n_head, cfg.head_dim);
    let xf = x.reshape((b * t, c))?;
    let y = half.att.y.reshape((b * t, nh * hs))?;
    let attn_out = lin.cols_forward(&y, std::slice::from_ref(&w.o), None, None)?;
    // h = x + o_proj(y), then its norm in the same pass, into [gate_proj | up_proj]
    let eps = cfg.norm_eps;
    let gate_up = std::slice::from_ref(&w.gate_up);
    let second =
        lin.rmsnorm_cols_forward_saving(&xf, Some(&attn_out), &w.post_norm, eps, gate_up, None)?;
    let (h, n2, rms2, gu) = (second.h, second.n, second.rms, second.y);
    // act = silu(gate) * up into down: what down's backward reads of act, made in the same
    // pass (a recomputation, which never reads the output, makes that alone).
    let (out, act) = lin.swiglu_down_forward(&gu, &w.down, Some(&h), want_out)?;
    let out = out.map(|o| o.reshape((b, t, c))).transpose()?;
    Ok((out, half.with_mlp(h, (n2, rms2), gu, act)))
}

/// The activations of a block kept under [`Recompute::Attention`], made again: the attention
/// half from `x`, and from the kept `h` and `gu` the second norm's output and `silu(gate) * up`
/// as the projections' backward keeps them (element-wise passes; no GEMM of the MLP nor
/// o_proj's). The same bits as [`block_forward_full`]'s.
fn block_forward_attention(
    cfg: &ModelConfig,
    lin: LinearFormat,
    params: &UnitParams,
    x: &Tensor,
    kept: &MlpKept,
) -> Result<LlamaBlockActs> {
    let (w, half) = attention_half(cfg, lin, params, x)?;
    let (rms2, n2) = lin.rmsnorm_saving(&kept.h, &w.post_norm, cfg.norm_eps)?;
    let (_, act) = lin.swiglu_down_forward(&kept.gu, &w.down, None, false)?;
    Ok(half.with_mlp(kept.h.clone(), (n2, rms2), kept.gu.clone(), act))
}

/// One decoder block: `x (B, T, C)` -> `out (B, T, C)` from the block's flat `params`
/// (`eps` = `cfg.norm_eps`, the rotary tables of `cfg.rope_theta` and `cfg.rope_scaling` for
/// this batch's `T`).
/// Its projections (q|k|v, o, gate|up, down) multiply in `lin` ([`LinearFormat`]: the
/// compute dtype, or FP8).
///
/// q, k and v come out of one packed projection `(N, (NH + 2 KV) hs)` that the rotation turns
/// in place and the attention reads in place, gate and up out of another `(N, 2F)`; the residual
/// add after attention runs inside the next norm, the one after the MLP in its projection.
///
/// [`LlamaBlockSaved`] holds what `recompute` says: with [`Recompute::Full`] only `x`
/// (activation checkpointing), and [`block_backward`] reruns this forward (all but
/// `down_proj`); with [`Recompute::Attention`] `x`, the residual after attention `h (N, C)` and
/// `[gate | up] (N, 2F)`, and the backward reruns the attention half alone and the MLP's
/// element-wise passes; gradients are bitwise the same in every mode. Without recomputation, it
/// holds `n1, n2, h (N, C)`, attention's packed rotated input
/// `(N, (NH + 2 KV) hs)`, output `(N, C)` and row log-sum-exps `(B, NH, T)`, `[gate | up]
/// (N, 2F)`, `silu(gate)*up (N, F)`, the RMSNorm statistics and the rotary tables; under FP8,
/// `n1`, `n2` and `silu(gate)*up` as their projections' backward reads them (their FP8 column
/// blocks, [`SavedInput`]), which the forward makes in its one read of each.
pub fn block_forward(
    cfg: &ModelConfig,
    lin: LinearFormat,
    params: &UnitParams,
    x: &Tensor,
    recompute: Recompute,
) -> Result<(Tensor, LlamaBlockSaved)> {
    let (out, acts) = block_forward_full(cfg, lin, params, x, true)?;
    let out = out.expect("asked for the output");
    let saved = Kept::new(acts, recompute, |a| {
        (a.attn.x, MlpKept { h: a.h, gu: a.gu })
    });
    Ok((out, LlamaBlockSaved(saved)))
}

/// Gradients of [`block_forward`]: `dout (B, T, C)` -> `(dx (B, T, C), flat dparams)`.
/// The flat gradient has length exactly the block's numel; it is returned, not accumulated. On
/// the GPU every weight gradient is written straight into its slot of the flat buffer.
pub fn block_backward(
    cfg: &ModelConfig,
    lin: LinearFormat,
    params: &UnitParams,
    saved: &LlamaBlockSaved,
    dout: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let acts = saved.0.acts(
        |x| Ok(block_forward_full(cfg, lin, params, x, false)?.1),
        |x, kept| block_forward_attention(cfg, lin, params, x, kept),
    )?;
    let a: &LlamaBlockActs = &acts;
    let unit = UnitLayout::new(cfg, UnitKind::Block(0), 0);
    check_params(params.flat(), &unit, "block")?;
    let (b, t) = check_acts(cfg, &a.attn.x, "block input")?;
    check_dout(cfg, dout, (b, t), "block dout")?;
    let (c, nh, kv, hs) = (cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim);
    let w = BlockWeights::view(cfg, &unit, params)?;
    let grads = FlatGrad::new(&unit, params.flat().dtype(), params.flat().device())?;
    let slots = |names: &[&str]| -> Result<Vec<Option<Tensor>>> {
        names.iter().map(|n| grads.slot(n).map(Some)).collect()
    };
    let put = |names: &[&str], dws: &[Tensor]| -> Result<()> {
        names.iter().zip(dws).try_for_each(|(n, g)| grads.put(n, g))
    };
    let dout = dout.reshape((b * t, c))?;

    // out = h + act @ down_proj, act = silu(gate) * up, [gate | up] = n2 @ [gate_proj | up_proj]
    let (down, gate_up) = ("mlp.down_proj.weight", [style::GATE_UP]);
    let (dn2, dw_down, dw) = lin.swiglu_mlp_backward(
        &dout,
        &a.gu,
        (&a.act, &a.n2),
        (&w.down, std::slice::from_ref(&w.gate_up)),
        (Some(&grads.slot(down)?), &slots(&gate_up)?),
    )?;
    grads.put(down, &dw_down)?;
    put(&gate_up, &dw)?;
    // n2 = post_attention_layernorm(h); h also feeds the residual, whose gradient is dout
    let post = "post_attention_layernorm.weight";
    let (dh, dw_post) = rmsnorm_backward_into(
        &dn2,
        &a.rms2,
        &a.h,
        &w.post_norm,
        Some(&dout),
        Some(&grads.slot(post)?),
    )?;
    grads.put(post, &dw_post)?;
    // h = x + y @ o_proj
    let o = ["self_attn.o_proj.weight"];
    let y = a.attn.att.y.reshape((b * t, nh * hs))?;
    let y = SavedInput::Dense(y);
    let (dy, dw) = lin.cols_backward(&dh, &y, std::slice::from_ref(&w.o), &slots(&o)?)?;
    put(&o, &dw)?;
    // y = attn(qkv), then q and k turned back by the rotation
    let dqkv = gqa_packed_backward(&dy.reshape((b, t, nh * hs))?, &a.attn.att)?;
    // (and before the rotation, q and k normalised per head (Qwen3): one pass on the GPU)
    let dqkv = match (&w.qk_norm, &a.attn.qk) {
        (Some([wq, wk]), Some(saved)) => {
            let (dqkv, dwq, dwk) = qk_norm_rope_backward(dqkv, saved, wq, wk, &a.attn.rope)?;
            put(&QK_NORM_NAMES, &[dwq, dwk])?;
            dqkv
        }
        _ => rope_qk_backward(dqkv, &a.attn.rope, nh, kv)?,
    };
    let dqkv = dqkv.reshape((b * t, (nh + 2 * kv) * hs))?;
    // qkv = n1 @ [q_proj | k_proj | v_proj] (+ their biases, Qwen2: the packed gradient's
    // column sums; under FP8 from the read that quantises dqkv)
    let qkv = [style::QKV];
    let qkv_w = std::slice::from_ref(&w.qkv);
    let dn1 = match (lin, w.qkv_bias.is_some()) {
        (LinearFormat::Fp8, true) => {
            let slot = grads.slot(style::QKV)?;
            let (dn1, dw, db) = lin.backward_into(&dqkv, &a.attn.n1, &w.qkv, Some(&slot), true)?;
            grads.put(style::QKV, &dw)?;
            grads.put(style::QKV_BIAS, &db.expect("asked for the bias gradient"))?;
            dn1
        }
        (_, with_bias) => {
            if with_bias {
                grads.put(style::QKV_BIAS, &bias_grad(&dqkv)?)?;
            }
            let (dn1, dw) = lin.cols_backward(&dqkv, &a.attn.n1, qkv_w, &slots(&qkv)?)?;
            put(&qkv, &dw)?;
            dn1
        }
    };
    // n1 = input_layernorm(x); x also feeds the residual, whose gradient is dh
    let xf = a.attn.x.reshape((b * t, c))?;
    let input = "input_layernorm.weight";
    let (dx, dw_in) = rmsnorm_backward_into(
        &dn1,
        &a.attn.rms1,
        &xf,
        &w.input_norm,
        Some(&dh),
        Some(&grads.slot(input)?),
    )?;
    grads.put(input, &dw_in)?;
    Ok((dx.reshape((b, t, c))?, grads.finish()?))
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
) -> Result<(Loss, Option<(Tensor, Tensor)>)> {
    let (unit, name) = head_unit(cfg);
    units::head_loss(cfg, (&unit, name), head_params, x, targets, grad)
}

// ------------------------------------------------------------------------------------------
// Incremental decoding: the units above for the next T positions of one sequence, with the
// keys and values of the earlier ones in a KV cache (see crate::decode). The embedding needs
// no decode form: it has no positions ([`embedding_forward`] serves).

/// [`block_forward`] for `x (1, T, C)`, the next `T` positions of a sequence whose earlier
/// positions' keys and values are in `cache` (which this extends by `T`): the same layers
/// (input RMSNorm, the packed q|k|v projection, `o_proj`, the residual add in the next norm,
/// gate|up, SwiGLU, `down_proj` with its residual), q and k rotated by the angles of their
/// absolute positions `cache.len()..cache.len() + T` (rows of `rope`, tables from position 0
/// such as `rope_tables(seq_len, ..)` make), the attention being [`cached_attention`] of the
/// new queries against the cache. Returns `out (1, T, C)`; keeps nothing (no backward).
pub fn block_decode(
    cfg: &ModelConfig,
    params: &Tensor,
    x: &Tensor,
    cache: &mut LayerCache,
    rope: &RopeTables,
) -> Result<Tensor> {
    let unit = UnitLayout::new(cfg, UnitKind::Block(0), 0);
    check_params(params, &unit, "block")?;
    let t = check_one_sequence(cfg, x, "block input")?;
    let (c, nh, kv, hs) = (cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim);
    let start = cache.len();
    if start + t > rope.cos.dim(0)? {
        return Err(ModelError::SequenceTooLong {
            got: start + t,
            max: rope.cos.dim(0)?,
        });
    }
    // Decoding multiplies in the compute dtype.
    let dense = LinearFormat::Dense;
    let w = BlockWeights::view(cfg, &unit, &UnitParams::dense(params.clone()))?;
    let xf = x.reshape((t, c))?;
    let (n1, _) = rmsnorm_forward(&xf, &w.input_norm, cfg.norm_eps)?;
    let qkv = dense
        .cols_forward(&n1, std::slice::from_ref(&w.qkv), w.qkv_bias.as_ref(), None)?
        .reshape((1, t, (nh + 2 * kv) * hs))?;
    let qkv = match &w.qk_norm {
        Some([wq, wk]) => qk_norm_forward(qkv, wq, wk, nh, kv, cfg.norm_eps)?.0,
        None => qkv,
    };
    let qkv = rope_qk_forward(qkv, &rope.rows(start, t)?, nh, kv)?;
    let q = qkv.narrow(2, 0, nh * hs)?;
    let k = qkv.narrow(2, nh * hs, kv * hs)?;
    let v = qkv.narrow(2, (nh + kv) * hs, kv * hs)?;
    let y = cached_attention(&q, &k, &v, nh, cache)?.reshape((t, nh * hs))?;
    let attn_out = dense.cols_forward(&y, std::slice::from_ref(&w.o), None, None)?;
    // h = x + o_proj(y), then its norm, in one pass
    let (h, n2, _) = add_rmsnorm_forward(&xf, &attn_out, &w.post_norm, cfg.norm_eps)?;
    let gu = dense.cols_forward(&n2, std::slice::from_ref(&w.gate_up), None, None)?;
    let act = swiglu_packed_forward(&gu)?;
    let out = dense.cols_forward(&act, std::slice::from_ref(&w.down), None, Some(&h))?;
    Ok(out.reshape((1, t, c))?)
}

/// The logits `(V)` of the last position of `x (1, T, C)` (a block stack's output):
/// [`final_norm_forward`] of that row (`norm_params`, the `norm` unit's buffer), then
/// `norm(x_last) @ W^T` with `W (V, C)` the head's weight in `head_params`, the buffer of the
/// unit [`head_unit`] names (the embedding when tied, the final norm otherwise). In the
/// parameters' dtype.
pub fn logits_decode(
    cfg: &ModelConfig,
    norm_params: &Tensor,
    head_params: &Tensor,
    x: &Tensor,
) -> Result<Tensor> {
    let (unit, name) = head_unit(cfg);
    let t = check_one_sequence(cfg, x, "lm head input")?;
    let (y, _) = final_norm_forward(cfg, norm_params, &x.narrow(1, t - 1, 1)?)?;
    units::last_logits(cfg, (&unit, name), head_params, &y)
}
