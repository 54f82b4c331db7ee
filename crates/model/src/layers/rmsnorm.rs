//! RMSNorm over the last dimension (Llama's `LlamaRMSNorm`), with the residual gradient added
//! in backward.
//!
//! Size letters: `N` rows, `C` channels.
//!
//! The statistics are computed in f32 for half-precision inputs, as Hugging Face does
//! (`hidden_states.to(torch.float32)`), and in f64 for f64 inputs (so that the gradient checks
//! keep their precision); the normalised rows are cast back to the input dtype *before* the
//! weight multiplies them: `weight * hidden_states.to(input_dtype)`.

use candle_core::{DType, Tensor, D};

use crate::error::Result;

/// What [`rmsnorm_forward`] saves for [`rmsnorm_backward`] (besides the input itself).
#[derive(Clone, Debug)]
pub struct RmsSaved {
    /// Per-row `1 / sqrt(mean(x^2) + eps)`, `(N)`: f32, or f64 for f64 inputs.
    pub rstd: Tensor,
}

/// The dtype the statistics are computed in: f64 for f64, f32 otherwise.
pub(crate) fn stat_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// `y = w * (x * rsqrt(mean(x^2) + eps))` over the last dimension.
///
/// Shapes: `x (N, C)`, `w (C)` -> `y (N, C)` in the dtype of `x`; saves `rstd (N)`.
pub fn rmsnorm_forward(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, RmsSaved)> {
    let sd = stat_dtype(x.dtype());
    let xf = x.to_dtype(sd)?;
    // variance = hidden_states.pow(2).mean(-1, keepdim=True)
    let ms = xf.sqr()?.mean_keepdim(D::Minus1)?;
    // hidden_states * torch.rsqrt(variance + eps)
    let rstd = ms.affine(1.0, eps)?.sqrt()?.recip()?;
    let normed = xf.broadcast_mul(&rstd)?.to_dtype(x.dtype())?;
    // weight * hidden_states.to(input_dtype)
    let y = normed.broadcast_mul(w)?;
    Ok((
        y,
        RmsSaved {
            rstd: rstd.squeeze(D::Minus1)?,
        },
    ))
}

/// Gradients of [`rmsnorm_forward`]: returns `(dx (N, C), dw (C))` in the dtypes of `x` and
/// `w`, where `dx` also holds `dresidual` when given (the gradient reaching `x` along the
/// residual stream, added here before the one cast back). Computed in the statistics' dtype.
/// Returned, not accumulated: the caller adds them where they belong.
///
/// Shapes: `dy (N, C)`, `x (N, C)` (the forward input), `w (C)`, `dresidual (N, C)`.
pub fn rmsnorm_backward(
    dy: &Tensor,
    saved: &RmsSaved,
    x: &Tensor,
    w: &Tensor,
    dresidual: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let sd = saved.rstd.dtype();
    let rstd = saved.rstd.unsqueeze(D::Minus1)?;
    let (dy, xf, wf) = (dy.to_dtype(sd)?, x.to_dtype(sd)?, w.to_dtype(sd)?);
    // xhat = x * rstd
    let xhat = xf.broadcast_mul(&rstd)?;
    // y = w * xhat
    let dw = (&dy * &xhat)?.sum(0)?;
    let dnorm = dy.broadcast_mul(&wf)?;
    // xhat = x * rstd, rstd = (mean(x^2) + eps)^(-1/2):
    // dx = rstd * (dnorm - xhat * mean(dnorm * xhat))
    let m = (&dnorm * &xhat)?.mean_keepdim(D::Minus1)?;
    let mut dx = dnorm.sub(&xhat.broadcast_mul(&m)?)?.broadcast_mul(&rstd)?;
    if let Some(r) = dresidual {
        dx = (dx + r.to_dtype(sd)?)?;
    }
    Ok((dx.to_dtype(x.dtype())?, dw.to_dtype(w.dtype())?))
}
