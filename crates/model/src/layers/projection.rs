//! Packed projections: several projections of one input written side by side into one buffer,
//! so that the layer after them reads its operands in place (Llama's q|k|v, read by the
//! rotation and the attention, and gate|up, read by SwiGLU), and their backward, which reads
//! the packed gradient in place. Linear weights are stored `(in, out)`, as in linear.rs. A bias
//! (Qwen2's on q, k and v) is added in the GEMM's epilogue on the GPU; its gradient is the
//! packed gradient's column sums ([`super::bias_grad`]), which the caller takes.

use candle_core::Tensor;

use crate::error::Result;

/// Projections of one input side by side, without bias: `[x @ w_0 | x @ w_1 | ...]`
/// `(N, sum OUT_i)`, plus `residual` when given (`(N, sum OUT_i)`). Llama's q|k|v and gate|up
/// come out as one packed buffer that the next layer reads in place; `o_proj` and `down_proj`
/// are the one-weight case with the residual.
///
/// Shapes: `x (N, IN)`, `w_i (IN, OUT_i)`. On the GPU one GEMM a weight, each writing its
/// columns of the buffer (the residual as the GEMM's C); the reference concatenates.
pub fn matmul_cols_forward(x: &Tensor, ws: &[Tensor], residual: Option<&Tensor>) -> Result<Tensor> {
    matmul_cols_bias_forward(x, ws, None, residual)
}

/// [`matmul_cols_forward`] with `bias (sum OUT_i)` added to every row when given (the biases of
/// the projections, side by side): `[x @ w_0 | x @ w_1 | ...] + bias (+ residual)`. On the GPU
/// each GEMM adds its block of the bias in its epilogue.
pub fn matmul_cols_bias_forward(
    x: &Tensor,
    ws: &[Tensor],
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(r) = cuda::cols_forward(x, ws, bias, residual)? {
            return Ok(r);
        }
        super::declined("projection::cols_forward", x)?;
    }
    let parts = ws
        .iter()
        .map(|w| x.matmul(w))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let y = if parts.len() == 1 {
        parts.into_iter().next().expect("one part")
    } else {
        Tensor::cat(&parts, 1)?
    };
    let y = match bias {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    Ok(match residual {
        Some(r) => (r + y)?,
        None => y,
    })
}

/// Gradients of [`matmul_cols_forward`]: `dout (N, sum OUT_i)` -> `dx (N, IN) = sum_i dout_i
/// @ w_i^T` and `dw_i (IN, OUT_i) = x^T @ dout_i` (the residual's gradient is `dout` itself).
/// `into[i]`, when given, is where `dw_i` goes: a GPU GEMM writes it there (a slot of the
/// unit's flat gradient) and returns that view; elsewhere it is a fresh tensor. Returned, not
/// accumulated.
pub fn matmul_cols_backward(
    dout: &Tensor,
    x: &Tensor,
    ws: &[Tensor],
    into: &[Option<Tensor>],
) -> Result<(Tensor, Vec<Tensor>)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        if let Some(r) = cuda::cols_backward(dout, x, ws, into)? {
            return Ok(r);
        }
        super::declined("projection::cols_backward", dout)?;
    }
    let _ = into; // only the GPU's GEMMs write into slots
    cols_backward_each(dout, ws, |d, w| Ok((d.matmul(&w.t()?)?, x.t()?.matmul(d)?)))
}

/// The backward of packed projections one weight at a time: `part(dout_i, w_i)` gives
/// `(dout_i @ w_i^T, dw_i)` for the column block `dout_i` of `dout`; returns the sum of the
/// first over `i` and every `dw_i`.
pub(crate) fn cols_backward_each(
    dout: &Tensor,
    ws: &[Tensor],
    part: impl Fn(&Tensor, &Tensor) -> Result<(Tensor, Tensor)>,
) -> Result<(Tensor, Vec<Tensor>)> {
    let mut off = 0;
    let mut dx: Option<Tensor> = None;
    let mut dws = Vec::with_capacity(ws.len());
    for w in ws {
        let out = w.dim(1)?;
        let d = dout.narrow(1, off, out)?.contiguous()?;
        off += out;
        let (p, dw) = part(&d, w)?;
        dx = Some(match dx {
            Some(acc) => (acc + p)?,
            None => p,
        });
        dws.push(dw);
    }
    let dx = dx.ok_or_else(|| candle_core::Error::Msg("matmul_cols_backward: no weight".into()))?;
    Ok((dx, dws))
}

#[cfg(feature = "cuda")]
mod cuda {
    //! One cuBLASLt GEMM a weight (`crate::gemm`), each writing or reading its column block of
    //! the packed buffer through the leading dimension. Row-major `(R, S)` is column-major
    //! `(S, R)` with leading dimension `S`.
    use crate::error::Result;
    use crate::gemm::{self, Epilogue, Gemm};
    use crate::gpu;
    use candle_core::{DType, Tensor};

    /// bf16, contiguous: what the GEMM path takes.
    fn takes(ts: &[&Tensor]) -> bool {
        ts.iter()
            .all(|t| t.dtype() == DType::BF16 && t.is_contiguous())
    }

    /// Whether the cols GEMMs take `x (N, IN)` and every `w_i (IN, OUT_i)`: bf16, contiguous,
    /// every column block a whole number of 16-byte vectors.
    fn cols_take(x: &Tensor, ws: &[Tensor]) -> Result<bool> {
        if ws.is_empty() || !takes(&[x]) || x.rank() != 2 {
            return Ok(false);
        }
        let inp = x.dim(1)?;
        for w in ws {
            if !takes(&[w]) || w.rank() != 2 || w.dim(0)? != inp || w.dim(1)? % 8 != 0 {
                return Ok(false);
            }
        }
        Ok(inp % 8 == 0)
    }

    /// `[x @ w_0 | x @ w_1 | ...] (+ bias) (+ residual)`, or `None` for inputs the GEMMs do not
    /// take. Column-major: block i of `d^T (TOT, N)` is `w_i^T (OUT_i, IN) x^T (IN, N)`, at row
    /// offset `off_i` with leading dimension TOT; its bias is the bias' elements from `off_i`,
    /// one a row of the block (cuBLASLt's BIAS epilogue).
    pub(super) fn cols_forward(
        x: &Tensor,
        ws: &[Tensor],
        bias: Option<&Tensor>,
        residual: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        if !cols_take(x, ws)? {
            return Ok(None);
        }
        let (n, inp) = x.dims2()?;
        let tot: usize = ws
            .iter()
            .map(|w| w.dim(1))
            .sum::<candle_core::Result<usize>>()?;
        if residual.is_some_and(|r| !takes(&[r]) || r.dims() != [n, tot]) {
            return Ok(None);
        }
        if bias.is_some_and(|b| !takes(&[b]) || b.dims() != [tot]) {
            return Ok(None);
        }
        let pbias = bias.map(gpu::ptr).transpose()?;
        let dev = gpu::device(x)?;
        let d = gpu::uninit((n, tot), DType::BF16, &dev)?;
        let (px, pd) = (gpu::ptr(x)?, gpu::ptr(&d)?);
        let pres = residual.map(gpu::ptr).transpose()?;
        let mut off = 0;
        for w in ws {
            let out = w.dim(1)?;
            let shift = (off * 2) as u64;
            gemm::run(
                &dev,
                &Gemm {
                    m: out,
                    n,
                    k: inp,
                    a: gpu::ptr(w)?,
                    lda: out,
                    trans_a: false,
                    b: px,
                    ldb: inp,
                    trans_b: false,
                    in_type: DType::BF16,
                    d: pd + shift,
                    ldd: tot,
                    d_type: DType::BF16,
                    epilogue: match pbias {
                        Some(p) => Epilogue::Bias(p + shift),
                        None => Epilogue::None,
                    },
                    c: pres.map(|p| p + shift),
                    scales: None,
                },
            )?;
            off += out;
        }
        Ok(Some(d))
    }

    /// `(dx, dw_i)` of [`cols_forward`], or `None` for inputs the GEMMs do not take. dx sums
    /// the blocks in place (the GEMMs after the first read it as C); `dw_i` goes to `into[i]`
    /// when that is a bf16 contiguous `(IN, OUT_i)` view, else to a fresh tensor.
    pub(super) fn cols_backward(
        dout: &Tensor,
        x: &Tensor,
        ws: &[Tensor],
        into: &[Option<Tensor>],
    ) -> Result<Option<(Tensor, Vec<Tensor>)>> {
        if !cols_take(x, ws)? || !takes(&[dout]) {
            return Ok(None);
        }
        let (n, inp) = x.dims2()?;
        let tot: usize = ws
            .iter()
            .map(|w| w.dim(1))
            .sum::<candle_core::Result<usize>>()?;
        if dout.dims() != [n, tot] {
            return Ok(None);
        }
        let dev = gpu::device(x)?;
        let dx = gpu::uninit((n, inp), DType::BF16, &dev)?;
        let (px, pdo, pdx) = (gpu::ptr(x)?, gpu::ptr(dout)?, gpu::ptr(&dx)?);
        let mut dws = Vec::with_capacity(ws.len());
        let mut off = 0;
        for (i, w) in ws.iter().enumerate() {
            let out = w.dim(1)?;
            let block = pdo + (off * 2) as u64;
            // dx^T (IN, N) (+)= w_i (IN, OUT_i) dout_i^T (OUT_i, N).
            gemm::run(
                &dev,
                &Gemm {
                    m: inp,
                    n,
                    k: out,
                    a: gpu::ptr(w)?,
                    lda: out,
                    trans_a: true,
                    b: block,
                    ldb: tot,
                    trans_b: false,
                    in_type: DType::BF16,
                    d: pdx,
                    ldd: inp,
                    d_type: DType::BF16,
                    epilogue: Epilogue::None,
                    c: (i > 0).then_some(pdx),
                    scales: None,
                },
            )?;
            let dw = match into.get(i) {
                Some(Some(v)) if takes(&[v]) && v.dims() == [inp, out] => v.clone(),
                _ => gpu::uninit((inp, out), DType::BF16, &dev)?,
            };
            // dw_i^T (OUT_i, IN) = dout_i^T (OUT_i, N) x (N, IN).
            gemm::run(
                &dev,
                &Gemm {
                    m: out,
                    n: inp,
                    k: n,
                    a: block,
                    lda: tot,
                    trans_a: false,
                    b: px,
                    ldb: inp,
                    trans_b: true,
                    in_type: DType::BF16,
                    d: gpu::ptr(&dw)?,
                    ldd: out,
                    d_type: DType::BF16,
                    epilogue: Epilogue::None,
                    c: None,
                    scales: None,
                },
            )?;
            dws.push(dw);
            off += out;
        }
        Ok(Some((dx, dws)))
    }
}
