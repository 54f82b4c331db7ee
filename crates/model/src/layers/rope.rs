//! Rotary position embedding (RoPE) in Hugging Face's rotate-half convention
//! (`LlamaForCausalLM`, `apply_rotary_pos_emb`, no `rope_scaling`):
//! `out = x * cos + rotate_half(x) * sin`, `rotate_half(x) = cat(-x[..., hs/2:], x[..., :hs/2])`.
//!
//! Size letters: `B` batch, `T` positions, `H` heads (query or key/value), `hs` head size.
//!
//! The tables: `inv_freq[i] = 1 / theta^(2i / hs)` for `i < hs/2`, `freqs[t, i] = t * inv_freq[i]`,
//! `cos = cos(cat(freqs, freqs))`, `sin` likewise. Each position's pairs `(i, i + hs/2)` are
//! rotated by the angle `freqs[t, i]`, so the map is orthogonal and its transpose (backward) is
//! the rotation by minus the angle.

use candle_core::{DType, Device, Tensor, D};

use crate::error::Result;

/// The `cos` and `sin` tables of [`rope_forward`], `(T, hs)` each, in the activations' dtype.
#[derive(Clone, Debug)]
pub struct RopeTables {
    /// `cos(cat(freqs, freqs))`, `(T, hs)`.
    pub cos: Tensor,
    /// `sin(cat(freqs, freqs))`, `(T, hs)`.
    pub sin: Tensor,
}

/// The tables for positions `0..seq_len` of heads of `head_dim` (even) channels.
///
/// Computed on the host in f32 as Hugging Face does (`inv_freq` from `arange(0, hs, 2).float()
/// / hs`, `freqs = position.float() * inv_freq`, then `cos`, `sin`, cast to `dtype`), and in f64
/// when `dtype` is f64 (the reference keeps its precision there). Then copied to `device`.
///
/// # Panics
/// If `head_dim` is odd (`ModelConfig::validate` rejects that for Llama).
pub fn rope_tables(
    seq_len: usize,
    head_dim: usize,
    theta: f64,
    dtype: DType,
    device: &Device,
) -> Result<RopeTables> {
    assert!(
        head_dim.is_multiple_of(2),
        "rope: head_dim {head_dim} must be even"
    );
    let half = head_dim / 2;
    let (cos, sin) = if dtype == DType::F64 {
        let inv: Vec<f64> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64))
            .collect();
        let angles = (0..seq_len).flat_map(|t| (0..head_dim).map(move |j| (t, j)));
        let (c, s): (Vec<f64>, Vec<f64>) = angles
            .map(|(t, j)| (t as f64 * inv[j % half]).sin_cos())
            .map(|(s, c)| (c, s))
            .unzip();
        (
            Tensor::from_vec(c, (seq_len, head_dim), device)?,
            Tensor::from_vec(s, (seq_len, head_dim), device)?,
        )
    } else {
        let base = theta as f32;
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let angles = (0..seq_len).flat_map(|t| (0..head_dim).map(move |j| (t, j)));
        let (c, s): (Vec<f32>, Vec<f32>) = angles
            .map(|(t, j)| {
                let a = t as f32 * inv[j % half];
                (a.cos(), a.sin())
            })
            .unzip();
        (
            Tensor::from_vec(c, (seq_len, head_dim), device)?.to_dtype(dtype)?,
            Tensor::from_vec(s, (seq_len, head_dim), device)?.to_dtype(dtype)?,
        )
    };
    Ok(RopeTables { cos, sin })
}

/// `rotate_half(x) = cat(-x[..., hs/2:], x[..., :hs/2])` over the last dimension.
fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let hs = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, hs / 2)?;
    let x2 = x.narrow(D::Minus1, hs / 2, hs / 2)?;
    Ok(Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?)
}

/// The tables' first `T` rows shaped `(1, T, 1, hs)`, to broadcast over batch and heads.
fn tables_for(tables: &RopeTables, t: usize) -> Result<(Tensor, Tensor)> {
    let hs = tables.cos.dim(1)?;
    let shape = (1, t, 1, hs);
    Ok((
        tables.cos.narrow(0, 0, t)?.reshape(shape)?,
        tables.sin.narrow(0, 0, t)?.reshape(shape)?,
    ))
}

/// `out = x * cos + rotate_half(x) * sin`, position `t` taking row `t` of the tables.
///
/// Shapes: `x (B, T, H, hs)`, tables `(>= T, hs)` -> `out (B, T, H, hs)`. Backward needs only
/// the tables.
pub fn rope_forward(x: &Tensor, tables: &RopeTables) -> Result<Tensor> {
    let (_, t, _, _) = x.dims4()?;
    let (cos, sin) = tables_for(tables, t)?;
    Ok((x.broadcast_mul(&cos)? + rotate_half(x)?.broadcast_mul(&sin)?)?)
}

/// Gradient of [`rope_forward`]: the transpose, `dx = dy * cos - rotate_half(dy * sin)` (the
/// transpose of `rotate_half` is minus itself), which is the rotation of `dy` by minus the
/// angle. Returned, not accumulated.
///
/// Shapes: `dy (B, T, H, hs)`, tables `(>= T, hs)` -> `dx (B, T, H, hs)`.
pub fn rope_backward(dy: &Tensor, tables: &RopeTables) -> Result<Tensor> {
    let (_, t, _, _) = dy.dims4()?;
    let (cos, sin) = tables_for(tables, t)?;
    // out = x * cos + rotate_half(x) * sin
    Ok((dy.broadcast_mul(&cos)? - rotate_half(&dy.broadcast_mul(&sin)?)?)?)
}
