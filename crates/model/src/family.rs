//! The model families, one registry: what each family is beyond its compute, so that nothing
//! outside this crate names a family. A [`Family`] says its name (`model.arch`, config.json's
//! `model_type`), the shape it builds from a run config's sizes, the settings a checkpoint
//! records of it, and its Hugging Face mapping both ways (config.json, tensor names, the class
//! transformers loads it as). Each family's implementation lives beside its layers
//! (`gpt2/family.rs`, `llama/family.rs`); [`FAMILIES`] registers it.
//!
//! Its shape's own checks, parameter count and activation bytes are the family's too. Still
//! per [`Arch`] (docs/design.md, "Adding a family"): the units' parameter rows, forward and
//! backward, and the decode step, which `layout.rs`, `schedule.rs` and `decode.rs` dispatch on
//! the enum.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::layout::ParamSpec;

/// A model family: everything about it that is not its compute.
pub trait Family: Sync {
    /// The [`Arch`] its units compute with.
    fn arch(&self) -> Arch;

    /// Its name: `model.arch`, the manifest's `arch`, and config.json's `model_type`.
    fn name(&self) -> &'static str;

    /// The transformers class an export loads as (`GPT2LMHeadModel`).
    fn hf_class(&self) -> &'static str;

    /// The shape a run config's sizes give, the family's defaults where `sizes` leaves a
    /// setting unset; [`ModelError::Required`] for a size the family has no default for.
    fn config(&self, sizes: &Sizes) -> Result<ModelConfig>;

    /// What the family's shape must satisfy beyond every family's checks (positive sizes,
    /// heads that divide, a finite epsilon), which [`ModelConfig::validate`] makes first.
    fn validate(&self, cfg: &ModelConfig) -> Result<()>;

    /// Unique parameters, a tied LM head counted once.
    fn num_params(&self, cfg: &ModelConfig) -> usize;

    /// Bytes of activations one block keeps for its backward for `batch` sequences of
    /// `seq_len`, at `bytes` per element (2 for bf16).
    fn block_activation_bytes(
        &self,
        cfg: &ModelConfig,
        batch: usize,
        seq_len: usize,
        bytes: usize,
    ) -> u64;

    /// The settings beyond [`Sizes`]' common ones that fix a run's trajectory, as
    /// `(config key, value)`: a resume that changes one is refused by key.
    fn trajectory(&self, cfg: &ModelConfig) -> Vec<(&'static str, String)>;

    /// What the manifest records of `cfg` beyond the common sizes, under the family's name;
    /// `None` for a family whose checkpoints predate the registry and record nothing more.
    fn record(&self, cfg: &ModelConfig) -> Option<serde_json::Value>;

    /// The shape a manifest recorded (the common sizes, and the family's [`Family::record`]).
    fn from_record(&self, sizes: &Sizes, own: Option<&serde_json::Value>) -> Result<ModelConfig>;

    /// Where parameter `p` lives in the family's Hugging Face checkpoint.
    fn hf_tensor(&self, p: &ParamSpec) -> HfTensor;

    /// Whether a tensor of a Hugging Face checkpoint that is none of our parameters may be
    /// passed over: a buffer transformers saves (a causal mask, a rotary table), or a tied head
    /// saved anyway.
    fn hf_buffer(&self, name: &str, cfg: &ModelConfig) -> bool;

    /// The `config.json` of its Hugging Face class; `eod` the end-of-document token (written
    /// as BOS and EOS).
    fn hf_config(&self, cfg: &ModelConfig, eod: Option<u32>) -> serde_json::Value;

    /// Checks a `config.json` of this family's `model_type` against `cfg`: the settings the
    /// tensors' shapes do not show (a rope's theta, a norm's epsilon, a tied head). The error
    /// is the rest of a one-line message that names the key.
    fn check_hf_config(
        &self,
        j: &serde_json::Value,
        cfg: &ModelConfig,
    ) -> std::result::Result<(), String>;
}

/// Every family, in the order their names are listed to a user.
pub static FAMILIES: &[&dyn Family] = &[&crate::gpt2::family::Gpt2, &crate::llama::family::Llama];

/// The family named `name` (`model.arch`, `model_type`).
pub fn family(name: &str) -> Option<&'static dyn Family> {
    FAMILIES.iter().copied().find(|f| f.name() == name)
}

/// The registered families' names, for a message that lists them.
pub fn family_names() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.name()).collect()
}

impl Arch {
    /// The registered family that computes with this arch.
    pub fn family(self) -> &'static dyn Family {
        // Every Arch is registered (a test checks it); GPT-2 is the registry's first.
        FAMILIES
            .iter()
            .copied()
            .find(|f| f.arch() == self)
            .unwrap_or(FAMILIES[0])
    }
}

impl ModelConfig {
    /// The family of this shape.
    pub fn family(&self) -> &'static dyn Family {
        self.arch.family()
    }
}

/// The sizes every family has, and the three a family may fix or default (`None`: unset, the
/// family's default applies, or [`ModelError::Required`] where it has none).
#[derive(Clone, Debug, PartialEq)]
pub struct Sizes {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub seq_len: usize,
    pub vocab_size: usize,
    pub n_kv_head: Option<usize>,
    pub ffn_hidden: Option<usize>,
    pub tie_embeddings: Option<bool>,
}

/// Where a parameter lives in a Hugging Face checkpoint ([`Family::hf_tensor`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfTensor {
    /// The tensor's name in `model.safetensors`.
    pub name: String,
    /// Another name checkpoints in the wild give it (GPT-2's without `transformer.`).
    pub alias: Option<String>,
    /// HF stores it transposed from ours (`(out, in)` where we keep `(in, out)`).
    pub transpose: bool,
    /// Its rows are the vocabulary: a checkpoint with fewer (GPT-2's 50,257 against our
    /// 50,304) is read into the first rows, the rest zero.
    pub vocab_rows: bool,
}

/// A model shape as a checkpoint's manifest records it: the family's name (absent for GPT-2,
/// as trainers before the registry wrote it), the common sizes, and what the family adds under
/// its own name (`"llama": {"n_kv_head": 2, ...}`), which it serialises itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShapeRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub seq_len: usize,
    pub vocab_size: usize,
    /// The family's own record, keyed by its name.
    #[serde(flatten)]
    pub family: BTreeMap<String, serde_json::Value>,
}

impl From<&ModelConfig> for ShapeRecord {
    fn from(c: &ModelConfig) -> Self {
        let family = c.family();
        let own = family.record(c);
        ShapeRecord {
            arch: own.as_ref().map(|_| family.name().to_string()),
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_head: c.n_head,
            seq_len: c.seq_len,
            vocab_size: c.vocab_size,
            family: own
                .map(|v| BTreeMap::from([(family.name().to_string(), v)]))
                .unwrap_or_default(),
        }
    }
}

impl ShapeRecord {
    /// The model this record describes, checked ([`ModelConfig::validate`]).
    pub fn config(&self) -> Result<ModelConfig> {
        let name = self.arch.as_deref().unwrap_or(FAMILIES[0].name());
        let family = family(name).ok_or_else(|| ModelError::Shape {
            field: "arch",
            reason: format!("{name:?} is not one of {}", family_names().join(", ")),
        })?;
        let sizes = Sizes {
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_head: self.n_head,
            seq_len: self.seq_len,
            vocab_size: self.vocab_size,
            n_kv_head: None,
            ffn_hidden: None,
            tie_embeddings: None,
        };
        let cfg = family.from_record(&sizes, self.family.get(name))?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every arch has its family, found by its name; every preset's shape records and reads
    /// back as itself, through the JSON a manifest holds.
    #[test]
    fn every_family_is_registered_and_its_shapes_round_trip() {
        for arch in [Arch::Gpt2, Arch::Llama] {
            assert_eq!(arch.family().arch(), arch);
            assert_eq!(family(arch.family().name()).map(|f| f.arch()), Some(arch));
        }
        for name in crate::PRESET_NAMES {
            let cfg = crate::preset(name).unwrap();
            let json = serde_json::to_string(&ShapeRecord::from(&cfg)).unwrap();
            let back: ShapeRecord = serde_json::from_str(&json).unwrap();
            assert_eq!(back.config().unwrap(), cfg, "{name}: {json}");
        }
    }

    /// GPT-2 records what trainers before the registry wrote (no `arch`, nothing more), and
    /// a Llama the same fields as before under `"llama"`: old manifests read as they did.
    #[test]
    fn records_keep_the_manifests_of_earlier_trainers() {
        let gpt2 = serde_json::to_value(ShapeRecord::from(&crate::preset("tiny").unwrap()));
        assert_eq!(
            gpt2.unwrap(),
            serde_json::json!({"n_layer": 2, "n_embd": 64, "n_head": 4, "seq_len": 64,
                               "vocab_size": 50304})
        );
        let old = r#"{"arch": "llama", "n_layer": 2, "n_embd": 64, "n_head": 4, "seq_len": 64,
            "vocab_size": 1024, "llama": {"n_kv_head": 2, "ffn_hidden": 192, "norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_embeddings": true}}"#;
        let cfg = serde_json::from_str::<ShapeRecord>(old)
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(
            cfg,
            crate::ModelConfig::llama(2, 64, 4, 2, 192, 64, 1024, true)
        );
        let unknown = r#"{"arch": "mamba", "n_layer": 2, "n_embd": 64, "n_head": 4,
            "seq_len": 64, "vocab_size": 1024}"#;
        let e = serde_json::from_str::<ShapeRecord>(unknown)
            .unwrap()
            .config()
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("\"mamba\" is not one of gpt2, llama"),
            "{e}"
        );
    }
}
