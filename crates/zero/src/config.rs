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
    /// Elements per INT8 scale block for qwZ.
    pub weight_quant_block: usize,
    /// Elements per INT4 scale block for qgZ.
    pub grad_quant_block: usize,
    /// Prefetch the next unit's gather while the current one computes.
    pub overlap: bool,
}

impl Default for ZeroConfig {
    fn default() -> Self {
        ZeroConfig {
            stage: 3,
            quantized_weights: false,
            hpz_partition_size: 1,
            quantized_gradients: false,
            qgz_until: 1.0,
            weight_quant_block: 2048,
            grad_quant_block: 512,
            overlap: true,
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
        Ok(())
    }
}
