//! The element type of the model's kernels: an explicit axis of every kernel family whose
//! activations, weights and gradients are of the model's dtype (norms, rotary, SwiGLU, the
//! elementwise passes, attention, embedding, cross-entropy).
//!
//! A launcher takes a [`Precision`], and its module is compiled with the precision's define
//! ([`Precision::define`]: `PRECISION=<code>`), which `common.cuh` turns into the kernels'
//! element type `act` and its conversions. The kernel names stay the same for every precision:
//! the module cache keys on the defines, so each precision is its own module.
//!
//! Only bf16 exists today. Another activation type joins as a variant here (its code, its
//! candle dtype), a branch of `common.cuh`'s `#if PRECISION` (the type, `act_to_f32`,
//! `f32_to_act`, the 16-byte vector helpers), and, in each family that takes it, its kernels
//! rewritten for its vector width and the file's `static_assert` on PRECISION lifted
//! (attention's tensor-core MMA is bf16 only), and `model::KernelPlan::resolve` accepting the
//! dtype. FP8 compute is not an activation type: its activations stay bf16 and only the GEMMs'
//! operands are FP8 (`model::LinearFormat`, docs/kernels.md "FP8 compute").

use candle_core::DType;

/// The element type a kernel family is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Precision {
    /// bfloat16: 8 elements a 16-byte vector.
    Bf16,
}

impl Precision {
    /// Every precision the kernels are written for.
    pub const ALL: &'static [Precision] = &[Precision::Bf16];

    /// The precision of tensors of `dtype`, or `None` where no kernel family is written for it.
    pub fn of(dtype: DType) -> Option<Precision> {
        match dtype {
            DType::BF16 => Some(Precision::Bf16),
            _ => None,
        }
    }

    /// The candle dtype of its tensors.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Bf16 => DType::BF16,
        }
    }

    /// Its name in configs and messages.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
        }
    }

    /// Elements of a 16-byte vector (the kernels' loads and stores).
    pub fn per_vector(self) -> usize {
        16 / self.dtype().size_in_bytes()
    }

    /// The define that selects it in `common.cuh` (`PRECISION_BF16` there is 1).
    pub fn define(self) -> crate::Define {
        match self {
            Precision::Bf16 => ("PRECISION", 1),
        }
    }

    /// `defines` with this precision's define in front: a typed family's module defines.
    pub fn defines<const K: usize>(self, defines: [crate::Define; K]) -> Vec<crate::Define> {
        let mut v = Vec::with_capacity(K + 1);
        v.push(self.define());
        v.extend(defines);
        v
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
