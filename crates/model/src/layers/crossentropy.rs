//! Tied LM head + cross-entropy, in chunks of rows: nothing of size `(N, V)` is kept.

use candle_core::{DType, Tensor};

use crate::error::Result;

/// Rows of logits handled at once by [`crossentropy_forward_backward`]: about this many elements.
///
/// Chunking bounds the `(rows, V)` temporaries at ~16 MiB in f32. On CPU that is the difference
/// between ~4 fresh 200 MB allocations (each paid again in page faults) and buffers the
/// allocator reuses; on GPU it only bounds memory.
pub const CE_CHUNK_ELEMS: usize = 1 << 22;

/// A mean loss left where it was computed: the sum of the per-row losses as a 0-D tensor on its
/// device, and the rows it is the mean over. Making one queues no host read; [`Loss::value`]
/// reads it, waiting for the work queued before it. The training walk reads it after queueing
/// the backward, so the loss costs no host synchronisation in the middle of a step.
#[derive(Clone, Debug)]
pub struct Loss {
    sum: Tensor,
    rows: usize,
}

impl Loss {
    /// The mean over the rows (NaN for none).
    pub fn value(&self) -> Result<f64> {
        Ok(self.sum.to_dtype(DType::F64)?.to_scalar::<f64>()? / self.rows as f64)
    }
}

/// Mean cross-entropy of `logits = x @ wte^T` against `targets`, optionally with gradients.
///
/// Shapes: `x (N, C)`, `wte (V, C)`, `targets (N)` u32. Returns the loss (unread: [`Loss`])
/// and, when `grad`, the pair `(dx (N, C), dwte (V, C))` of `d loss`. Stable:
/// `lse = m + log(sum(exp(logits - m)))` with `m` the row max. The softmax runs in f32 for half-precision inputs. Rows are processed
/// in chunks of about [`CE_CHUNK_ELEMS`] logits; nothing of size `(N, V)` is kept.
pub fn crossentropy_forward_backward(
    x: &Tensor,
    wte: &Tensor,
    targets: &Tensor,
    grad: bool,
) -> Result<(Loss, Option<(Tensor, Tensor)>)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(x) {
        let _span = kernels::profile::scope(x.device(), kernels::profile::Family::CrossEntropy);
        if let Some(r) = cuda::crossentropy_forward_backward(x, wte, targets, grad)? {
            return Ok(r);
        }
        super::declined("crossentropy::crossentropy_forward_backward", x)?;
    }
    crossentropy_chunked(x, wte, targets, grad, CE_CHUNK_ELEMS)
}

/// [`crossentropy_forward_backward`] with an explicit chunk size in logits (for benchmarks and tests).
pub fn crossentropy_chunked(
    x: &Tensor,
    wte: &Tensor,
    targets: &Tensor,
    grad: bool,
    chunk_elems: usize,
) -> Result<(Loss, Option<(Tensor, Tensor)>)> {
    let (n, _c) = x.dims2()?;
    let v = wte.dim(0)?;
    let dtype = x.dtype();
    let ce_dtype = match dtype {
        DType::BF16 | DType::F16 => DType::F32,
        d => d,
    };
    let inv_n = 1.0 / n as f64;
    let rows = reference_chunk_rows(n, v, chunk_elems);
    let wte_t = wte.t()?;
    let mut loss_sum = Tensor::zeros((), ce_dtype, x.device())?;
    let mut dx_parts = Vec::new();
    let mut dwte = Tensor::zeros(wte.shape(), dtype, wte.device())?;
    for r0 in (0..n).step_by(rows) {
        let r = rows.min(n - r0);
        let xc = x.narrow(0, r0, r)?;
        let tc = targets.narrow(0, r0, r)?.reshape((r, 1))?;
        let logits = xc.matmul(&wte_t)?.to_dtype(ce_dtype)?; // (r, V)
        let max = logits.max_keepdim(1)?;
        let e = logits.broadcast_sub(&max)?.exp()?;
        let sum = e.sum_keepdim(1)?; // (r, 1)
                                     // loss_i = lse_i - logits[i, target_i]
        let lse = (sum.log()? + &max)?;
        loss_sum = (loss_sum + (lse - logits.gather(&tc, 1)?)?.sum_all()?)?;
        if grad {
            // dlogits = (softmax - onehot) / N. The dense softmax part goes through the two
            // matmuls here; the one-hot part is applied after the loop as a gather / scatter of
            // rows of wte and x, so no pass over (r, V) is spent on it.
            let p = e
                .broadcast_mul(&sum.affine(n as f64, 0.0)?.recip()?)?
                .to_dtype(dtype)?;
            dx_parts.push(p.matmul(wte)?);
            dwte = (dwte + p.t()?.matmul(&xc)?)?;
        }
    }
    let loss = Loss {
        sum: loss_sum,
        rows: n,
    };
    if !grad {
        return Ok((loss, None));
    }
    let dx = if dx_parts.is_empty() {
        x.zeros_like()?
    } else {
        Tensor::cat(&dx_parts, 0)?
    };
    // The one-hot part: dlogits[i, target_i] -= 1/N.
    let dx = (dx - wte.index_select(targets, 0)?.affine(inv_n, 0.0)?)?;
    let dwte = dwte.index_add(targets, &x.affine(-inv_n, 0.0)?, 0)?;
    Ok((loss, Some((dx, dwte))))
}

/// Bytes of one chunk's `(R, V)` bf16 logits, at most (about; `R` is rounded up to 64),
/// unless that leaves fewer than [`MIN_CHUNK_ROWS`] rows: 4 chunks of 4096 rows at
/// gpt350m's N = 16384, V = 50304, where the GEMMs run at full speed (7 chunks of 2368
/// rows were measurably slower).
const CHUNK_BYTES: usize = 512 << 20;
/// Rows a chunk has at least (N permitting) whatever the vocabulary: the `dwte` GEMM
/// contracts over a chunk's rows and adds into `dwte` (read and written once a chunk), so
/// short chunks cost both. At Qwen's 151,936 tokens [`CHUNK_BYTES`] alone would give 10
/// chunks of 1664 rows.
const MIN_CHUNK_ROWS: usize = 4096;
/// ... unless a chunk of that many rows passes this many bytes of logits.
const MAX_CHUNK_BYTES: usize = 2 << 30;

/// The GPU path's rows a chunk: `N` split evenly into as few chunks as keep the logits under
/// [`CHUNK_BYTES`] (or give [`MIN_CHUNK_ROWS`] rows, within [`MAX_CHUNK_BYTES`]), rounded
/// up to a multiple of 64 rows (whole GEMM tiles), at most `N`.
pub(crate) fn chunk_rows(n: usize, v: usize) -> usize {
    let row_bytes = 2 * v.max(1);
    let floor = MIN_CHUNK_ROWS.min(MAX_CHUNK_BYTES / row_bytes);
    let max_rows = (CHUNK_BYTES / row_bytes).max(floor).max(1);
    let chunks = n.div_ceil(max_rows).max(1);
    (n.div_ceil(chunks).div_ceil(64) * 64).min(n)
}

/// Bytes of logits the loss holds at once for `n` rows over a vocabulary of `v`: one chunk of
/// bf16 logits on the GPU ([`chunk_rows`] rows), or about [`CE_CHUNK_ELEMS`] f32 logits (whole
/// rows) on the CPU.
pub fn logits_chunk_bytes(n: usize, v: usize, gpu: bool) -> usize {
    match gpu {
        true => chunk_rows(n, v) * v * 2,
        false => reference_chunk_rows(n, v, CE_CHUNK_ELEMS) * v * 4,
    }
}

/// The reference's rows a chunk: whole rows of about `chunk_elems` logits, at least one, at
/// most `n`.
fn reference_chunk_rows(n: usize, v: usize, chunk_elems: usize) -> usize {
    (chunk_elems / v.max(1)).clamp(1, n.max(1))
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launchers of `kernels/cuda/crossentropy.cu`: logits of a chunk of rows by one GEMM, then
    //! the loss and `dlogits` in one pass over them, then the two gradient GEMMs.
    //!
    //! Size letters: `N` rows, `R` rows of a chunk, `C` channels, `V` vocabulary.
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{DType, Tensor};

    use super::super::linear::cuda as linear;
    use crate::error::Result;
    use crate::gemm::Epilogue;
    use crate::gpu;
    use kernels::Precision;

    /// The loss and, when asked for, `(dx, dwte)`: what [`super::crossentropy_forward_backward`]
    /// returns.
    type LossGrads = (super::Loss, Option<(Tensor, Tensor)>);

    /// The fused path, or `None` for inputs it does not take (not bf16, `V % 8 != 0`, `N == 0`,
    /// unaligned rows). Shapes: `x (N, C)`, `wte (V, C)` bf16, `targets (N)` u32.
    ///
    /// Per chunk of `R` rows: `logits (R, V) = x_chunk @ wte^T` (cuBLASLt, bf16 out, `wte^T`
    /// as a transposed operand, no copy); one kernel writes each row's loss to an f32 `(N)`
    /// buffer and, when `grad`, `dlogits = (softmax - onehot) / N` over the logits in place;
    /// then `dx[chunk] = dlogits @ wte`, written into its rows of `dx`, and
    /// `dwte += dlogits^T @ x_chunk` in the GEMM itself (C = D, beta 1).
    ///
    /// `dwte` accumulates in bf16 (one rounding a chunk, 4 at gpt350m's shape): the result is
    /// bf16 anyway and an f32 accumulator would cost a 2x-size `(V, C)` buffer for an error the
    /// output rounding mostly hides. This is also what the reference does in the input dtype.
    ///
    /// Synchronises once: the loss (sum of the per-row losses on the device) is read to the
    /// host at the end. Never holds anything of size `(N, V)`.
    pub(super) fn crossentropy_forward_backward(
        x: &Tensor,
        wte: &Tensor,
        targets: &Tensor,
        grad: bool,
    ) -> Result<Option<LossGrads>> {
        if x.dtype() != DType::BF16 || wte.dtype() != DType::BF16 || targets.dtype() != DType::U32 {
            return Ok(None);
        }
        if !targets.device().same_device(x.device()) || !wte.device().same_device(x.device()) {
            return Ok(None);
        }
        let (n, c) = x.dims2()?;
        let (v, c2) = wte.dims2()?;
        if c2 != c || targets.dims() != [n] {
            return Ok(None); // the reference reports the mismatch
        }
        if n == 0 || v == 0 || !v.is_multiple_of(8) || v > i32::MAX as usize {
            return Ok(None);
        }
        let (x, wte, targets) = (x.contiguous()?, wte.contiguous()?, targets.contiguous()?);
        let dev = gpu::device(&x)?;

        let rows = super::chunk_rows(n, v);
        let threads = ((v / 8).div_ceil(32) * 32).min(1024);
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::CROSSENTROPY,
            &[("CE_THREADS", threads as i64)],
            "crossentropy_forward_backward",
        )?;
        let losses = gpu::uninit(n, DType::F32, &dev)?;
        let (inv_n, grad_i, v_i) = (1.0f32 / n as f32, grad as i32, v as i32);
        let dx = grad
            .then(|| gpu::uninit((n, c), DType::BF16, &dev))
            .transpose()?;
        let dwte = grad
            .then(|| gpu::uninit((v, c), DType::BF16, &dev))
            .transpose()?;
        for (chunk, r0) in (0..n).step_by(rows).enumerate() {
            let r = rows.min(n - r0);
            let xc = x.narrow(0, r0, r)?;
            // logits (R, V) = xc (R, C) @ wte^T: the dx GEMM of a linear layer whose w is wte.
            let logits = gpu::uninit((r, v), DType::BF16, &dev)?;
            linear::dx_gemm(&dev, &xc, &wte, &logits, Epilogue::None)?;
            let p_logits = gpu::ptr(&logits)?;
            if !p_logits.is_multiple_of(16) {
                // cuBLAS output from candle's allocator is always aligned; keep the kernel safe.
                return Ok(None);
            }
            let p_tgt = gpu::ptr(&targets.narrow(0, r0, r)?)?;
            let p_loss = gpu::ptr(&losses.narrow(0, r0, r)?)?;
            let cfg = LaunchConfig {
                grid_dim: (r as u32, 1, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: argument list of `crossentropy_forward_backward`; logits is (R, V)
            // contiguous, targets and losses hold R elements from r0; target ids >= V are not
            // dereferenced (their loss is NaN).
            unsafe {
                func.launch(cfg, &[&p_logits, &p_tgt, &p_loss, &v_i, &inv_n, &grad_i])?;
            }
            if let (Some(dx), Some(dwte)) = (&dx, &dwte) {
                // `logits` now holds dlogits (R, V). dx rows (R, C) = dlogits @ wte (V, C); dwte
                // (V, C) (+)= dlogits^T @ xc: the dw GEMM of a linear layer with x = dlogits.
                let dx_rows = dx.narrow(0, r0, r)?;
                linear::forward_gemm(&dev, &logits, &wte, &dx_rows, Epilogue::None, None)?;
                linear::dw_gemm(&dev, &xc, &logits, dwte, chunk > 0)?;
            }
        }
        // The sum of the per-row losses in f64, left on the device (no host read here).
        let loss = super::Loss {
            sum: losses.to_dtype(DType::F64)?.sum_all()?,
            rows: n,
        };
        if !grad {
            return Ok(Some((loss, None)));
        }
        let (Some(dx), Some(dwte)) = (dx, dwte) else {
            return Ok(None); // unreachable: `grad` made both
        };
        Ok(Some((loss, Some((dx, dwte)))))
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_rows;

    #[test]
    fn chunks_keep_gpt2s_four_of_4096_rows_and_give_large_vocabularies_as_many_rows() {
        // GPT-2's 50,304 tokens at N = 16,384: 4 chunks of 4096 rows, as measured fastest.
        assert_eq!(chunk_rows(16_384, 50_304), 4096);
        // Llama 3's 128,256 and Qwen's 151,936: 4096 rows too, not 2048 or 1664.
        assert_eq!(chunk_rows(16_384, 128_256), 4096);
        assert_eq!(chunk_rows(16_384, 151_936), 4096);
        // A small vocabulary keeps its one chunk; a short batch is one chunk of N rows.
        assert_eq!(chunk_rows(16_384, 8192), 16_384);
        assert_eq!(chunk_rows(1000, 151_936), 1000);
        // A huge vocabulary stays within the byte bound: 2 GiB of bf16 logits a chunk.
        let v = 1 << 20;
        assert!(chunk_rows(16_384, v) * 2 * v <= (2 << 30) + 64 * 2 * v);
        // Degenerate sizes (refused before the loss runs) do not divide by zero here.
        assert_eq!(chunk_rows(0, 151_936), 0);
        assert_eq!(chunk_rows(16, 0), 16);
    }
}
