//! Incremental decoding with a KV cache: sampling text from a model, one token a forward.
//!
//! Training runs every unit over whole `(B, T)` windows. Generation instead feeds a prompt once
//! (*prefill*: one forward over its `P` tokens) and then one token a forward, each step's
//! attention reading the keys and values of every earlier position from a [`KvCache`] rather
//! than recomputing them. So a step costs one row of every projection and one row of attention
//! against the cache, not a forward over the whole context.
//!
//! The pieces, llm.c style: each family's decode step sits beside its training forward and
//! uses the same layer functions for norms, projections, GELU/SwiGLU and residuals
//! ([`crate::Family::block_decode`], the embedding at offset positions and the logits of the
//! last position); the attention of new queries against the cache is [`cached_attention`]
//! here, shared by every family (GPT-2 is its `KV = NH` case). [`Decoder`] walks the units of
//! a whole model (one flat buffer each, in [`crate::ModelLayout`] order, as the trainer holds
//! them), asking the family for each step, and samples ([`Decoder::generate`], [`Sampling`]).
//!
//! Positions: a cache holding `len` positions feeds the next tokens at `len, len + 1, ..`:
//! GPT-2 adds `wpe[len..]`, Llama rotates q and k by those positions' angles. The model has no
//! positions at or beyond `cfg.seq_len` (GPT-2's `wpe` has `seq_len` rows; Llama was trained
//! on windows of that length), so a cache holds at most `seq_len` positions and generation
//! stops when it is full.
//!
//! Devices and dtypes: everything is candle ops or the layer functions, which pick the fused
//! CUDA kernels themselves for bf16 tensors on a GPU, so a [`Decoder`] runs on whatever device
//! and dtype its buffers have: f32 (or f64) on the CPU (candle's CPU matmul takes no bf16),
//! f32 or bf16 on a GPU. Attention scores and their softmax run in f32 (f64 for f64), as the
//! training references do; the logits come back as f32 on the host.

use candle_core::{DType, Device, Tensor, D};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::RopeTables;
use crate::layout::ModelLayout;

mod sample;

pub use sample::Sampling;

// ------------------------------------------------------------------------------------------
// KV cache

/// One block's cached keys and values, `(1, KV, capacity, hs)` each, of which the first `len`
/// positions are filled.
///
/// Preallocated to its capacity and written in place (`slice_set`), not grown by
/// `Tensor::cat`: a cat copies the whole cache at every step (an allocation and a read and
/// write of everything cached, per layer per token), while a write touches only the new
/// positions; the memory is taken once, up front, so a context that does not fit fails at
/// [`KvCache::new`] rather than mid-generation; and rewinding ([`KvCache::truncate`]) is free.
/// The attention reads the filled part as a strided view, which the matmuls take as is.
///
/// Not `Clone`: a clone of its tensors would share their storage, and writes through one
/// would show through the other.
#[derive(Debug)]
pub struct LayerCache {
    k: Tensor,
    v: Tensor,
    len: usize,
}

impl LayerCache {
    /// An empty cache for `capacity` positions of `n_kv_head` heads of `head_dim` channels.
    pub fn new(
        n_kv_head: usize,
        head_dim: usize,
        capacity: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let shape = (1, n_kv_head, capacity, head_dim);
        Ok(LayerCache {
            k: Tensor::zeros(shape, dtype, device)?,
            v: Tensor::zeros(shape, dtype, device)?,
            len: 0,
        })
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions it has room for.
    pub fn capacity(&self) -> usize {
        self.k.dims()[2]
    }

    /// Key/value heads (KV).
    pub fn n_kv_head(&self) -> usize {
        self.k.dims()[1]
    }

    /// Channels of a head (hs).
    pub fn head_dim(&self) -> usize {
        self.k.dims()[3]
    }

    /// The cached keys `(1, KV, len, hs)`: a view of the filled positions.
    pub fn keys(&self) -> Result<Tensor> {
        Ok(self.k.narrow(2, 0, self.len)?)
    }

    /// The cached values `(1, KV, len, hs)`: a view of the filled positions.
    pub fn values(&self) -> Result<Tensor> {
        Ok(self.v.narrow(2, 0, self.len)?)
    }

    /// Writes `k, v (1, T, KV*hs)` (heads side by side, as the projections write them) at
    /// positions `len..len + T`, then counts them. An error (nothing counted) when they do not
    /// fit or do not match the cache's heads, dtype or device.
    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let (kv, hs) = (self.n_kv_head(), self.head_dim());
        let t = k.dim(1)?;
        for x in [k, v] {
            if x.dims() != [1, t, kv * hs] {
                return Err(ModelError::ShapeMismatch {
                    what: "decode k, v",
                    expected: vec![1, t, kv * hs],
                    got: x.dims().to_vec(),
                });
            }
        }
        if self.len + t > self.capacity() {
            return Err(ModelError::ContextFull {
                len: self.len,
                new: t,
                capacity: self.capacity(),
            });
        }
        let heads = |x: &Tensor| -> Result<Tensor> {
            Ok(x.reshape((1, t, kv, hs))?.transpose(1, 2)?.contiguous()?)
        };
        self.k.slice_set(&heads(k)?, 2, self.len)?;
        self.v.slice_set(&heads(v)?, 2, self.len)?;
        self.len += t;
        Ok(())
    }
}

/// The keys and values of every block ([`LayerCache`]), all holding the same positions: what
/// a [`Decoder`] reads and extends at each step. Make it with [`Decoder::cache`] (or
/// [`KvCache::new`]); one cache is one sequence.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `capacity` positions of `cfg`'s blocks (`L` of them, each
    /// `2 * KV * hs * capacity` elements of `dtype`), on `device`. The dtype and device must be
    /// those of the decoder's parameters. An error if `capacity > cfg.seq_len`: the model has
    /// no positions beyond it.
    pub fn new(cfg: &ModelConfig, capacity: usize, dtype: DType, device: &Device) -> Result<Self> {
        if capacity > cfg.seq_len {
            return Err(ModelError::SequenceTooLong {
                got: capacity,
                max: cfg.seq_len,
            });
        }
        let layers = (0..cfg.n_layer)
            .map(|_| LayerCache::new(cfg.n_kv_head, cfg.head_dim, capacity, dtype, device))
            .collect::<Result<_>>()?;
        Ok(KvCache { layers })
    }

    /// Positions cached (the next token goes at this position).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions it has room for.
    pub fn capacity(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::capacity)
    }

    /// Forgets the positions from `len` on (nothing when it holds fewer): e.g. to go back to a
    /// shared prompt and sample another continuation. Free: the memory stays allocated.
    pub fn truncate(&mut self, len: usize) {
        for layer in &mut self.layers {
            layer.len = layer.len.min(len);
        }
    }

    /// Forgets every position (a new sequence).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Block `l`'s cache.
    pub fn layer(&self, l: usize) -> &LayerCache {
        &self.layers[l]
    }

    /// Block `l`'s cache, to pass to a block's decode step.
    pub fn layer_mut(&mut self, l: usize) -> &mut LayerCache {
        &mut self.layers[l]
    }
}

// ------------------------------------------------------------------------------------------
// Attention against the cache

/// Checks that `x` is `(1, T, C)` with `1 <= T <= seq_len` (one sequence's new positions, as
/// every decode step takes); returns `T`.
pub(crate) fn check_one_sequence(
    cfg: &ModelConfig,
    x: &Tensor,
    what: &'static str,
) -> Result<usize> {
    match x.dims() {
        [1, t, c] if *c == cfg.n_embd && (1..=cfg.seq_len).contains(t) => Ok(*t),
        d => Err(ModelError::ShapeMismatch {
            what,
            expected: vec![1, d.get(1).copied().unwrap_or(1).max(1), cfg.n_embd],
            got: d.to_vec(),
        }),
    }
}

/// The dtype of scores and softmax: f64 for f64, f32 otherwise (as the training references).
fn stat_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// Additive mask `(T, start + T)` of `T` new queries at positions `start..` against every key:
/// query `i` sees keys `0..=start + i` (0), not the later new ones (`-inf`).
fn offset_causal_mask(t: usize, start: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let len = start + t;
    let m: Vec<f32> = (0..t * len)
        .map(|ij| {
            if ij % len > start + ij / len {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Ok(Tensor::from_vec(m, (t, len), device)?.to_dtype(dtype)?)
}

/// Causal (grouped-query) attention of `T` new positions against a cache: appends `k, v
/// (1, T, KV*hs)` to `cache` at positions `len..len + T`, then
/// `y = softmax(q K^T / sqrt(hs) + mask) V` over the `len + T` cached keys and values, query
/// `i` seeing positions up to its own, `len + i` (no mask when `T = 1`).
///
/// Shapes: `q (1, T, NH*hs)` -> `y (1, T, NH*hs)`, heads merged. `KV` and `hs` are the cache's;
/// query head `h` reads kv head `h / (NH / KV)` (HF `repeat_kv`), by stacking a group's query
/// heads along the rows against its one k and v, never copying them. The matmuls run in the
/// input dtype, the scaling, mask and softmax in f32 (f64 for f64), the probabilities cast back
/// for `att @ V`, as in [`crate::layers::gqa_packed_forward`].
///
/// Positions come in by the caller: it rotates q and k (Llama) or added `wpe` (GPT-2) for
/// positions `cache.len()..` before calling. On an error after the append (a failed matmul)
/// the cache keeps the new positions; [`Decoder::forward`] rolls them back.
pub fn cached_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    n_head: usize,
    cache: &mut LayerCache,
) -> Result<Tensor> {
    let (b, t, c) = q.dims3()?;
    let (kv, hs) = (cache.n_kv_head(), cache.head_dim());
    if b != 1 || c != n_head * hs || !n_head.is_multiple_of(kv) {
        return Err(ModelError::ShapeMismatch {
            what: "decode q (KV, hs of the cache)",
            expected: vec![1, t, n_head * hs],
            got: q.dims().to_vec(),
        });
    }
    let g = n_head / kv;
    let start = cache.len();
    cache.append(k, v)?;
    let len = cache.len();
    let (keys, values) = (cache.keys()?, cache.values()?);
    // (1, T, KV, G, hs) -> (1, KV, G*T, hs): head h = kv*G + g at rows g*T..(g+1)*T
    let qg = q
        .reshape((1, t, kv, g, hs))?
        .permute((0, 2, 3, 1, 4))?
        .contiguous()?
        .reshape((1, kv, g * t, hs))?;
    let sd = stat_dtype(q.dtype());
    let mut scores = qg
        .matmul(&keys.t()?)?
        .to_dtype(sd)?
        .affine(1.0 / (hs as f64).sqrt(), 0.0)?;
    if t > 1 {
        let mask = offset_causal_mask(t, start, sd, q.device())?;
        scores = scores
            .reshape((1, kv, g, t, len))?
            .broadcast_add(&mask)?
            .reshape((1, kv, g * t, len))?;
    }
    // Stable softmax; a query always sees its own key, so every row's max is finite.
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let att = e
        .broadcast_div(&e.sum_keepdim(D::Minus1)?)?
        .to_dtype(q.dtype())?;
    let y = att.matmul(&values)?; // (1, KV, G*T, hs)
    Ok(y.reshape((1, kv, g, t, hs))?
        .permute((0, 3, 1, 2, 4))?
        .contiguous()?
        .reshape((1, t, n_head * hs))?)
}

// ------------------------------------------------------------------------------------------
// Decoder

/// A whole model for incremental decoding: its config and one flat parameter buffer a unit,
/// on one device in one dtype (see the module doc for which). Feeds tokens through a
/// [`KvCache`] ([`Decoder::forward`]) and samples ([`Decoder::generate`]).
///
/// ```
/// use candle_core::{Device, Tensor};
/// use model::decode::{Decoder, Sampling};
/// use model::{init_unit_range, ModelConfig, ModelLayout};
/// let cfg = ModelConfig::gpt2(1, 8, 2, 6, 10);
/// let units: Vec<Tensor> = ModelLayout::new(&cfg).units.iter().map(|u| {
///     let mut buf = vec![0f32; u.numel];
///     init_unit_range(&cfg, u, 0, 0, &mut buf);
///     Tensor::from_vec(buf, u.numel, &Device::Cpu).unwrap()
/// }).collect();
/// let dec = Decoder::new(cfg, units).unwrap();
/// let mut cache = dec.cache(6).unwrap();
/// let logits = dec.forward(&[1, 2, 3], &mut cache).unwrap(); // prefill
/// assert_eq!((logits.len(), cache.len()), (10, 3));
/// let out = dec.generate(&[1, 2, 3], &Sampling::greedy(100), |_| true).unwrap();
/// assert_eq!(out.len(), 6 + 1 - 3); // stops once the 6 positions are filled
/// ```
#[derive(Clone, Debug)]
pub struct Decoder {
    cfg: ModelConfig,
    units: Vec<Tensor>,
    /// The family's rotary tables for positions `0..seq_len`, in the parameters' dtype
    /// ([`crate::Family::rope`]; none for learned positions).
    rope: Option<RopeTables>,
}

impl Decoder {
    /// A decoder of `cfg` over `units`: one 1-D buffer a unit in [`ModelLayout`] order
    /// (embedding, blocks, final norm), each at least the unit's numel long (padding at the end
    /// is ignored), all on one device in one float dtype. An error if `cfg` is invalid, the count
    /// or a length is wrong, or the dtypes or devices differ.
    pub fn new(cfg: ModelConfig, units: Vec<Tensor>) -> Result<Decoder> {
        cfg.validate()?;
        let layout = ModelLayout::new(&cfg);
        if units.len() != layout.units.len() {
            return Err(ModelError::UnitCount {
                expected: layout.units.len(),
                got: units.len(),
            });
        }
        let (dtype, device) = (units[0].dtype(), units[0].device().clone());
        if !dtype.is_float() {
            return Err(ModelError::DecodeMismatch {
                what: "parameters",
                reason: format!("dtype {dtype:?} is not a float"),
            });
        }
        for (u, p) in layout.units.iter().zip(&units) {
            match p.dims() {
                [n] if *n >= u.numel => {}
                d => {
                    return Err(ModelError::DecodeMismatch {
                        what: "parameters",
                        reason: format!(
                            "unit `{}` needs a 1-D buffer of >= {} elements, got shape {d:?}",
                            u.name, u.numel
                        ),
                    })
                }
            }
            if p.dtype() != dtype || !p.device().same_device(&device) {
                return Err(ModelError::DecodeMismatch {
                    what: "parameters",
                    reason: format!(
                        "unit `{}` is {:?} on {:?}, the embedding {dtype:?} on {:?}",
                        u.name,
                        p.dtype(),
                        p.device().location(),
                        device.location()
                    ),
                });
            }
        }
        let rope = cfg.family().rope(&cfg, dtype, &device)?;
        Ok(Decoder { cfg, units, rope })
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device the parameters (and caches, and every step) live on.
    pub fn device(&self) -> &Device {
        self.units[0].device()
    }

    /// The parameters' dtype, which the activations and caches take.
    pub fn dtype(&self) -> DType {
        self.units[0].dtype()
    }

    /// An empty [`KvCache`] for `capacity` positions (at most `seq_len`) in this decoder's
    /// dtype and device.
    pub fn cache(&self, capacity: usize) -> Result<KvCache> {
        KvCache::new(&self.cfg, capacity, self.dtype(), self.device())
    }

    /// An error unless `cache` has this model's blocks, heads, dtype and device.
    fn check_cache(&self, cache: &KvCache) -> Result<()> {
        let cfg = &self.cfg;
        let fits = cache.layers.len() == cfg.n_layer
            && cache.layers.iter().all(|l| {
                l.n_kv_head() == cfg.n_kv_head
                    && l.head_dim() == cfg.head_dim
                    && l.len == cache.len()
                    && l.k.dtype() == self.dtype()
                    && l.k.device().same_device(self.device())
            });
        if fits {
            return Ok(());
        }
        let l = cache.layers.first();
        Err(ModelError::DecodeMismatch {
            what: "KV cache",
            reason: format!(
                "{} layers of {:?} heads x {:?} channels, {:?}, for a model of {} x {} x {}, {:?}",
                cache.layers.len(),
                l.map(LayerCache::n_kv_head),
                l.map(LayerCache::head_dim),
                l.map(|l| l.k.dtype()),
                cfg.n_layer,
                cfg.n_kv_head,
                cfg.head_dim,
                self.dtype()
            ),
        })
    }

    /// Feeds `tokens` at the cache's next positions (`cache.len()..`), extending it, and returns
    /// the logits `(V)` of the last of them, as f32 on the host: a prefill when given a whole
    /// prompt, a decode step when given one token (any number works, causal among themselves).
    ///
    /// An error, with the cache unchanged, when `tokens` is empty, an id is not below
    /// `vocab_size`, they do not fit in the cache (whose capacity is at most `seq_len`), or
    /// the cache is not this model's.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
        self.check_cache(cache)?;
        if tokens.is_empty() {
            return Err(ModelError::NoTokens { what: "tokens" });
        }
        let start = cache.len();
        if start + tokens.len() > cache.capacity() {
            return Err(ModelError::ContextFull {
                len: start,
                new: tokens.len(),
                capacity: cache.capacity(),
            });
        }
        let vocab_size = self.cfg.vocab_size;
        if let Some(&token) = tokens.iter().find(|&&x| x as usize >= vocab_size) {
            return Err(ModelError::TokenOutOfVocab { token, vocab_size });
        }
        let out = self.forward_units(tokens, start, cache);
        if out.is_err() {
            cache.truncate(start);
        }
        out
    }

    /// [`Decoder::forward`] once its arguments are checked: embedding, blocks, head.
    fn forward_units(&self, tokens: &[u32], start: usize, cache: &mut KvCache) -> Result<Vec<f32>> {
        let (cfg, p) = (&self.cfg, &self.units);
        let family = cfg.family();
        let ids = Tensor::from_slice(tokens, (1, tokens.len()), self.device())?;
        let mut x = family.embedding_decode(cfg, &p[0], &ids, start)?;
        for (l, layer) in cache.layers.iter_mut().enumerate() {
            x = family.block_decode(cfg, &p[1 + l], &x, layer, self.rope.as_ref())?;
        }
        let logits = family.logits_decode(cfg, p, &x)?;
        Ok(logits.to_dtype(DType::F32)?.to_vec1()?)
    }

    /// Generates up to `opts.max_new_tokens` tokens after `prompt` and returns them (not the
    /// prompt), calling `on_token` with each as it comes (to stream it; the stop token too).
    ///
    /// The prompt goes in one forward (prefill), then each new token in one forward. It stops
    /// after `max_new_tokens` tokens; after `opts.stop` (returned as the last token); when
    /// `on_token` returns `false` (that token is returned); or when the context is full: the
    /// cache holds at most `seq_len` positions, so the last token is the one predicted at
    /// position `seq_len - 1` and `prompt.len() + returned.len() <= seq_len + 1`.
    ///
    /// An error if the prompt is empty or longer than `seq_len`, has an id not below
    /// `vocab_size`, or the options are invalid (a negative temperature, `top_k = Some(0)`).
    pub fn generate(
        &self,
        prompt: &[u32],
        opts: &Sampling,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        opts.validate()?;
        if prompt.is_empty() {
            return Err(ModelError::NoTokens { what: "prompt" });
        }
        let seq_len = self.cfg.seq_len;
        if prompt.len() > seq_len {
            return Err(ModelError::SequenceTooLong {
                got: prompt.len(),
                max: seq_len,
            });
        }
        let mut out = Vec::new();
        if opts.max_new_tokens == 0 {
            return Ok(out);
        }
        // The last new token is never fed: room for the prompt and the others.
        // Saturating: `--max-new-tokens` may be any u64 a user types.
        let capacity = seq_len.min(prompt.len().saturating_add(opts.max_new_tokens - 1));
        let mut cache = self.cache(capacity)?;
        let mut rng = StdRng::seed_from_u64(opts.seed);
        let mut logits = self.forward(prompt, &mut cache)?;
        loop {
            let token = opts.pick(&logits, &mut rng);
            out.push(token);
            let go_on = on_token(token);
            if !go_on
                || opts.stop == Some(token)
                || out.len() >= opts.max_new_tokens
                || cache.len() >= cache.capacity()
            {
                return Ok(out);
            }
            logits = self.forward(&[token], &mut cache)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_mask_hides_only_later_new_positions() {
        let m = offset_causal_mask(2, 3, DType::F32, &Device::Cpu).unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(
            m.to_vec2::<f32>().unwrap(),
            vec![vec![0.0, 0.0, 0.0, 0.0, inf], vec![0.0; 5]]
        );
    }
}
