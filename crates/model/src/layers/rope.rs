//! Rotary position embedding (RoPE) in Hugging Face's rotate-half convention
//! (`LlamaForCausalLM`, `apply_rotary_pos_emb`):
//! `out = x * cos + rotate_half(x) * sin`, `rotate_half(x) = cat(-x[..., hs/2:], x[..., :hs/2])`.
//!
//! Size letters: `B` batch, `T` positions, `H` heads (query or key/value), `hs` head size.
//!
//! The tables: `inv_freq[i] = 1 / theta^(2i / hs)` for `i < hs/2`, `freqs[t, i] = t * inv_freq[i]`,
//! `cos = cos(cat(freqs, freqs))`, `sin` likewise. Each position's pairs `(i, i + hs/2)` are
//! rotated by the angle `freqs[t, i]`, so the map is orthogonal and its transpose (backward) is
//! the rotation by minus the angle. A [`RopeScaling`] rescales `inv_freq` (Llama 3.1's long
//! context); nothing else changes, and the tables are made once, so scaling costs no step time.

use candle_core::{DType, Device, Tensor, D};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// How the rotary frequencies are rescaled, as transformers' `rope_type` names it and with its
/// keys (`modeling_rope_utils`); serialised as config.json writes it
/// (`{"rope_type": "llama3", "factor": 8.0, ...}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// `inv_freq[i] = 1 / theta^(2i / hs)` as it is.
    #[default]
    Default,
    /// Llama 3.1's (`_compute_llama3_parameters`): frequencies whose wavelength exceeds
    /// `original_max_position_embeddings / low_freq_factor` are divided by `factor`, those
    /// under `original_max_position_embeddings / high_freq_factor` kept, and those between
    /// blended smoothly.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// Why these settings make no frequencies, as the rest of a one-line message naming the
    /// key (`factor = 0 is not a number of at least 1`); `None` when they are sound.
    pub fn problem(&self) -> Option<String> {
        match *self {
            RopeScaling::Default => None,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                if !(factor >= 1.0 && factor.is_finite()) {
                    Some(format!("factor = {factor} is not a number of at least 1"))
                } else if !(low_freq_factor > 0.0 && high_freq_factor > low_freq_factor)
                    || !high_freq_factor.is_finite()
                {
                    Some(format!(
                        "low_freq_factor = {low_freq_factor}, high_freq_factor = \
                         {high_freq_factor}: need 0 < low_freq_factor < high_freq_factor"
                    ))
                } else if original_max_position_embeddings == 0 {
                    Some("original_max_position_embeddings = 0 is not a length".into())
                } else {
                    None
                }
            }
        }
    }

    /// `inv` rescaled, in f32 as transformers computes it (each scalar rounded to f32 where
    /// torch casts a Python float into a float32 tensor op).
    fn apply_f32(&self, inv: &mut [f32]) {
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = *self
        else {
            return;
        };
        let old = original_max_position_embeddings as f64;
        let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
        let (factor32, lo32, hi32) = (
            factor as f32,
            low_freq_factor as f32,
            high_freq_factor as f32,
        );
        for f in inv.iter_mut() {
            let wavelen = (2.0 * std::f64::consts::PI) as f32 / *f;
            let scaled = match wavelen > low_wavelen as f32 {
                true => *f / factor32,
                false => *f,
            };
            let medium = !(wavelen < high_wavelen as f32) && !(wavelen > low_wavelen as f32);
            *f = match medium {
                true => {
                    let smooth = (old as f32 / wavelen - lo32) / (hi32 - lo32);
                    (1.0 - smooth) * scaled / factor32 + smooth * scaled
                }
                false => scaled,
            };
        }
    }
}

/// As a TOML inline table, the way `[model] rope_scaling` is written:
/// `{ rope_type = "llama3", factor = 32.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
/// original_max_position_embeddings = 8192 }`.
impl std::fmt::Display for RopeScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RopeScaling::Default => write!(f, "{{ rope_type = \"default\" }}"),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => write!(
                f,
                "{{ rope_type = \"llama3\", factor = {factor:?}, low_freq_factor = \
                 {low_freq_factor:?}, high_freq_factor = {high_freq_factor:?}, \
                 original_max_position_embeddings = {original_max_position_embeddings} }}"
            ),
        }
    }
}

impl RopeScaling {
    /// [`RopeScaling::apply_f32`] in f64, for the f64 reference.
    fn apply_f64(&self, inv: &mut [f64]) {
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = *self
        else {
            return;
        };
        let old = original_max_position_embeddings as f64;
        let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
        for f in inv.iter_mut() {
            let wavelen = 2.0 * std::f64::consts::PI / *f;
            let scaled = match wavelen > low_wavelen {
                true => *f / factor,
                false => *f,
            };
            let medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            *f = match medium {
                true => {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * scaled / factor + smooth * scaled
                }
                false => scaled,
            };
        }
    }
}

/// The `cos` and `sin` tables of [`rope_forward`], `(T, hs)` each, in the activations' dtype.
#[derive(Clone, Debug)]
pub struct RopeTables {
    /// `cos(cat(freqs, freqs))`, `(T, hs)`.
    pub cos: Tensor,
    /// `sin(cat(freqs, freqs))`, `(T, hs)`.
    pub sin: Tensor,
}

impl RopeTables {
    /// The tables' rows `start..start + len`: the angles of positions `start..`, for the `len`
    /// tokens an incremental decode step feeds after `start` cached ones (row `t` of a table is
    /// position `t`'s, whatever the table's length). Views, no copy. An error if the tables
    /// have fewer than `start + len` rows.
    pub fn rows(&self, start: usize, len: usize) -> Result<RopeTables> {
        Ok(RopeTables {
            cos: self.cos.narrow(0, start, len)?,
            sin: self.sin.narrow(0, start, len)?,
        })
    }
}

/// The tables for positions `0..seq_len` of heads of `head_dim` (even) channels, of base
/// `theta`, the frequencies rescaled by `scaling`.
///
/// Computed on the host in f32 as Hugging Face does (`inv_freq` from `arange(0, hs, 2).float()
/// / hs`, `freqs = position.float() * inv_freq`, then `cos`, `sin`, cast to `dtype`), and in f64
/// when `dtype` is f64 (the reference keeps its precision there). Then copied to `device`.
///
/// On a GPU the tables are made once per thread, length, head size, base and dtype, and kept:
/// a block's forward asks for them every call, and a fresh upload each time would wait on the
/// host.
///
/// # Panics
/// If `head_dim` is odd (`ModelConfig::validate` rejects that for Llama).
pub fn rope_tables(
    seq_len: usize,
    head_dim: usize,
    theta: f64,
    scaling: &RopeScaling,
    dtype: DType,
    device: &Device,
) -> Result<RopeTables> {
    if device.is_cuda() {
        type Key = (String, usize, usize, u64, String, DType);
        thread_local! {
            static KEPT: std::cell::RefCell<std::collections::HashMap<Key, RopeTables>> =
                Default::default();
        }
        let key: Key = (
            format!("{:?}", device.location()),
            seq_len,
            head_dim,
            theta.to_bits(),
            format!("{scaling:?}"),
            dtype,
        );
        if let Some(t) = KEPT.with(|m| m.borrow().get(&key).cloned()) {
            return Ok(t);
        }
        let t = host_tables(seq_len, head_dim, theta, scaling, dtype, device)?;
        KEPT.with(|m| m.borrow_mut().insert(key, t.clone()));
        return Ok(t);
    }
    host_tables(seq_len, head_dim, theta, scaling, dtype, device)
}

/// `inv_freq[i]`, `i < head_dim / 2`, in f32 as transformers computes it: `1 / theta^(2i /
/// head_dim)`, then rescaled by `scaling`.
pub fn inv_freq(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    let base = theta as f32;
    let mut inv: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    scaling.apply_f32(&mut inv);
    inv
}

/// [`rope_tables`] computed on the host and copied to `device`.
fn host_tables(
    seq_len: usize,
    head_dim: usize,
    theta: f64,
    scaling: &RopeScaling,
    dtype: DType,
    device: &Device,
) -> Result<RopeTables> {
    assert!(
        head_dim.is_multiple_of(2),
        "rope: head_dim {head_dim} must be even"
    );
    let half = head_dim / 2;
    let (cos, sin) = if dtype == DType::F64 {
        let mut inv: Vec<f64> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64))
            .collect();
        scaling.apply_f64(&mut inv);
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
        let inv = inv_freq(head_dim, theta, scaling);
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

/// [`rope_forward`] on the query and key heads of the packed projection `qkv (B, T, W)`,
/// `W = (NH + 2 KV) * hs` (columns `[q | k | v]`); the v heads pass unchanged. On the GPU the
/// heads are turned in place, in `qkv`'s own storage (so `qkv` is taken by value: no other
/// handle may still want the unturned values), with no pass over v.
pub fn rope_qk_forward(
    qkv: Tensor,
    tables: &RopeTables,
    n_head: usize,
    n_kv_head: usize,
) -> Result<Tensor> {
    rope_qk(qkv, tables, n_head, n_kv_head, 1.0)
}

/// [`rope_backward`] on the packed gradient `dqkv (B, T, W)`: dq and dk turned back, dv
/// unchanged. In place on the GPU, like [`rope_qk_forward`].
pub fn rope_qk_backward(
    dqkv: Tensor,
    tables: &RopeTables,
    n_head: usize,
    n_kv_head: usize,
) -> Result<Tensor> {
    rope_qk(dqkv, tables, n_head, n_kv_head, -1.0)
}

/// Turns the q and k heads of `qkv` by `sign` times their angles.
fn rope_qk(
    qkv: Tensor,
    tables: &RopeTables,
    n_head: usize,
    n_kv_head: usize,
    sign: f32,
) -> Result<Tensor> {
    let (b, t, w) = qkv.dims3()?;
    let hs = tables.cos.dim(1)?;
    if w != (n_head + 2 * n_kv_head) * hs {
        return Err(crate::error::ModelError::ShapeMismatch {
            what: "rope qkv",
            expected: vec![b, t, (n_head + 2 * n_kv_head) * hs],
            got: qkv.dims().to_vec(),
        });
    }
    #[cfg(feature = "cuda")]
    if qkv.device().is_cuda() {
        let _span = kernels::profile::scope(qkv.device(), kernels::profile::Family::Elementwise);
        if cuda::turn_in_place(&qkv, tables, n_head + n_kv_head, sign)? {
            return Ok(qkv);
        }
        super::declined("rope::turn_in_place", &qkv)?;
    }
    let turn = |x: &Tensor| {
        if sign > 0.0 {
            rope_forward(x, tables)
        } else {
            rope_backward(x, tables)
        }
    };
    let q = turn(&qkv.narrow(2, 0, n_head * hs)?.reshape((b, t, n_head, hs))?)?;
    let k = turn(
        &qkv.narrow(2, n_head * hs, n_kv_head * hs)?
            .reshape((b, t, n_kv_head, hs))?,
    )?;
    let v = qkv.narrow(2, (n_head + n_kv_head) * hs, n_kv_head * hs)?;
    Ok(Tensor::cat(
        &[
            q.reshape((b, t, n_head * hs))?,
            k.reshape((b, t, n_kv_head * hs))?,
            v,
        ],
        2,
    )?)
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launcher of `kernels/cuda/rope.cu`: two pairs a thread, in place; bf16 `qkv` and tables,
    //! contiguous, with `hs % 4 == 0`; anything else returns `false` (the reference runs).
    use super::RopeTables;
    use crate::error::Result;
    use crate::gpu;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{DType, Tensor};
    use kernels::Precision;

    /// Turns the first `heads` heads of every row of `qkv (B, T, W)` in place; `false` (nothing
    /// queued) where the kernel does not take the inputs.
    pub(super) fn turn_in_place(
        qkv: &Tensor,
        tables: &RopeTables,
        heads: usize,
        sign: f32,
    ) -> Result<bool> {
        let (b, t, w) = qkv.dims3()?;
        let (rows, hs) = tables.cos.dims2()?;
        let takes = [qkv, &tables.cos, &tables.sin]
            .iter()
            .all(|x| x.dtype() == DType::BF16 && x.is_contiguous())
            && hs % 4 == 0
            && rows >= t
            && (b * t * heads * hs / 4) < i32::MAX as usize;
        if !takes || gpu::ptr(qkv)? % 4 != 0 {
            return Ok(false);
        }
        let n = b * t;
        let items = n * heads * hs / 4;
        let dev = gpu::device(qkv)?;
        let func = gpu::function(&dev, Precision::Bf16, &kernels::ROPE, &[], "rope_qk")?;
        let (p, pc, ps) = (
            gpu::ptr(qkv)?,
            gpu::ptr(&tables.cos)?,
            gpu::ptr(&tables.sin)?,
        );
        let cfg = LaunchConfig {
            grid_dim: (items.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: qkv (N, W) bf16 contiguous, its first `heads * hs` columns turned in place;
        // the tables (>= T, hs) bf16; arguments in kernel order.
        unsafe {
            func.launch(
                cfg,
                &[
                    &p,
                    &pc,
                    &ps,
                    &(n as i32),
                    &(t as i32),
                    &(w as i32),
                    &(heads as i32),
                    &(hs as i32),
                    &sign,
                ],
            )?;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our frequencies under Llama 3's scaling are transformers' (`_compute_llama3_parameters`,
    /// the fixture `scripts/rope-fixture.py` wrote with it), to an f32 rounding; and the f64
    /// reference agrees with them.
    #[test]
    fn llama3_scaling_gives_transformers_frequencies() {
        let text = std::fs::read_to_string("../../tests/fixtures/rope/llama3.json").unwrap();
        let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
        for case in fixture["cases"].as_array().unwrap() {
            let p = &case["rope_parameters"];
            let scaling: RopeScaling = serde_json::from_value(serde_json::json!({
                "rope_type": "llama3",
                "factor": p["factor"],
                "low_freq_factor": p["low_freq_factor"],
                "high_freq_factor": p["high_freq_factor"],
                "original_max_position_embeddings": p["original_max_position_embeddings"],
            }))
            .unwrap();
            let hs = case["head_dim"].as_u64().unwrap() as usize;
            let theta = p["rope_theta"].as_f64().unwrap();
            let ours = inv_freq(hs, theta, &scaling);
            let unscaled = inv_freq(hs, theta, &RopeScaling::Default);
            let theirs: Vec<f64> = case["inv_freq"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert_eq!(ours.len(), theirs.len());
            let mut f64s: Vec<f64> = (0..hs / 2)
                .map(|i| 1.0 / theta.powf((2 * i) as f64 / hs as f64))
                .collect();
            scaling.apply_f64(&mut f64s);
            let mut changed = 0;
            for (i, (&a, &b)) in ours.iter().zip(&theirs).enumerate() {
                assert!(
                    (a as f64 - b).abs() <= 2e-7 * b,
                    "hs {hs}, inv_freq[{i}]: {a} vs {b}"
                );
                assert!((f64s[i] - b).abs() <= 1e-6 * b, "f64, hs {hs}, [{i}]");
                changed += (a != unscaled[i]) as usize;
            }
            // Every case rescales some frequencies and keeps the highest.
            assert!(changed > 0 && ours[0] == unscaled[0], "hs {hs}");
        }
    }

    #[test]
    fn settings_that_make_no_frequencies_are_named() {
        let llama3 = |factor, low, high, original| RopeScaling::Llama3 {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: original,
        };
        assert_eq!(llama3(8.0, 1.0, 4.0, 8192).problem(), None);
        assert!(llama3(0.5, 1.0, 4.0, 8192)
            .problem()
            .unwrap()
            .contains("factor = 0.5"));
        assert!(llama3(8.0, 4.0, 1.0, 8192)
            .problem()
            .unwrap()
            .contains("low_freq_factor"));
        assert!(llama3(8.0, 1.0, 4.0, 0)
            .problem()
            .unwrap()
            .contains("original_max"));
        // Written as the TOML `[model] rope_scaling` reads back.
        let text = format!("s = {}", llama3(8.0, 1.0, 4.0, 8192));
        #[derive(Deserialize)]
        struct S {
            s: RopeScaling,
        }
        let back: S = toml::from_str(&text).unwrap();
        assert_eq!(back.s, llama3(8.0, 1.0, 4.0, 8192));
        let back: S = toml::from_str(&format!("s = {}", RopeScaling::Default)).unwrap();
        assert_eq!(back.s, RopeScaling::Default);
    }
}
