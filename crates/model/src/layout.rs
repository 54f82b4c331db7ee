//! The parameter layout: one table of `(name, shape, init, decay)` rows per unit.
//!
//! A *unit* is what the ZeRO engine gathers and releases as one flat buffer: the embedding,
//! each transformer block, and the final norm (GPT-2: `embedding` with `wte`, `wpe`; `h.l`;
//! `ln_f`. Llama: `embedding` with `embed_tokens`; `layers.l`; `norm`, with `lm_head` when the
//! head is untied). Every parameter is a named view `[offset, offset + numel)` into its unit's
//! buffer. Sizes, offsets, views, checkpoint keys, initialisation and weight-decay masks all
//! derive from the tables of [`UnitLayout::new`], so adding a tensor takes one line there.
//!
//! ```
//! use model::{preset, ModelLayout};
//! let cfg = preset("tiny").unwrap();
//! let layout = ModelLayout::new(&cfg);
//! assert_eq!(layout.units.len(), cfg.n_layer + 2);
//! let qkv = layout.block(1).param("attn.c_attn.weight");
//! assert_eq!(qkv.name, "h.1.attn.c_attn.weight");
//! assert_eq!(qkv.shape, vec![64, 192]);
//! assert_eq!(qkv.offset, 2 * 64);
//! assert_eq!(layout.num_params(), cfg.num_params());
//! ```

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::error::Result;

/// Which part of the model a unit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitKind {
    /// Token embedding `wte` (tied with the LM head) and positional embedding `wpe`.
    Embedding,
    /// Transformer block `l`.
    Block(usize),
    /// The final LayerNorm `ln_f`.
    FinalNorm,
}

/// How a parameter is initialised (see [`crate::init_unit_range`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamInit {
    /// Normal with mean 0 and this standard deviation.
    Normal { std: f64 },
    /// All ones (LayerNorm weights).
    Ones,
    /// All zeros (biases).
    Zeros,
}

/// One row of a unit's table: short name, shape, init rule, weight decay.
pub type TableRow = (&'static str, Vec<usize>, ParamInit, bool);

/// One parameter: a named view into its unit's flat buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Full dotted name, e.g. `"wte.weight"`, `"h.3.attn.c_attn.weight"`, `"ln_f.bias"`.
    pub name: String,
    /// Shape, HF GPT2 convention (linear weights are `(in, out)`).
    pub shape: Vec<usize>,
    /// Start of the view in the unit's flat buffer.
    pub offset: usize,
    /// Number of elements (`shape.iter().product()`).
    pub numel: usize,
    /// Whether AdamW weight decay applies (false for biases and LayerNorm weights).
    pub decay: bool,
    /// Index `k` of this parameter over the whole model, in layout order; keys the init RNG.
    pub global_index: usize,
    /// Initialisation rule.
    pub init: ParamInit,
}

impl ParamSpec {
    /// This parameter as a tensor of its shape: a view into `flat`, the unit's 1-D buffer.
    pub fn view(&self, flat: &Tensor) -> Result<Tensor> {
        Ok(flat
            .narrow(0, self.offset, self.numel)?
            .reshape(self.shape.as_slice())?)
    }
}

/// The parameters of one unit, in buffer order.
#[derive(Clone, Debug, PartialEq)]
pub struct UnitLayout {
    /// What the unit is.
    pub kind: UnitKind,
    /// `"embedding"`, `"h.3"` or `"ln_f"`.
    pub name: String,
    /// Parameters in buffer order; offsets are increasing and contiguous.
    pub params: Vec<ParamSpec>,
    /// Total elements (without any padding the engine adds).
    pub numel: usize,
}

/// The unit's name, its parameters' name prefix and its table rows ([`crate::Family::rows`]).
pub type UnitTable = (String, String, Vec<TableRow>);

/// Normal init std: 0.02, and for the projections that write into the residual stream
/// 0.02 / sqrt(2L) (each block adds two of them), as GPT-2 does; Llama takes the same.
pub(crate) fn init_stds(cfg: &ModelConfig) -> (f64, f64) {
    (0.02, 0.02 / ((2 * cfg.n_layer) as f64).sqrt())
}

impl UnitLayout {
    /// Builds the layout of one unit. `first_global_index` is the global index of its first parameter.
    ///
    /// The family's tables ([`crate::Family::rows`]) are the single list of the model's
    /// tensors.
    pub fn new(cfg: &ModelConfig, kind: UnitKind, first_global_index: usize) -> Self {
        let (name, prefix, rows) = cfg.family().rows(cfg, kind);
        let mut offset = 0;
        let params = rows
            .into_iter()
            .enumerate()
            .map(|(j, (short, shape, init, decay))| {
                let numel = shape.iter().product();
                let spec = ParamSpec {
                    name: format!("{prefix}{short}"),
                    shape,
                    offset,
                    numel,
                    decay,
                    global_index: first_global_index + j,
                    init,
                };
                offset += numel;
                spec
            })
            .collect();
        UnitLayout {
            kind,
            name,
            params,
            numel: offset,
        }
    }

    /// The one parameter whose name is `short` or ends with `.{short}`, e.g. `"ln_1.weight"`.
    ///
    /// # Panics
    /// If no parameter, or more than one, matches: names are fixed by the table, so a miss is a programming error.
    pub fn param(&self, short: &str) -> &ParamSpec {
        self.try_param(short)
            .unwrap_or_else(|| panic!("unit `{}` has no unique parameter `{short}`", self.name))
    }

    /// The weights of the unit's linear layers, which [`LinearFormat`] multiplies (FP8 compute
    /// and FP8 qwZ take these): a block's 2-D parameters; none in the embedding and the final
    /// norm, whose matrices (embedding, LM head) stay in the compute dtype.
    ///
    /// [`LinearFormat`]: crate::LinearFormat
    pub fn linear_weights(&self) -> impl Iterator<Item = &ParamSpec> {
        let block = matches!(self.kind, UnitKind::Block(_));
        self.params
            .iter()
            .filter(move |p| block && p.shape.len() == 2)
    }

    /// Like [`UnitLayout::param`], returning `None` when no parameter, or more than one, matches.
    pub fn try_param(&self, short: &str) -> Option<&ParamSpec> {
        let mut hits = self.params.iter().filter(|p| {
            p.name == short
                || (p.name.len() > short.len()
                    && p.name.ends_with(short)
                    && p.name.as_bytes()[p.name.len() - short.len() - 1] == b'.')
        });
        let first = hits.next()?;
        hits.next().is_none().then_some(first)
    }
}

/// The whole model: `[embedding, h.0, ..., h.{L-1}, ln_f]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelLayout {
    /// Units in forward order.
    pub units: Vec<UnitLayout>,
}

impl ModelLayout {
    /// Lays out every unit of `cfg`, numbering parameters globally in order.
    pub fn new(cfg: &ModelConfig) -> Self {
        let kinds = std::iter::once(UnitKind::Embedding)
            .chain((0..cfg.n_layer).map(UnitKind::Block))
            .chain(std::iter::once(UnitKind::FinalNorm));
        let mut next = 0;
        let units = kinds
            .map(|kind| {
                let u = UnitLayout::new(cfg, kind, next);
                next += u.params.len();
                u
            })
            .collect();
        ModelLayout { units }
    }

    /// Total number of parameters (sum of unit sizes, no padding).
    pub fn num_params(&self) -> usize {
        self.units.iter().map(|u| u.numel).sum()
    }

    /// The embedding unit.
    pub fn embedding(&self) -> &UnitLayout {
        &self.units[0]
    }

    /// Transformer block `l`.
    pub fn block(&self, l: usize) -> &UnitLayout {
        assert!(l + 2 < self.units.len(), "block {l} out of range");
        &self.units[1 + l]
    }

    /// The final LayerNorm unit.
    pub fn final_norm(&self) -> &UnitLayout {
        self.units.last().expect("layout has units")
    }

    /// Every parameter of the model in global order, with the unit it lives in.
    pub fn params(&self) -> impl Iterator<Item = (&UnitLayout, &ParamSpec)> {
        self.units
            .iter()
            .flat_map(|u| u.params.iter().map(move |p| (u, p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_contiguous_and_globally_numbered() {
        let cfg = crate::preset("gpt125m").unwrap();
        let layout = ModelLayout::new(&cfg);
        assert_eq!(layout.num_params(), cfg.num_params());
        for (k, (_, p)) in layout.params().enumerate() {
            assert_eq!(p.global_index, k);
            assert_eq!(p.numel, p.shape.iter().product::<usize>());
        }
        for u in &layout.units {
            let mut off = 0;
            for p in &u.params {
                assert_eq!(p.offset, off);
                off += p.numel;
                assert_eq!(p.decay, p.shape.len() == 2, "{}", p.name);
            }
            assert_eq!(off, u.numel);
        }
        assert_eq!(layout.final_norm().param("bias").name, "ln_f.bias");
        assert_eq!(layout.block(11).name, "h.11");
        assert_eq!(
            layout.block(3).param("attn.c_proj.bias").name,
            "h.3.attn.c_proj.bias"
        );
        assert!(layout.block(3).try_param("proj.bias").is_none());
        assert!(
            layout.block(3).try_param("c_proj.bias").is_none(),
            "ambiguous"
        );
    }

    #[test]
    fn llama_layouts_count_what_the_config_counts() {
        for name in ["llama-tiny", "llama3.2-1b", "llama3-8b"] {
            let cfg = crate::preset(name).unwrap();
            let layout = ModelLayout::new(&cfg);
            assert_eq!(layout.num_params(), cfg.num_params(), "{name}");
            let head = layout.final_norm().try_param("lm_head.weight").is_some();
            assert_eq!(head, !cfg.tie_embeddings, "{name}");
        }
        // q|k|v packed: 4 query heads and 2 key/value heads of 16.
        let cfg = crate::preset("llama-tiny").unwrap();
        let qkv = ModelLayout::new(&cfg)
            .block(1)
            .param("self_attn.qkv_proj.weight")
            .clone();
        assert_eq!(
            (qkv.name.as_str(), qkv.shape),
            ("layers.1.self_attn.qkv_proj.weight", vec![64, 128])
        );
    }
}
