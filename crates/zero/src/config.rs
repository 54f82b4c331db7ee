use candle_core::DType;
use serde::{Deserialize, Serialize};

use crate::{Result, ZeroError};

/// The `[zero]` section of a run config: which ZeRO stage and which ZeRO++ reductions to use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZeroConfig {
    /// ZeRO stage; 3 partitions parameters, gradients and optimizer states.
    pub stage: u8,
    /// qwZ: gather weights as block-wise INT8.
    pub quantized_weights: bool,
    /// hpZ: ranks per secondary partition group (1 = off; usually the GPUs per node).
    pub hpz_partition_size: usize,
    /// qgZ: reduce gradients with the INT4 2-hop all-to-all.
    pub quantized_gradients: bool,
    /// Fraction of the training steps during which qgZ is on (1.0 = always).
    pub qgz_until: f64,
    /// qgZ with error feedback: each rank keeps what its quantisers dropped at each hop and adds
    /// it back before the next quantisation of the same unit (1-bit Adam's compensation, LoCo).
    pub qgz_error_feedback: bool,
    /// Elements per INT8 scale block for qwZ.
    pub weight_quant_block: usize,
    /// Elements per INT4 scale block for qgZ.
    pub grad_quant_block: usize,
    /// Gathers kept in flight ahead of the unit computing (0: none, each unit is gathered when
    /// it is needed). Each holds one more unit's full parameters.
    pub prefetch_depth: usize,
    /// The dtype of plain ZeRO-3's gradient reduce-scatter (and of the padded gradient it
    /// reads): `fp32` (the default) or `bf16`, half the bytes, as DeepSpeed's ZeRO-3 (the
    /// paper's baseline) reduces in the parameters' 16-bit precision. The reduced slice is
    /// widened to f32 as it is added into the gradient shard, which stays f32, as does the
    /// optimizer. It does not apply to qgZ's steps (qgZ replaces the reduce-scatter), nor to one
    /// rank (nothing is reduced).
    pub reduce_dtype: ReduceDtype,
    /// Replaced by `prefetch_depth`; refused with a message that says so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap: Option<bool>,
}

/// The dtype of a plain gradient reduce-scatter (`zero.reduce_dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceDtype {
    /// The gradient cast to f32 and reduced in f32: 4 bytes an element.
    #[default]
    Fp32,
    /// The gradient cast to bf16 (scaled first) and reduced in bf16: 2 bytes an element.
    Bf16,
}

impl ReduceDtype {
    /// The tensors' dtype.
    pub fn dtype(self) -> DType {
        match self {
            ReduceDtype::Fp32 => DType::F32,
            ReduceDtype::Bf16 => DType::BF16,
        }
    }

    /// Bytes an element.
    pub fn bytes(self) -> usize {
        match self {
            ReduceDtype::Fp32 => 4,
            ReduceDtype::Bf16 => 2,
        }
    }

    /// As the config spells it.
    pub fn name(self) -> &'static str {
        match self {
            ReduceDtype::Fp32 => "fp32",
            ReduceDtype::Bf16 => "bf16",
        }
    }
}

/// The deepest prefetch `zero.prefetch_depth` takes: more units in flight than this only hold
/// memory (a gather is a fraction of a unit's compute).
pub const MAX_PREFETCH_DEPTH: usize = 8;

impl Default for ZeroConfig {
    fn default() -> Self {
        ZeroConfig {
            stage: 3,
            quantized_weights: false,
            hpz_partition_size: 1,
            quantized_gradients: false,
            qgz_until: 1.0,
            qgz_error_feedback: false,
            weight_quant_block: 2048,
            grad_quant_block: 512,
            prefetch_depth: 2,
            reduce_dtype: ReduceDtype::Fp32,
            overlap: None,
        }
    }
}

impl ZeroConfig {
    /// Checks the values on their own; [`crate::ZeroPlan::resolve`] checks them against the
    /// topology.
    pub fn validate(&self) -> Result<()> {
        let bad = |key, reason: &str| {
            Err(ZeroError::Config {
                key,
                reason: reason.to_string(),
            })
        };
        if self.stage != 3 {
            return bad("stage", "only stage 3 is implemented");
        }
        if !(0.0..=1.0).contains(&self.qgz_until) {
            return bad("qgz_until", "must be a fraction in [0, 1]");
        }
        if self.hpz_partition_size == 0 {
            return bad("hpz_partition_size", "must be at least 1 (1 = off)");
        }
        if self.weight_quant_block == 0 {
            return bad("weight_quant_block", "must be positive");
        }
        if self.grad_quant_block == 0 {
            return bad("grad_quant_block", "must be positive");
        }
        if self.overlap.is_some() {
            return bad(
                "overlap",
                "was replaced by zero.prefetch_depth (gathers in flight ahead of compute; 0 = none, default 2)",
            );
        }
        if self.qgz_error_feedback && !self.quantized_gradients {
            return bad(
                "qgz_error_feedback",
                "feeds back qgZ's quantisation error: it needs quantized_gradients = true",
            );
        }
        if self.prefetch_depth > MAX_PREFETCH_DEPTH {
            return bad(
                "prefetch_depth",
                &format!("must be at most {MAX_PREFETCH_DEPTH}"),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_overlap_key_and_too_deep_a_prefetch_are_refused() {
        let old = ZeroConfig {
            overlap: Some(true),
            ..Default::default()
        };
        let e = old.validate().unwrap_err().to_string();
        assert!(e.contains("overlap") && e.contains("prefetch_depth"), "{e}");
        let deep = ZeroConfig {
            prefetch_depth: MAX_PREFETCH_DEPTH + 1,
            ..Default::default()
        };
        let e = deep.validate().unwrap_err().to_string();
        assert!(e.contains("prefetch_depth"), "{e}");
        assert!(ZeroConfig::default().validate().is_ok());
    }

    #[test]
    fn reduce_dtype_reads_as_spelled() {
        let z: ZeroConfig = toml::from_str("reduce_dtype = \"bf16\"").unwrap();
        assert_eq!(z.reduce_dtype, ReduceDtype::Bf16);
        assert_eq!(ZeroConfig::default().reduce_dtype, ReduceDtype::Fp32);
        assert!(toml::from_str::<ZeroConfig>("reduce_dtype = \"fp16\"").is_err());
    }
}
