//! SwiGLU, the gate of Llama's MLP: `silu(gate) * up` (HF `act_fn(gate_proj(x)) * up_proj(x)`).
//!
//! Size letters: `N` rows, `F` the MLP's hidden width.
//!
//! For half-precision inputs `silu` runs in f32 and is rounded once, as PyTorch's is (candle's
//! bf16 `silu` rounds every intermediate), then the product is taken in the input dtype. The
//! backward runs in f32 for half-precision inputs and in the input dtype otherwise.

use candle_core::{DType, Tensor};

use crate::error::Result;

/// The dtype the element-wise math runs in: f32 for half precision, else the input's.
fn math_dtype(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        d => d,
    }
}

/// `sigmoid(g) = 1 / (1 + exp(-g))` (0 where `exp(-g)` overflows).
fn sigmoid(g: &Tensor) -> Result<Tensor> {
    Ok(g.neg()?.exp()?.affine(1.0, 1.0)?.recip()?)
}

/// `out = silu(gate) * up`, `silu(g) = g * sigmoid(g)`.
///
/// Shapes: `gate (N, F)`, `up (N, F)` -> `out (N, F)`. Backward needs `gate` and `up`.
pub fn swiglu_forward(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let md = math_dtype(gate.dtype());
    let act = gate.to_dtype(md)?.silu()?.to_dtype(gate.dtype())?;
    Ok((act * up)?)
}

/// Gradients of [`swiglu_forward`]: returns `(dgate (N, F), dup (N, F))` in the inputs' dtype.
/// Returned, not accumulated.
///
/// Shapes: `dy (N, F)`, `gate (N, F)`, `up (N, F)` (the forward's inputs).
pub fn swiglu_backward(dy: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
    let md = math_dtype(gate.dtype());
    let (dy, g, u) = (dy.to_dtype(md)?, gate.to_dtype(md)?, up.to_dtype(md)?);
    let s = sigmoid(&g)?;
    // out = silu(gate) * up
    let dup = (&dy * g.silu()?)?;
    // silu'(g) = s * (1 + g * (1 - s))
    let dsilu = (&s * (&g * s.affine(-1.0, 1.0)?)?.affine(1.0, 1.0)?)?;
    let dgate = ((dy * u)? * dsilu)?;
    Ok((dgate.to_dtype(gate.dtype())?, dup.to_dtype(up.dtype())?))
}
