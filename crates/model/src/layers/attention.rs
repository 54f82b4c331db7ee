//! Causal multi-head self-attention: the part between `c_attn` and `c_proj`.
//!
//! Flash-style: forward saves only the output and the per-row log-sum-exp of the scores, and
//! backward recomputes the probabilities from them. Both read `q, k, v` where the QKV GEMM wrote
//! them, `qkv (B, T, 3C)` with columns `[q | k | v]`, each split into `NH` heads of `hs` (HF GPT2
//! `split_heads`), and write `y (B, T, C)` with the heads merged: no permute is copied on the
//! GPU path.

use candle_core::{DType, Device, Tensor, D};

use crate::error::Result;

/// What [`attention_forward`] saves for [`attention_backward`].
#[derive(Clone, Debug)]
pub struct AttSaved {
    /// The forward's input `(B, T, 3C)`.
    pub qkv: Tensor,
    /// The forward's output `(B, T, C)`.
    pub y: Tensor,
    /// `lse[b, h, t] = log(sum_s exp(score[t, s]))` over the causal row, `(B, NH, T)`: f32
    /// (f64 for f64 inputs, so that the reference keeps its precision).
    pub lse: Tensor,
    /// Heads.
    pub n_head: usize,
}

/// Additive causal mask `(T, T)`: 0 on and below the diagonal, `-inf` above.
pub fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let m: Vec<f32> = (0..t * t)
        .map(|ij| {
            if ij % t > ij / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Ok(Tensor::from_vec(m, (t, t), device)?.to_dtype(dtype)?)
}

/// `y = softmax(q k^T / sqrt(hs) + mask) v`, heads merged back.
///
/// Shapes: `qkv (B, T, 3C)` -> `y (B, T, C)`. Saves `qkv`, `y` and `lse (B, NH, T)`.
pub fn attention_forward(qkv: &Tensor, n_head: usize) -> Result<(Tensor, AttSaved)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(qkv) {
        let _span = kernels::profile::scope(qkv.device(), kernels::profile::Family::Attention);
        if let Some(r) = cuda::attention_forward(qkv, n_head)? {
            return Ok(r);
        }
        super::attention_declined("attention::attention_forward", qkv)?;
    }
    reference_forward(qkv, n_head)
}

/// [`attention_forward`] on the GPU with query tiles of `block` rows (64 or 128): for the
/// tuning benchmark in tests/gpu/attention.rs. `None` where the kernel does not take the input.
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn attention_forward_tiled(
    qkv: &Tensor,
    n_head: usize,
    block: usize,
) -> Result<Option<(Tensor, AttSaved)>> {
    if !matches!(block, 64 | 128) {
        return Ok(None);
    }
    cuda::forward_tiled(qkv, n_head, block)
}

/// [`attention_backward`] on the GPU with `keys` (64 or 128) keys a CTA and the kernel's
/// `BWD_EARLY_P` order `early_p`: for the tuning benchmark in tests/gpu/attention.rs. `keys` 0
/// runs only the pre- and post-passes (dqkv's k and v columns are left undefined), to time them.
/// `None` where the kernel does not take the input (also hs 16 with 128 keys).
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn attention_backward_tiled(
    dy: &Tensor,
    saved: &AttSaved,
    keys: usize,
    early_p: bool,
) -> Result<Option<Tensor>> {
    if !matches!(keys, 0 | 64 | 128) {
        return Ok(None);
    }
    cuda::backward_tiled(dy, saved, Some((keys, early_p)))
}

/// Which GPU implementation runs the attention: [`attention_forward`] takes cuDNN where it can
/// and our flash kernels elsewhere; the tests and benchmarks in tests/gpu/attention.rs name one.
#[cfg(feature = "cuda")]
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// cuDNN's fused SDPA (crates/model/src/cudnn/).
    Cudnn,
    /// Ours: kernels/cuda/attention.cu, at its default tiles.
    Flash,
}

/// [`attention_forward`] by `kernel` only; `None` where it does not take the input.
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn attention_forward_with(
    kernel: AttentionKernel,
    qkv: &Tensor,
    n_head: usize,
) -> Result<Option<(Tensor, AttSaved)>> {
    match kernel {
        AttentionKernel::Cudnn => cuda::cudnn_forward(qkv, n_head),
        AttentionKernel::Flash => cuda::forward_tiled(qkv, n_head, cuda::FWD_BLOCK),
    }
}

/// [`attention_backward`] by `kernel` only; `None` where it does not take the input.
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn attention_backward_with(
    kernel: AttentionKernel,
    dy: &Tensor,
    saved: &AttSaved,
) -> Result<Option<Tensor>> {
    match kernel {
        AttentionKernel::Cudnn => cuda::cudnn_backward(dy, saved),
        AttentionKernel::Flash => cuda::backward_tiled(dy, saved, None),
    }
}

/// Why cuDNN does not take the forward (or `backward`) at `qkv`'s shape; `Ok(())` when it
/// does. For the tests, which require cuDNN where the H200 has it.
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn attention_cudnn_support(
    qkv: &Tensor,
    n_head: usize,
    backward: bool,
) -> Result<std::result::Result<(), String>> {
    cuda::cudnn_support(qkv, n_head, backward)
}

/// Gradient of [`attention_forward`]: `dy (B, T, C)` -> `dqkv (B, T, 3C)`.
pub fn attention_backward(dy: &Tensor, saved: &AttSaved) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(dy) {
        let _span = kernels::profile::scope(dy.device(), kernels::profile::Family::Attention);
        if let Some(r) = cuda::attention_backward(dy, saved)? {
            return Ok(r);
        }
        super::attention_declined("attention::attention_backward", dy)?;
    }
    reference_backward(dy, saved)
}

/// `q, k, v`, each `(B, NH, T, hs)` contiguous, from `qkv (B, T, 3C)`.
fn split_heads(qkv: &Tensor, n_head: usize) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, t, c3) = qkv.dims3()?;
    let hs = c3 / 3 / n_head;
    // (B, T, 3, NH, hs) -> (3, B, NH, T, hs): one copy, then q/k/v are contiguous views.
    let qkv = qkv
        .reshape((b, t, 3, n_head, hs))?
        .permute((2, 0, 3, 1, 4))?
        .contiguous()?;
    Ok((qkv.get(0)?, qkv.get(1)?, qkv.get(2)?))
}

/// Scaled, masked scores `q k^T / sqrt(hs) + mask`, `(B, NH, T, T)`.
fn scores(q: &Tensor, k: &Tensor) -> Result<Tensor> {
    let (_, _, t, hs) = q.dims4()?;
    let mask = causal_mask(t, q.dtype(), q.device())?;
    Ok(q.matmul(&k.t()?)?
        .affine(1.0 / (hs as f64).sqrt(), 0.0)?
        .broadcast_add(&mask)?)
}

/// [`attention_forward`] with basic candle ops, in the dtype of `qkv`.
pub(crate) fn reference_forward(qkv: &Tensor, n_head: usize) -> Result<(Tensor, AttSaved)> {
    let (b, t, c3) = qkv.dims3()?;
    let (q, k, v) = split_heads(qkv, n_head)?;
    let preatt = scores(&q, &k)?;
    // Numerically stable softmax over the last dim; the diagonal is never masked, so the max is finite.
    let max = preatt.max_keepdim(D::Minus1)?;
    let e = preatt.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let att = e.broadcast_div(&sum)?;
    let lse_dtype = match qkv.dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let lse = (sum.log()? + max)?.squeeze(3)?.to_dtype(lse_dtype)?;
    let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c3 / 3))?;
    let saved = AttSaved {
        qkv: qkv.clone(),
        y: y.clone(),
        lse,
        n_head,
    };
    Ok((y, saved))
}

/// [`attention_backward`] with basic candle ops: the probabilities are recomputed from `lse`.
pub(crate) fn reference_backward(dy: &Tensor, saved: &AttSaved) -> Result<Tensor> {
    let AttSaved {
        qkv, lse, n_head, ..
    } = saved;
    let (b, t, c3) = qkv.dims3()?;
    let (c, hs) = (c3 / 3, c3 / 3 / n_head);
    let (q, k, v) = split_heads(qkv, *n_head)?;
    // att = exp(preatt - lse): the forward's softmax; masked entries give exp(-inf) = 0.
    let lse = lse.to_dtype(q.dtype())?.unsqueeze(3)?;
    let att = scores(&q, &k)?.broadcast_sub(&lse)?.exp()?;
    let dy = dy
        .reshape((b, t, *n_head, hs))?
        .transpose(1, 2)?
        .contiguous()?;
    // y = att @ v
    let datt = dy.matmul(&v.t()?)?;
    let dv = att.t()?.matmul(&dy)?;
    // att = softmax(preatt): dpreatt = att * (datt - sum(att * datt)); masked entries have att = 0.
    let inner = (&att * &datt)?.sum_keepdim(D::Minus1)?;
    let scale = 1.0 / (hs as f64).sqrt();
    let dpreatt = (&att * datt.broadcast_sub(&inner)?)?.affine(scale, 0.0)?;
    // preatt = q @ k^T * scale
    let dq = dpreatt.matmul(&k)?;
    let dk = dpreatt.t()?.matmul(&q)?;
    // (3, B, NH, T, hs) -> (B, T, 3, NH, hs) -> (B, T, 3C), undoing the split.
    Ok(Tensor::stack(&[dq, dk, dv], 0)?
        .permute((1, 3, 0, 2, 4))?
        .reshape((b, t, 3 * c))?)
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launchers of `kernels/cuda/attention.cu`: flash forward and backward on bf16 tensor cores,
    //! one module per head size `hs` in {16, 32, 64, 128}; other head sizes, dtypes other than
    //! bf16 and misaligned inputs return `None` (the reference runs).
    use super::AttSaved;
    use crate::error::Result;
    use crate::gpu;
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
    use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig};
    use candle_core::{DType, Tensor};
    use kernels::Precision;

    /// Query rows = key rows of a tile (the kernels' `BLOCK`: `BLOCK/16` warps a CTA).
    pub(super) const FWD_BLOCK: usize = 64;
    /// The backward's query tile (64: at 128 its registers spill).
    const BWD_BLOCK: usize = 64;
    /// The backward's tuning by head size: (keys a CTA = the kernel's `BKEYS`, `BKEYS/16` warps;
    /// its `BWD_EARLY_P` order), the fastest measured on the H200 at T 1024, C 1024 (see
    /// attention.cu's header). hs 16 cannot take 128 keys.
    fn bwd_tune(hs: usize) -> (usize, bool) {
        match hs {
            64 => (128, false),
            128 => (128, true),
            _ => (64, false),
        }
    }
    /// Threads a block of the element-wise pre/post kernels.
    const ELEM_THREADS: u32 = 256;

    /// `(B, T, C, hs)` of `qkv (B, T, 3C)` when the kernels take it.
    fn shape(qkv: &Tensor, n_head: usize) -> Result<Option<(usize, usize, usize, usize)>> {
        if qkv.dtype() != DType::BF16 || !qkv.is_contiguous() || n_head == 0 {
            return Ok(None);
        }
        let (b, t, c3) = qkv.dims3()?;
        if c3 % (3 * n_head) != 0 || b == 0 || t == 0 {
            return Ok(None);
        }
        let (c, hs) = (c3 / 3, c3 / 3 / n_head);
        // Grid y is the number of tiles (at most 65535); ints index rows within a sequence.
        let fits = t.div_ceil(FWD_BLOCK.min(BWD_BLOCK)) <= 65_535
            && b * n_head.max(t) <= i32::MAX as usize;
        if !crate::kernel_plan::OWN_ATTENTION_HEAD_SIZES.contains(&hs)
            || !fits
            || (b * t * c / 8) > u32::MAX as usize
        {
            return Ok(None);
        }
        Ok(Some((b, t, c, hs)))
    }

    /// The module's defines: head size `hs` and tile `block`.
    fn defines(hs: usize, block: usize) -> [kernels::Define; 2] {
        [("HS", hs as i64), ("BLOCK", block as i64)]
    }

    /// Lets `f` use `bytes` of dynamic shared memory (above the 48 KiB default).
    fn allow_smem(f: &CudaFunction, bytes: usize) -> Result<()> {
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
        .map_err(candle_core::Error::wrap)?;
        Ok(())
    }

    /// Bytes of one padded `block x (hs + 8)` bf16 tile (attention.cu's `TILE_BYTES`).
    fn tile_bytes(block: usize, hs: usize) -> usize {
        block * (hs + 8) * 2
    }

    /// Grid of an element-wise kernel with one thread per 8 of `n` elements.
    fn elem_grid(n: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((n / 8).div_ceil(ELEM_THREADS as usize) as u32, 1, 1),
            block_dim: (ELEM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The flash forward, or `None` for shapes the kernel does not take.
    ///
    /// `qkv (B, T, 3C)` -> `y (B, T, C)`, `lse (B, NH, T)` f32. Grid `(B*NH, T/64)`, 128 threads.
    pub(super) fn attention_forward(
        qkv: &Tensor,
        n_head: usize,
    ) -> Result<Option<(Tensor, AttSaved)>> {
        if let Some(r) = cudnn_forward(qkv, n_head)? {
            return Ok(Some(r));
        }
        forward_tiled(qkv, n_head, FWD_BLOCK)
    }

    /// `(B, NH, T, hs)` for cuDNN when `qkv` suits it: bf16, contiguous, k and v 16-byte
    /// aligned inside a row (C a multiple of 8), hs a multiple of 8 up to 128.
    fn cudnn_shape(qkv: &Tensor, n_head: usize) -> Result<Option<crate::cudnn::Shape>> {
        if qkv.dtype() != DType::BF16 || !qkv.is_contiguous() || n_head == 0 {
            return Ok(None);
        }
        let (b, t, c3) = qkv.dims3()?;
        if c3 % (3 * n_head) != 0 || b == 0 || t == 0 {
            return Ok(None);
        }
        let (c, hs) = (c3 / 3, c3 / 3 / n_head);
        if !crate::kernel_plan::cudnn_takes_head_size(hs) || c % 8 != 0 || gpu::ptr(qkv)? % 16 != 0
        {
            return Ok(None);
        }
        Ok(Some(crate::cudnn::Shape {
            batch: b,
            heads: n_head,
            kv_heads: n_head,
            seq: t,
            head_size: hs,
        }))
    }

    /// The forward through cuDNN's fused SDPA, or `None` where cuDNN does not take the input.
    pub(crate) fn cudnn_forward(qkv: &Tensor, n_head: usize) -> Result<Option<(Tensor, AttSaved)>> {
        let Some(shape) = cudnn_shape(qkv, n_head)? else {
            return Ok(None);
        };
        let (b, t) = (shape.batch, shape.seq);
        let c = n_head * shape.head_size;
        let dev = gpu::device(qkv)?;
        let y = gpu::uninit((b, t, c), DType::BF16, &dev)?;
        let lse = gpu::uninit((b, n_head, t), DType::F32, &dev)?;
        let args = crate::cudnn::ForwardArgs {
            qkv: gpu::ptr(qkv)?,
            y: gpu::ptr(&y)?,
            lse: gpu::ptr(&lse)?,
        };
        if !crate::cudnn::forward(&dev, shape, &args)? {
            return Ok(None);
        }
        let saved = AttSaved {
            qkv: qkv.clone(),
            y: y.clone(),
            lse,
            n_head,
        };
        Ok(Some((y, saved)))
    }

    /// Whether `dy`, `y (B, T, C)` bf16 and `lse (B, NH, T)` f32 are what both backwards take
    /// (contiguous, of the forward's shape `(B, T, C, NH)`).
    fn backward_takes(
        dy: &Tensor,
        y: &Tensor,
        lse: &Tensor,
        (b, t, c, n_head): (usize, usize, usize, usize),
    ) -> bool {
        dy.dtype() == DType::BF16
            && y.dtype() == DType::BF16
            && lse.dtype() == DType::F32
            && dy.dims() == [b, t, c]
            && y.dims() == [b, t, c]
            && lse.dims() == [b, n_head, t]
            && dy.is_contiguous()
            && y.is_contiguous()
            && lse.is_contiguous()
    }

    /// The backward through cuDNN's fused SDPA, or `None` where cuDNN does not take the input.
    pub(crate) fn cudnn_backward(dy: &Tensor, saved: &AttSaved) -> Result<Option<Tensor>> {
        let AttSaved {
            qkv,
            y,
            lse,
            n_head,
        } = saved;
        let Some(shape) = cudnn_shape(qkv, *n_head)? else {
            return Ok(None);
        };
        let (b, t) = (shape.batch, shape.seq);
        let c = n_head * shape.head_size;
        if !backward_takes(dy, y, lse, (b, t, c, *n_head)) {
            return Ok(None);
        }
        let (p_dy, p_y) = (gpu::ptr(dy)?, gpu::ptr(y)?);
        if (p_dy | p_y) % 16 != 0 {
            return Ok(None);
        }
        let dev = gpu::device(qkv)?;
        let dqkv = gpu::uninit((b, t, 3 * c), DType::BF16, &dev)?;
        let args = crate::cudnn::BackwardArgs {
            qkv: gpu::ptr(qkv)?,
            y: p_y,
            lse: gpu::ptr(lse)?,
            dy: p_dy,
            dqkv: gpu::ptr(&dqkv)?,
        };
        if !crate::cudnn::backward(&dev, shape, &args)? {
            return Ok(None);
        }
        Ok(Some(dqkv))
    }

    /// Why cuDNN does not take `(pass, qkv)` (`Ok(())` when it does): for the GPU tests.
    pub(crate) fn cudnn_support(
        qkv: &Tensor,
        n_head: usize,
        backward: bool,
    ) -> Result<std::result::Result<(), String>> {
        let Some(shape) = cudnn_shape(qkv, n_head)? else {
            return Ok(Err("the input's dtype, layout or head size".into()));
        };
        let pass = if backward {
            crate::cudnn::Pass::Backward
        } else {
            crate::cudnn::Pass::Forward
        };
        crate::cudnn::support(&gpu::device(qkv)?, pass, shape)
    }

    /// [`attention_forward`] with query tiles of `block` rows (64 or 128), for tuning.
    pub(crate) fn forward_tiled(
        qkv: &Tensor,
        n_head: usize,
        block: usize,
    ) -> Result<Option<(Tensor, AttSaved)>> {
        let Some((b, t, c, hs)) = shape(qkv, n_head)? else {
            return Ok(None);
        };
        let p_qkv = gpu::ptr(qkv)?;
        if p_qkv % 16 != 0 {
            return Ok(None);
        }
        let dev = gpu::device(qkv)?;
        let y = gpu::uninit((b, t, c), DType::BF16, &dev)?;
        let lse = gpu::uninit((b, n_head, t), DType::F32, &dev)?;
        // Q + double-buffered K and V.
        let smem = 5 * tile_bytes(block, hs);
        let f = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::ATTENTION,
            &defines(hs, block),
            "attention_forward_kernel",
        )?;
        allow_smem(&f, smem)?;
        let scale = 1.0 / (hs as f32).sqrt();
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        let cfg = LaunchConfig {
            grid_dim: ((b * n_head) as u32, t.div_ceil(block) as u32, 1),
            block_dim: ((block / 16 * 32) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (p_y, p_lse) = (gpu::ptr(&y)?, gpu::ptr(&lse)?);
        let (t_i, nh_i) = (t as i32, n_head as i32);
        // SAFETY: y (B*T*C bf16) and lse (B*NH*T f32) are fresh and fully written by the kernel;
        // qkv holds B*T*3C bf16; the arguments match attention_forward_kernel's list.
        unsafe {
            f.launch(
                cfg,
                &[&p_y, &p_lse, &p_qkv, &t_i, &nh_i, &scale_log2, &scale],
            )?;
        }
        let saved = AttSaved {
            qkv: qkv.clone(),
            y: y.clone(),
            lse,
            n_head,
        };
        Ok(Some((y, saved)))
    }

    /// The flash backward, or `None` for shapes the kernel does not take.
    ///
    /// `dy (B, T, C)` -> `dqkv (B, T, 3C)`: a pre-pass (`D = rowsum(dy * y)` and zeroing the f32
    /// dq accumulator), the main kernel (grid `(B*NH, T/keys)`, `2*keys` threads, one CTA a block
    /// of `keys` = 64 or 128 keys by hs (`bwd_tune`); dq by f32 vector atomics, so its summation
    /// order is not deterministic) and the dq conversion.
    pub(super) fn attention_backward(dy: &Tensor, saved: &AttSaved) -> Result<Option<Tensor>> {
        if let Some(r) = cudnn_backward(dy, saved)? {
            return Ok(Some(r));
        }
        backward_tiled(dy, saved, None)
    }

    /// [`attention_backward`] with `(keys a CTA, BWD_EARLY_P)` = `tune` (`None`: the defaults).
    pub(crate) fn backward_tiled(
        dy: &Tensor,
        saved: &AttSaved,
        tune: Option<(usize, bool)>,
    ) -> Result<Option<Tensor>> {
        let AttSaved {
            qkv,
            y,
            lse,
            n_head,
        } = saved;
        let n_head = *n_head;
        let Some((b, t, c, hs)) = shape(qkv, n_head)? else {
            return Ok(None);
        };
        if !backward_takes(dy, y, lse, (b, t, c, n_head)) {
            return Ok(None);
        }
        let (p_qkv, p_dy, p_y, p_lse) =
            (gpu::ptr(qkv)?, gpu::ptr(dy)?, gpu::ptr(y)?, gpu::ptr(lse)?);
        if (p_qkv | p_dy | p_y) % 16 != 0 || p_lse % 4 != 0 {
            return Ok(None);
        }
        let dev = gpu::device(qkv)?;
        let dqkv = gpu::uninit((b, t, 3 * c), DType::BF16, &dev)?;
        let dsum = gpu::uninit((b, n_head, t), DType::F32, &dev)?;
        // Zeroed by the pre-pass kernel.
        let dq_acc = gpu::uninit((b, t, c), DType::F32, &dev)?;
        let (p_dqkv, p_dsum, p_acc) = (gpu::ptr(&dqkv)?, gpu::ptr(&dsum)?, gpu::ptr(&dq_acc)?);
        let scale = 1.0 / (hs as f32).sqrt();
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        let (bt_i, t_i, nh_i) = ((b * t) as i32, t as i32, n_head as i32);

        let (keys, early_p) = tune.unwrap_or_else(|| bwd_tune(hs));
        // keys 0 (tuning only): the pre- and post-passes alone, to time them.
        let (keys, main_pass) = if keys == 0 { (64, false) } else { (keys, true) };
        if keys == 128 && hs == 16 {
            return Ok(None);
        }
        let [d_hs, d_block] = defines(hs, BWD_BLOCK);
        let module = [
            d_hs,
            d_block,
            ("BKEYS", keys as i64),
            ("BWD_EARLY_P", early_p as i64),
        ];
        let pre = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::ATTENTION,
            &module,
            "attention_backward_preprocess",
        )?;
        // SAFETY: dsum (B*NH*T f32) and dq_acc (B*T*C f32) are fresh and fully written; dy and y
        // hold B*T*C bf16; the arguments match attention_backward_preprocess's list.
        unsafe {
            pre.launch(
                elem_grid(b * t * c),
                &[&p_dsum, &p_acc, &p_dy, &p_y, &bt_i, &t_i, &nh_i],
            )?;
        }

        // K, V (BKEYS rows), double-buffered Q and dO (BLOCK rows), dS^T (BKEYS x (BLOCK + 8)
        // bf16), lse and D (2 x 2 x BLOCK f32): attention.cu's shared layout.
        let smem = 2 * tile_bytes(keys, hs)
            + 4 * tile_bytes(BWD_BLOCK, hs)
            + keys * (BWD_BLOCK + 8) * 2
            + 4 * BWD_BLOCK * 4;
        let main = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::ATTENTION,
            &module,
            "attention_backward_kernel",
        )?;
        allow_smem(&main, smem)?;
        let cfg = LaunchConfig {
            grid_dim: ((b * n_head) as u32, t.div_ceil(keys) as u32, 1),
            block_dim: ((keys / 16 * 32) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        if main_pass {
            // SAFETY: dqkv (B*T*3C bf16): the kernel writes every k and v column; dq_acc was
            // zeroed above on the same stream; qkv (B*T*3C), dy (B*T*C) bf16, lse and dsum
            // (B*NH*T) f32; the arguments match attention_backward_kernel's list.
            unsafe {
                main.launch(
                    cfg,
                    &[
                        &p_dqkv,
                        &p_acc,
                        &p_qkv,
                        &p_dy,
                        &p_lse,
                        &p_dsum,
                        &t_i,
                        &nh_i,
                        &scale_log2,
                        &scale,
                    ],
                )?;
            }
        }

        let conv = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::ATTENTION,
            &module,
            "attention_backward_dq",
        )?;
        // SAFETY: writes the q columns of dqkv (every one) from dq_acc (B*T*C f32); the
        // arguments match attention_backward_dq's list.
        unsafe {
            conv.launch(
                elem_grid(b * t * c),
                &[&p_dqkv, &p_acc, &bt_i, &nh_i, &scale],
            )?;
        }
        Ok(Some(dqkv))
    }
}
