//! The GPU kernel plan: what the model's layers run on a CUDA device, resolved once from the
//! model config, the compute dtype and the device when a run sets up its step, instead of being
//! discovered per call.
//!
//! [`KernelPlan::resolve`] refuses, in one line naming the setting, a combination the GPU
//! kernels cannot run: a compute dtype no kernel family is written for ([`Precision`]), or a
//! size a family needs whole 16-byte vectors of. What it accepts, every layer's fast path takes
//! in a step: [`KernelPlan::enforce`] makes a fast path that declines a CUDA tensor on this
//! thread an error ([`ModelError::KernelDeclined`], an internal invariant), where without an
//! enforced plan (the layer tests, decoding an f32 checkpoint on a GPU) the layer runs its
//! candle reference, as on the CPU.
//!
//! Planned second choices, decided here and printed with the plan: the attention runs cuDNN's
//! fused SDPA first and falls to our own kernel where cuDNN refuses a graph at run time (it can:
//! its heuristics are per device and version), for head sizes our kernel takes (16, 32, 64,
//! 128); the grouped-query attention (`n_kv_head < n_head`) has cuDNN only. A head size neither
//! takes (a multiple of 8 above 128, as gpt18b's 192) runs the candle reference attention on the GPU: planned,
//! printed, and the one layer an enforced plan lets take the reference.

use std::cell::Cell;

use candle_core::{DType, Device, Tensor};
use kernels::Precision;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// Head sizes of our own attention kernel (`attention.cu`).
pub(crate) const OWN_ATTENTION_HEAD_SIZES: [usize; 4] = [16, 32, 64, 128];

/// Whether cuDNN's fused attention takes head size `hs`: a multiple of 8 up to 128.
pub(crate) fn cudnn_takes_head_size(hs: usize) -> bool {
    hs.is_multiple_of(8) && hs <= 128
}

/// How the attention runs on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPath {
    /// cuDNN, then our kernel where cuDNN refuses a graph.
    CudnnThenKernel,
    /// cuDNN only (a head size our kernel does not take, or grouped-query heads).
    Cudnn,
    /// The candle reference (a head size no GPU attention takes).
    Reference,
}

/// What the model's layers run on a CUDA device (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelPlan {
    /// The element type of every typed kernel family.
    pub precision: Precision,
    /// The attention's implementations, in order.
    pub attention: AttentionPath,
    /// The head size the attention runs at.
    pub head_size: usize,
}

impl KernelPlan {
    /// The plan for `cfg` in `dtype` on `device`: `None` on the CPU (the candle reference
    /// everywhere), or an error naming the setting the GPU kernels cannot take.
    pub fn resolve(cfg: &ModelConfig, dtype: DType, device: &Device) -> Result<Option<KernelPlan>> {
        match device.is_cuda() {
            true => {
                #[cfg(feature = "cuda")]
                check_capability(device)?;
                resolve_cuda(cfg, dtype).map(Some)
            }
            false => Ok(None),
        }
    }

    /// On this thread until the guard drops: a layer's fast path that declines a CUDA tensor is
    /// an error, not the reference.
    pub fn enforce(&self) -> Enforced {
        let before = ENFORCED.with(|e| e.replace(Some(*self)));
        Enforced { before }
    }
}

/// The kernels are PTX for compute capability 9.0 (`kernels::Flavour`, crates/kernels/src/
/// loader.rs), which the driver compiles for 9.0 and later GPUs and cannot for older ones
/// (their FP8 instructions and cuBLASLt's block-scaled FP8 GEMMs are Hopper's too): an older
/// GPU is refused here, in one line, before any kernel fails to load.
#[cfg(feature = "cuda")]
fn check_capability(device: &Device) -> Result<()> {
    let Device::Cuda(dev) = device else {
        return Ok(());
    };
    let (major, minor) = dev
        .cuda_stream()
        .context()
        .compute_capability()
        .map_err(|e| candle_core::Error::Msg(format!("the GPU's compute capability: {e}")))?;
    match major >= 9 {
        true => Ok(()),
        false => Err(ModelError::GpuTooOld { major, minor }),
    }
}

/// [`KernelPlan::resolve`] on a CUDA device.
fn resolve_cuda(cfg: &ModelConfig, dtype: DType) -> Result<KernelPlan> {
    let refuse =
        |setting: String, reason: &'static str| Err(ModelError::GpuUnsupported { setting, reason });
    let Some(precision) = Precision::of(dtype) else {
        let name = match dtype {
            DType::F32 => "fp32".to_string(),
            DType::F16 => "fp16".to_string(),
            d => format!("{d:?}").to_lowercase(),
        };
        return refuse(
            format!("train.precision = {name:?}"),
            "the GPU kernels are written for bf16 (kernels::Precision): set train.precision \
                 = \"bf16\", or train.device = \"cpu\" for the fp32 reference",
        );
    };
    let per = precision.per_vector();
    if !cfg.n_embd.is_multiple_of(per) {
        return refuse(
            format!("model.n_embd = {}", cfg.n_embd),
            "the GPU norm, embedding and projection kernels take rows of whole 16-byte \
                 vectors: a multiple of 8",
        );
    }
    if cfg.ffn_hidden > 0 && !cfg.ffn_hidden.is_multiple_of(per) {
        return refuse(
            format!("model.ffn_hidden = {}", cfg.ffn_hidden),
            "the GPU SwiGLU kernel takes rows of whole 16-byte vectors: a multiple of 8",
        );
    }
    if !cfg.vocab_size.is_multiple_of(per) || cfg.vocab_size > i32::MAX as usize {
        return refuse(
            format!("model.vocab_size = {}", cfg.vocab_size),
            "the GPU cross-entropy kernel takes rows of whole 16-byte vectors: a multiple \
                 of 8 (a tokenizer's vocabulary is padded to 128 when model.vocab_size is unset)",
        );
    }
    let hs = cfg.head_dim;
    if !hs.is_multiple_of(per) {
        return refuse(
            format!("model.head_dim (n_embd / n_head unless set) = head size {hs}"),
            "the GPU attention (cuDNN) and rotary kernels take head sizes that are a multiple \
             of 8",
        );
    }
    if cfg.qk_norm && hs > crate::layers::QK_NORM_MAX_HEAD_SIZE {
        return refuse(
            format!("model.head_dim = {hs} with the q/k norm"),
            "the GPU q/k norm kernel takes heads of up to 256 channels",
        );
    }
    let grouped = cfg.n_kv_head != cfg.n_head;
    let attention = if !cudnn_takes_head_size(hs) {
        AttentionPath::Reference
    } else if !grouped && OWN_ATTENTION_HEAD_SIZES.contains(&hs) {
        AttentionPath::CudnnThenKernel
    } else {
        AttentionPath::Cudnn
    };
    Ok(KernelPlan {
        precision,
        attention,
        head_size: hs,
    })
}

impl std::fmt::Display for KernelPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let attention = match self.attention {
            AttentionPath::CudnnThenKernel => "cuDNN, then our kernel",
            AttentionPath::Cudnn => "cuDNN",
            AttentionPath::Reference => "the candle reference (no GPU attention takes it)",
        };
        write!(
            f,
            "GPU kernels in {}: norms, embedding, projections, MLP and cross-entropy on ours; \
             attention (head size {}) on {attention}",
            self.precision, self.head_size
        )
    }
}

thread_local! {
    /// The plan enforced on this thread, if one is.
    static ENFORCED: Cell<Option<KernelPlan>> = const { Cell::new(None) };
}

/// On this thread until the guard drops: no plan enforced, so the layers may take the
/// reference on the GPU. For work outside the planned step that runs another dtype by design:
/// the training log's samples decode in f32.
pub fn unenforced() -> Enforced {
    let before = ENFORCED.with(|e| e.replace(None));
    Enforced { before }
}

/// The guard of [`KernelPlan::enforce`]: restores what was enforced before it.
#[must_use = "the plan is enforced while the guard lives"]
pub struct Enforced {
    before: Option<KernelPlan>,
}

impl Drop for Enforced {
    fn drop(&mut self) {
        ENFORCED.with(|e| e.set(self.before));
    }
}

/// Called by a layer whose fast path declined `t`, a CUDA tensor, before it runs the reference:
/// an error under an enforced plan, nothing otherwise.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn declined(op: &'static str, t: &Tensor) -> Result<()> {
    declined_unless(op, t, |_| false)
}

/// [`declined`] for the attention: the reference is planned where the plan says so.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn attention_declined(op: &'static str, t: &Tensor) -> Result<()> {
    declined_unless(op, t, |p| p.attention == AttentionPath::Reference)
}

fn declined_unless(op: &'static str, t: &Tensor, planned: fn(&KernelPlan) -> bool) -> Result<()> {
    match ENFORCED.with(Cell::get) {
        Some(plan) if !planned(&plan) => Err(ModelError::KernelDeclined {
            op,
            precision: plan.precision,
            dtype: t.dtype(),
            dims: t.dims().to_vec(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal of `cfg` in `dtype` as on a CUDA device (no device needed: resolving
    /// touches none).
    fn refusal(cfg: &ModelConfig, dtype: DType) -> String {
        match resolve_on(cfg, dtype) {
            Err(e) => e.to_string(),
            Ok(p) => panic!("accepted: {p}"),
        }
    }

    fn resolve_on(cfg: &ModelConfig, dtype: DType) -> Result<KernelPlan> {
        resolve_cuda(cfg, dtype)
    }

    #[test]
    fn presets_are_accepted_in_bf16() {
        for name in crate::preset_names() {
            let cfg = crate::preset(name).unwrap();
            let plan = resolve_on(&cfg, DType::BF16).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(plan.precision, Precision::Bf16);
        }
        let tiny = crate::preset("tiny").unwrap();
        let plan = resolve_on(&tiny, DType::BF16).unwrap();
        assert_eq!(plan.attention, AttentionPath::CudnnThenKernel);
        assert_eq!(plan.head_size, 16);
        let llama = crate::preset("llama-tiny").unwrap();
        assert_eq!(
            resolve_on(&llama, DType::BF16).unwrap().attention,
            AttentionPath::Cudnn
        );
    }

    #[test]
    fn refusals_name_the_setting_in_one_line() {
        let cfg = crate::preset("tiny").unwrap();
        let e = refusal(&cfg, DType::F32);
        assert!(
            e.starts_with("train.precision = \"fp32\" on a GPU: "),
            "{e}"
        );
        assert!(!e.contains('\n'));
        let mut odd = cfg.clone();
        odd.n_embd = 100;
        odd.n_head = 4;
        odd.head_dim = 25;
        assert!(refusal(&odd, DType::BF16).starts_with("model.n_embd = 100 on a GPU"));
        let mut v = cfg.clone();
        v.vocab_size = 50257;
        assert!(refusal(&v, DType::BF16).starts_with("model.vocab_size = 50257 on a GPU"));
        let mut h = cfg.clone();
        h.n_embd = 96;
        h.n_head = 8;
        h.head_dim = 12;
        let e = refusal(&h, DType::BF16);
        assert!(e.contains("head size 12 on a GPU"), "{e}");
        let mut wide = crate::preset("qwen3-0.6b").unwrap();
        wide.head_dim = 264;
        let e = refusal(&wide, DType::BF16);
        assert!(
            e.starts_with("model.head_dim = 264 with the q/k norm on a GPU"),
            "{e}"
        );
    }

    /// gpt18b's head size 192 takes no GPU attention: planned as the reference, and the one
    /// layer an enforced plan lets decline.
    #[test]
    fn a_head_size_above_128_plans_the_reference_attention() {
        let cfg = crate::preset("gpt18b").unwrap();
        let plan = resolve_on(&cfg, DType::BF16).unwrap();
        assert_eq!(
            (plan.attention, plan.head_size),
            (AttentionPath::Reference, 192)
        );
        assert!(plan.to_string().contains("candle reference"), "{plan}");
        let t = Tensor::zeros(4, DType::BF16, &Device::Cpu).unwrap();
        let _g = plan.enforce();
        assert!(attention_declined("attention", &t).is_ok());
        assert!(declined("layernorm", &t).is_err());
    }

    #[test]
    fn the_cpu_has_no_plan_and_nothing_is_enforced_without_one() {
        let cfg = crate::preset("tiny").unwrap();
        assert_eq!(
            KernelPlan::resolve(&cfg, DType::F32, &Device::Cpu).unwrap(),
            None
        );
        let t = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        assert!(declined("op", &t).is_ok());
        let plan = resolve_on(&cfg, DType::BF16).unwrap();
        {
            let _g = plan.enforce();
            let e = declined("layernorm_forward", &t).unwrap_err().to_string();
            assert!(
                e.starts_with("layernorm_forward: the bf16 GPU kernel declined"),
                "{e}"
            );
        }
        assert!(declined("op", &t).is_ok(), "the guard restores");
        let _g = plan.enforce();
        {
            let _off = unenforced();
            assert!(declined("op", &t).is_ok());
        }
        assert!(declined("op", &t).is_err(), "unenforced restores the plan");
    }
}
