//! The layers of GPT-2 and of the Llama family (RMSNorm, RoPE, SwiGLU, grouped-query
//! attention, Qwen3's per-head q/k norm), each as a forward and a backward free function side by side
//! (the layout of llm.c's `train_gpt2.c`), one module a layer.
//!
//! Size letters: `B` batch, `T` sequence length of this batch, `N = B*T` positions,
//! `C` channels (`n_embd`), `NH` heads, `hs = C/NH`, `V` vocabulary; Llama's `KV` key/value
//! heads and `F` MLP width.
//!
//! Every function takes tensors on any device. On the CPU (and for shapes a kernel does not
//! take) it runs the *reference*: basic candle [`candle_core::Tensor`] ops (matmul, broadcasts,
//! reductions, `exp`, `tanh`, ...), generic over the float dtype. On a CUDA device (feature
//! `cuda`) it launches our fused kernels from the `kernels` crate; each launcher sits in its
//! layer's `cuda` submodule, beside the reference it replaces, and is tested against it
//! (tests/gpu). The path is chosen by the tensor's device, never by a flag.
//!
//! We do not use candle-nn: its fused `layer_norm`/`softmax_last_dim` record no gradient, and
//! here we write every gradient ourselves anyway. Backward functions *return* gradients; they
//! never accumulate into buffers (the caller, ultimately the ZeRO engine, does that).

mod attention;
mod crossentropy;
mod embedding;
pub(crate) mod fp8_linear;
mod gelu;
mod gqa;
mod layernorm;
mod linear;
pub(crate) mod projection;
mod qk_norm;
mod rmsnorm;
mod rope;
mod swiglu;

pub use attention::{attention_backward, attention_forward, causal_mask, AttSaved};
#[cfg(feature = "cuda")]
pub use attention::{
    attention_backward_tiled, attention_backward_with, attention_cudnn_support,
    attention_forward_tiled, attention_forward_with, AttentionKernel,
};
pub use crossentropy::{
    crossentropy_chunked, crossentropy_forward_backward, logits_chunk_bytes, Loss, CE_CHUNK_ELEMS,
};
pub use embedding::{embedding_backward, embedding_backward_onto, embedding_forward, TokenIndex};
/// The FP8 linear layers' GPU quantisers and GEMMs (tests compare them with the references).
#[cfg(feature = "cuda")]
pub use fp8_linear::cuda as fp8_gpu;
pub use fp8_linear::{
    dout_cols_tile, fp8_linear_backward, fp8_linear_cols_backward, fp8_linear_cols_forward,
    fp8_linear_forward, fp8_matmul_backward, fp8_matmul_forward, fp8_round, whole_columns,
    Fp8Input, Fp8Weight, COL_BLOCK, GPU_MULTIPLE, INPUT_TILE, ROW_BLOCK, WEIGHT_TILE,
};
pub use gelu::{gelu_backward, gelu_forward};
#[cfg(feature = "cuda")]
pub use gqa::gqa_cudnn_support;
pub use gqa::{
    gqa_attention_backward, gqa_attention_forward, gqa_packed_backward, gqa_packed_forward,
    GqaSaved,
};
pub use layernorm::{layernorm_backward, layernorm_forward, LnSaved, LN_EPS};
pub use linear::{
    bias_grad, gelu_backward_bias_grad, matmul_backward, matmul_backward_into,
    matmul_backward_no_bias, matmul_forward, matmul_gelu_backward, matmul_gelu_backward_epilogue,
    matmul_gelu_backward_into, matmul_gelu_forward, matmul_gelu_forward_unfused,
    residual_matmul_forward,
};
pub use projection::{matmul_cols_backward, matmul_cols_bias_forward, matmul_cols_forward};
pub(crate) use qk_norm::QK_NORM_MAX_HEAD_SIZE;
pub use qk_norm::{
    qk_norm_backward, qk_norm_forward, qk_norm_rope_backward, qk_norm_rope_forward, QkNormSaved,
};
pub use rmsnorm::{
    add_rmsnorm_forward, rmsnorm_backward, rmsnorm_backward_into, rmsnorm_forward, RmsSaved,
};
pub use rope::{
    rope_backward, rope_forward, rope_qk_backward, rope_qk_forward, rope_tables, RopeScaling,
    RopeTables,
};
pub use swiglu::{swiglu_backward, swiglu_forward, swiglu_packed_backward, swiglu_packed_forward};

/// After a layer's GPU kernel declined `t` (a CUDA tensor): an error under an enforced kernel
/// plan (`KernelPlan::enforce`), else nothing and the layer runs its reference.
#[cfg(feature = "cuda")]
pub(crate) use crate::kernel_plan::{attention_declined, declined};

/// Whether `t` lives on a CUDA device (the `cuda` kernels are built in).
#[cfg(feature = "cuda")]
#[inline]
pub(crate) fn on_gpu(t: &candle_core::Tensor) -> bool {
    t.device().is_cuda()
}
