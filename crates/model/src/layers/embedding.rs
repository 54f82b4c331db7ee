//! Token + position embedding.

use candle_core::Tensor;

use crate::error::Result;

/// `out[b, t] = wte[tokens[b, t]] + wpe[t]`.
///
/// Shapes: `tokens (B, T)` u32, `wte (V, C)`, `wpe (>= T, C)` -> `out (B, T, C)`. Backward needs `tokens`.
pub fn embedding_forward(tokens: &Tensor, wte: &Tensor, wpe: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(wte) {
        let _span = kernels::profile::scope(wte.device(), kernels::profile::Family::Embedding);
        if let Some(r) = cuda::embedding_forward(tokens, wte, wpe)? {
            return Ok(r);
        }
        super::declined("embedding::embedding_forward", tokens)?;
    }
    let (b, t) = tokens.dims2()?;
    let c = wte.dim(1)?;
    let tok = wte
        .index_select(&tokens.flatten_all()?, 0)?
        .reshape((b, t, c))?;
    Ok(tok.broadcast_add(&wpe.narrow(0, 0, t)?)?)
}

/// A micro-batch's tokens as the embedding's backward reads them: the `(B, T)` u32 ids and, for
/// ids on a GPU, the same ids on the host, from which the backward builds the stable CSR of
/// positions by token that its deterministic kernel walks.
///
/// Made where the tokens are embedded (the forward, before its kernel): reading the ids back
/// there waits for little more than their upload. The backward then reads nothing back: it
/// builds the CSR on the host while the GPU still runs the blocks' backward queued before it.
#[derive(Clone, Debug)]
pub struct TokenIndex {
    tokens: Tensor,
    /// On a GPU: the ids, read back once, each checked `< vocab_size`. `None` on the CPU.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    host: Option<Vec<u32>>,
    /// The vocabulary every id was checked against.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    vocab_size: usize,
}

impl TokenIndex {
    /// The index of `tokens (B, T)`; on a GPU an error for an id `>= vocab_size`.
    pub fn new(tokens: &Tensor, vocab_size: usize) -> Result<Self> {
        #[cfg(feature = "cuda")]
        let host = cuda::read_ids(tokens, vocab_size)?;
        #[cfg(not(feature = "cuda"))]
        let host = None;
        Ok(TokenIndex {
            tokens: tokens.clone(),
            host,
            vocab_size,
        })
    }

    /// The token ids.
    pub fn tokens(&self) -> &Tensor {
        &self.tokens
    }
}

/// Gradients of [`embedding_forward`]: returns `(dwte (V, C), dwpe (T_max, C))`, rows of `wpe`
/// at or beyond `T` getting zero. `dout (B, T, C)`, `tokens` the index of the forward's ids.
/// Deterministic: every row of `dwte` sums its positions in the order they appear in the tokens.
pub fn embedding_backward(
    dout: &Tensor,
    tokens: &TokenIndex,
    vocab_size: usize,
    max_t: usize,
) -> Result<(Tensor, Tensor)> {
    embedding_backward_onto(dout, tokens, vocab_size, max_t, None)
}

/// [`embedding_backward`] with `dwte` added onto `onto (V, C)`, another gradient of the same
/// table (a tied LM head's): `(onto + dwte, dwpe)`. On the GPU the kernel adds each batch
/// token's row sum into `onto`'s row in place (`onto` is consumed): no zeroed `(V, C)` table
/// and no pass over two of them (a Llama 3.2 1B's table is 525 MB in bf16). The sums are
/// those of adding the two tensors, bit for bit, but for a -0.0 in a row of `onto` no token of
/// the batch touches, which stays -0.0 where the addition gives +0.0.
pub fn embedding_backward_onto(
    dout: &Tensor,
    tokens: &TokenIndex,
    vocab_size: usize,
    max_t: usize,
    onto: Option<Tensor>,
) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(dout) {
        let _span = kernels::profile::scope(dout.device(), kernels::profile::Family::Embedding);
        if let Some(r) = cuda::embedding_backward(dout, tokens, vocab_size, max_t, onto.as_ref())? {
            return Ok(r);
        }
        super::declined("embedding::embedding_backward", dout)?;
    }
    let (dwte, dwpe) = embedding_backward_reference(dout, tokens, vocab_size, max_t)?;
    match onto {
        Some(o) => Ok(((o + dwte)?, dwpe)),
        None => Ok((dwte, dwpe)),
    }
}

/// The reference of [`embedding_backward`] (candle's ops; the CPU's path).
fn embedding_backward_reference(
    dout: &Tensor,
    tokens: &TokenIndex,
    vocab_size: usize,
    max_t: usize,
) -> Result<(Tensor, Tensor)> {
    let tokens = tokens.tokens();
    let (b, t, c) = dout.dims3()?;
    let (dtype, dev) = (dout.dtype(), dout.device());
    let dout2 = dout.reshape((b * t, c))?;
    let dwte =
        Tensor::zeros((vocab_size, c), dtype, dev)?.index_add(&tokens.flatten_all()?, &dout2, 0)?;
    let mut dwpe = dout.sum(0)?;
    if t < max_t {
        dwpe = Tensor::cat(&[dwpe, Tensor::zeros((max_t - t, c), dtype, dev)?], 0)?;
    }
    Ok((dwte, dwpe))
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launchers of `kernels/cuda/embedding.cu`. Size letters: `B` batch, `T` positions,
    //! `N = B*T`, `C` channels, `V` vocabulary. The kernels move rows as 16-byte vectors: they
    //! take bf16 with `C % 8 == 0` and 16-byte aligned rows; anything else runs the reference.
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::CudaDevice;
    use candle_core::{DType, Device, Tensor};

    use crate::error::{ModelError, Result};
    use crate::gpu;
    use kernels::Precision;

    /// Rows (one warp each) per CTA of the forward; the kernel's `EMB_WARPS`.
    const EMB_WARPS: usize = 8;

    /// Whether the kernels take these tensors: bf16 rows of `C % 8 == 0` elements, 16-byte
    /// aligned (checked on the device addresses, which include any view offset).
    fn vectorisable(c: usize, ts: &[&Tensor]) -> Result<bool> {
        if !c.is_multiple_of(8) || ts.iter().any(|t| t.dtype() != DType::BF16) {
            return Ok(false);
        }
        for t in ts {
            if !gpu::ptr(t)?.is_multiple_of(16) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Threads a CTA for one row of `C` channels: a thread per 16-byte vector, rounded up to
    /// a warp, at most 256 (threads loop beyond that).
    fn row_threads(c: usize) -> u32 {
        ((c / 8).div_ceil(32) * 32).clamp(32, 256) as u32
    }

    /// `out (B, T, C) = wte[tokens] + wpe[t]`, or `None` for inputs the kernel does not take.
    /// `tokens (B, T)` u32, `wte (V, C)`, `wpe (>= T, C)` bf16. A token id `>= V` gives a NaN
    /// row (the kernel never reads outside `wte`).
    pub(super) fn embedding_forward(
        tokens: &Tensor,
        wte: &Tensor,
        wpe: &Tensor,
    ) -> Result<Option<Tensor>> {
        if tokens.dtype() != DType::U32 || !tokens.device().same_device(wte.device()) {
            return Ok(None);
        }
        let (b, t) = tokens.dims2()?;
        let (v, c) = wte.dims2()?;
        let (max_t, c2) = wpe.dims2()?;
        if c2 != c {
            return Ok(None); // the reference reports the mismatch
        }
        if t > max_t {
            return Err(ModelError::SequenceTooLong { got: t, max: max_t });
        }
        let n = b * t;
        let (tokens, wte, wpe) = (tokens.contiguous()?, wte.contiguous()?, wpe.contiguous()?);
        if n == 0 || !vectorisable(c, &[&wte, &wpe])? {
            return Ok(None);
        }
        let dev = gpu::device(&wte)?;
        let out = gpu::uninit((b, t, c), DType::BF16, &dev)?;
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::EMBEDDING,
            &[("EMB_WARPS", EMB_WARPS as i64)],
            "embedding_forward",
        )?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(EMB_WARPS) as u32, 1, 1),
            block_dim: (32 * EMB_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (p_out, p_tok, p_wte, p_wpe) = (
            gpu::ptr(&out)?,
            gpu::ptr(&tokens)?,
            gpu::ptr(&wte)?,
            gpu::ptr(&wpe)?,
        );
        let (n_i, t_i, c_i, v_i) = (n as i32, t as i32, c as i32, v as i32);
        // SAFETY: argument list of `embedding_forward`; out is (N, C), tokens (N), wte (V, C),
        // wpe (>= T, C), all contiguous; token ids >= V are not dereferenced.
        unsafe {
            func.launch(
                cfg,
                &[&p_out, &p_tok, &p_wte, &p_wpe, &n_i, &t_i, &c_i, &v_i],
            )?;
        }
        Ok(Some(out))
    }

    /// The ids of `tokens` (u32 on a GPU) on the host, each checked `< vocab_size`; `None` for
    /// other tokens. Synchronises: one device->host read of `N` u32, which waits for the work
    /// queued before it on the stream (at the embedding's forward, little more than the
    /// tokens' upload).
    pub(super) fn read_ids(tokens: &Tensor, vocab_size: usize) -> Result<Option<Vec<u32>>> {
        if !tokens.device().is_cuda() || tokens.dtype() != DType::U32 || tokens.elem_count() == 0 {
            return Ok(None);
        }
        let ids = tokens.flatten_all()?.to_vec1::<u32>()?; // the device->host sync
        if let Some(&k) = ids.iter().find(|&&k| k as usize >= vocab_size) {
            return Err(candle_core::Error::Msg(format!(
                "embedding: token id {k} >= vocab size {vocab_size}"
            ))
            .into());
        }
        Ok(Some(ids))
    }

    /// The stable CSR of the positions of `ids` (each `< vocab_size`) by token,
    /// `[tok_0..tok_nd | off_0..off_nd | pos_0..pos_{N-1}]`, uploaded to `dev`, and `nd`, the
    /// number of distinct tokens. A counting sort on the host; no read back.
    fn csr(ids: &[u32], vocab_size: usize, dev: &CudaDevice) -> Result<(Tensor, usize)> {
        let n = ids.len();
        let mut count = vec![0u32; vocab_size];
        for &k in ids {
            count[k as usize] += 1;
        }
        let distinct: Vec<u32> = (0..vocab_size as u32)
            .filter(|&k| count[k as usize] > 0)
            .collect();
        let nd = distinct.len();
        let mut csr = Vec::with_capacity(2 * nd + 1 + n);
        csr.extend_from_slice(&distinct);
        // `count` becomes each token's next free slot in the position list.
        let mut off = 0u32;
        for &k in &distinct {
            csr.push(off);
            let c_k = count[k as usize];
            count[k as usize] = off;
            off += c_k;
        }
        csr.push(off);
        let base = csr.len();
        csr.resize(base + n, 0);
        for (p, &k) in ids.iter().enumerate() {
            let slot = &mut count[k as usize];
            csr[base + *slot as usize] = p as u32;
            *slot += 1;
        }
        let csr = Tensor::from_vec(csr, 2 * nd + 1 + n, &Device::Cuda(dev.clone()))?;
        Ok((csr, nd))
    }

    /// `(dwte (V, C), dwpe (max_t, C))` from `dout (B, T, C)` bf16 and the tokens' index, or
    /// `None` for inputs the kernels do not take (an index made on the CPU, without host ids,
    /// among them). With `onto` (a bf16 contiguous `(V, C)` gradient of the table) the token
    /// rows are added into it in place and it is returned as `dwte`.
    /// Deterministic: each `dwte` row sums its positions in increasing order in f32 (the CSR's
    /// order), each `dwpe` row sums over `b` in order. Reads nothing back to the host: the CSR
    /// is built from the index's host ids and uploaded.
    pub(super) fn embedding_backward(
        dout: &Tensor,
        index: &super::TokenIndex,
        vocab_size: usize,
        max_t: usize,
        onto: Option<&Tensor>,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let (tokens, Some(ids)) = (index.tokens(), &index.host) else {
            return Ok(None);
        };
        if index.vocab_size != vocab_size || !tokens.device().same_device(dout.device()) {
            return Ok(None);
        }
        let (b, t, c) = dout.dims3()?;
        if tokens.dims() != [b, t] {
            return Ok(None); // the reference reports the mismatch
        }
        if t > max_t {
            return Err(ModelError::SequenceTooLong { got: t, max: max_t });
        }
        let n = b * t;
        let dout = dout.contiguous()?;
        if n == 0 || vocab_size == 0 || !vectorisable(c, &[&dout])? {
            return Ok(None);
        }
        let dev = gpu::device(&dout)?;
        let (csr, nd) = csr(ids, vocab_size, &dev)?;

        // onto as the kernel adds into it; one it does not take is added after the kernel.
        let in_place = match onto {
            Some(o) => {
                o.dtype() == DType::BF16
                    && o.is_contiguous()
                    && o.dims() == [vocab_size, c]
                    && o.device().same_device(dout.device())
                    && vectorisable(c, &[o])?
            }
            None => false,
        };
        let (dwte, onto_flag) = match (onto, in_place) {
            (Some(o), true) => (o.clone(), 1i32),
            _ => (
                Tensor::zeros((vocab_size, c), DType::BF16, dout.device())?,
                0i32,
            ),
        };
        let dwpe = gpu::uninit((max_t, c), DType::BF16, &dev)?;
        let threads = row_threads(c);
        let f_wte = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::EMBEDDING,
            &[],
            "embedding_backward_wte",
        )?;
        let f_wpe = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::EMBEDDING,
            &[],
            "embedding_backward_wpe",
        )?;
        let (p_dwte, p_dwpe, p_dout, p_csr) = (
            gpu::ptr(&dwte)?,
            gpu::ptr(&dwpe)?,
            gpu::ptr(&dout)?,
            gpu::ptr(&csr)?,
        );
        let (nd_i, b_i, t_i, c_i) = (nd as i32, b as i32, t as i32, c as i32);
        // SAFETY: argument lists of the two kernels; dwte is (V, C) bf16 contiguous (zeroed, or
        // the caller's onto, checked above, which the kernel updates in place) and every CSR
        // token < V, every CSR position < N = rows of dout; dwpe is (max_t, C), one CTA a row.
        unsafe {
            f_wte.launch(
                LaunchConfig {
                    grid_dim: (nd as u32, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[&p_dwte, &p_dout, &p_csr, &nd_i, &c_i, &onto_flag],
            )?;
            f_wpe.launch(
                LaunchConfig {
                    grid_dim: (max_t as u32, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[&p_dwpe, &p_dout, &b_i, &t_i, &c_i],
            )?;
        }
        match (onto, in_place) {
            (Some(o), false) => Ok(Some(((o + dwte)?, dwpe))),
            _ => Ok(Some((dwte, dwpe))),
        }
    }
}
