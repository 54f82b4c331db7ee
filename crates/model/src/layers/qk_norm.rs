//! Qwen3's q/k norm: an RMSNorm of each query head and each key head over its `hs` channels,
//! with one `(hs)` weight for all query heads and another for all key heads, applied to the
//! packed q|k|v projection before the rotation (HF `Qwen3Attention`: `q_norm(q_proj(x).view(..,
//! hs))`). v passes unchanged.
//!
//! Shapes: `qkv (B, T, W)`, `W = (NH + 2 KV) hs`, q in columns `0..NH hs`, k in the next
//! `KV hs`; `wq, wk (hs)`; `N = B T`. The reference is the RMSNorm of `rmsnorm.rs` on the
//! `(N NH, hs)` rows of q and the `(N KV, hs)` rows of k, copied out of the packed buffer and
//! back; the statistics are f32 (f64 for f64). On the GPU one kernel a direction
//! (`kernels/cuda/qk_norm.cu`) normalises the heads in place in the packed buffer, with the
//! reference's rounding points (the normalised head rounded to bf16 before the weight multiplies
//! it), and reduces the weights' gradients deterministically.

use candle_core::Tensor;

use super::rmsnorm::{rmsnorm_backward, rmsnorm_forward, RmsSaved};
use super::rope::RopeTables;
use crate::error::{ModelError, Result};

/// The widest head the GPU kernel takes (one 16-byte vector a lane, a warp a head); the
/// kernel plan refuses wider ones with qk-norm.
pub(crate) const QK_NORM_MAX_HEAD_SIZE: usize = 256;

/// What [`qk_norm_backward`] reads: q's and k's heads before the norm and their statistics,
/// as the path that ran the forward keeps them.
#[derive(Clone, Debug)]
pub struct QkNormSaved {
    kept: Kept,
    n_head: usize,
    n_kv_head: usize,
}

#[derive(Clone, Debug)]
enum Kept {
    /// The reference's: q's rows `(N NH, hs)` and k's `(N KV, hs)` before the norm, and their
    /// RMSNorm statistics.
    Rows {
        q: Tensor,
        k: Tensor,
        q_rms: RmsSaved,
        k_rms: RmsSaved,
    },
    /// The GPU kernel's: the q and k heads before the norm as the packed buffer holds them,
    /// `x (N, (NH + KV) hs)` bf16, and each head's `rstd (N, NH + KV)` f32.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Packed { x: Tensor, rstd: Tensor },
}

impl QkNormSaved {
    /// q's rows `(N NH, hs)` and k's `(N KV, hs)` before the norm, and their statistics
    /// (`rstd (N NH)`, `(N KV)`), in the reference's layout whichever path kept them (copied
    /// out of the kernel's packed ones when the GPU ran the forward): what the reference's
    /// backward reads, and what the GPU tests compare.
    pub fn rows(&self) -> Result<(Tensor, Tensor, RmsSaved, RmsSaved)> {
        let (nh, kv) = (self.n_head, self.n_kv_head);
        match &self.kept {
            Kept::Rows { q, k, q_rms, k_rms } => {
                Ok((q.clone(), k.clone(), q_rms.clone(), k_rms.clone()))
            }
            Kept::Packed { x, rstd } => {
                let (n, width) = x.dims2()?;
                let hs = width / (nh + kv);
                let rows = |off: usize, heads: usize| -> Result<(Tensor, RmsSaved)> {
                    let h = x
                        .narrow(1, off * hs, heads * hs)?
                        .contiguous()?
                        .reshape((n * heads, hs))?;
                    let r = rstd.narrow(1, off, heads)?.contiguous()?.flatten_all()?;
                    Ok((h, RmsSaved { rstd: r }))
                };
                let ((q, q_rms), (k, k_rms)) = (rows(0, nh)?, rows(nh, kv)?);
                Ok((q, k, q_rms, k_rms))
            }
        }
    }
}

/// `(b, t)` of a packed `qkv` of `n_head` query and `n_kv_head` key/value heads of width
/// `hs`, or an error naming what does not fit.
fn sizes(qkv: &Tensor, hs: usize, n_head: usize, n_kv_head: usize) -> Result<(usize, usize)> {
    let (b, t, w) = qkv.dims3()?;
    if hs == 0 || w != (n_head + 2 * n_kv_head) * hs {
        return Err(ModelError::ShapeMismatch {
            what: "q/k norm input (B, T, (NH + 2 KV) hs)",
            expected: vec![b, t, (n_head + 2 * n_kv_head) * hs],
            got: qkv.dims().to_vec(),
        });
    }
    Ok((b, t))
}

/// The packed `qkv` with each query head normalised by `wq`, each key head by `wk` (`eps` the
/// model's RMSNorm epsilon); v unchanged. Returns the new packed buffer and what the backward
/// reads (q's and k's heads before the norm, `(NH + KV) hs` elements a position, and their
/// statistics).
///
/// On the GPU the heads are normalised in place, in `qkv`'s own storage (so `qkv` is taken by
/// value, as [`super::rope_qk_forward`] takes it: no other handle may still want the values
/// before the norm), with no pass over v.
pub fn qk_norm_forward(
    qkv: Tensor,
    wq: &Tensor,
    wk: &Tensor,
    n_head: usize,
    n_kv_head: usize,
    eps: f64,
) -> Result<(Tensor, QkNormSaved)> {
    let hs = wq.dim(0)?;
    sizes(&qkv, hs, n_head, n_kv_head)?;
    #[cfg(feature = "cuda")]
    if super::on_gpu(&qkv) {
        let _span = kernels::profile::scope(qkv.device(), kernels::profile::Family::Norm);
        if let Some((x, rstd)) = cuda::forward(&qkv, wq, wk, None, n_head, n_kv_head, eps)? {
            let kept = Kept::Packed { x, rstd };
            return Ok((
                qkv,
                QkNormSaved {
                    kept,
                    n_head,
                    n_kv_head,
                },
            ));
        }
        super::declined("qk_norm::forward", &qkv)?;
    }
    reference_forward(&qkv, wq, wk, n_head, n_kv_head, eps)
}

/// [`qk_norm_forward`] with basic candle ops (and [`rmsnorm_forward`] on q's and k's rows).
fn reference_forward(
    qkv: &Tensor,
    wq: &Tensor,
    wk: &Tensor,
    n_head: usize,
    n_kv_head: usize,
    eps: f64,
) -> Result<(Tensor, QkNormSaved)> {
    let hs = wq.dim(0)?;
    let (b, t) = sizes(qkv, hs, n_head, n_kv_head)?;
    let rows = |off: usize, heads: usize| -> Result<Tensor> {
        Ok(qkv
            .narrow(2, off * hs, heads * hs)?
            .contiguous()?
            .reshape((b * t * heads, hs))?)
    };
    let (q, k) = (rows(0, n_head)?, rows(n_head, n_kv_head)?);
    let (qn, q_rms) = rmsnorm_forward(&q, wq, eps)?;
    let (kn, k_rms) = rmsnorm_forward(&k, wk, eps)?;
    let v = qkv.narrow(2, (n_head + n_kv_head) * hs, n_kv_head * hs)?;
    let out = Tensor::cat(
        &[
            &qn.reshape((b, t, n_head * hs))?,
            &kn.reshape((b, t, n_kv_head * hs))?,
            &v,
        ],
        2,
    )?;
    let saved = QkNormSaved {
        kept: Kept::Rows { q, k, q_rms, k_rms },
        n_head,
        n_kv_head,
    };
    Ok((out, saved))
}

/// Gradients of [`qk_norm_forward`]: `dout (B, T, W)` -> `(dqkv (B, T, W), dwq (hs), dwk
/// (hs))`; dv passes unchanged. Returned, not accumulated.
///
/// On the GPU (when the kernel ran the forward) dq and dk are written in place over dout's q
/// and k columns, like [`super::rope_qk_backward`], and `dwq`, `dwk` are deterministic
/// (fixed-order partial sums).
pub fn qk_norm_backward(
    dout: Tensor,
    saved: &QkNormSaved,
    wq: &Tensor,
    wk: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (nh, kv) = (saved.n_head, saved.n_kv_head);
    let hs = wq.dim(0)?;
    sizes(&dout, hs, nh, kv)?;
    #[cfg(feature = "cuda")]
    if super::on_gpu(&dout) {
        let _span = kernels::profile::scope(dout.device(), kernels::profile::Family::Norm);
        if let Kept::Packed { x, rstd } = &saved.kept {
            if let Some((dwq, dwk)) = cuda::backward(&dout, x, rstd, wq, wk, None, nh, kv)? {
                return Ok((dout, dwq, dwk));
            }
        }
        super::declined("qk_norm::backward", &dout)?;
    }
    reference_backward(&dout, saved, wq, wk)
}

/// [`qk_norm_backward`] with [`rmsnorm_backward`] on q's and k's rows.
fn reference_backward(
    dout: &Tensor,
    saved: &QkNormSaved,
    wq: &Tensor,
    wk: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (nh, kv) = (saved.n_head, saved.n_kv_head);
    let hs = wq.dim(0)?;
    let (b, t) = sizes(dout, hs, nh, kv)?;
    let rows = |off: usize, heads: usize| -> Result<Tensor> {
        Ok(dout
            .narrow(2, off * hs, heads * hs)?
            .contiguous()?
            .reshape((b * t * heads, hs))?)
    };
    let (q, k, q_rms, k_rms) = saved.rows()?;
    let (dq, dwq) = rmsnorm_backward(&rows(0, nh)?, &q_rms, &q, wq, None)?;
    let (dk, dwk) = rmsnorm_backward(&rows(nh, kv)?, &k_rms, &k, wk, None)?;
    let dv = dout.narrow(2, (nh + kv) * hs, kv * hs)?;
    let dqkv = Tensor::cat(
        &[
            &dq.reshape((b, t, nh * hs))?,
            &dk.reshape((b, t, kv * hs))?,
            &dv,
        ],
        2,
    )?;
    Ok((dqkv, dwq, dwk))
}

/// [`qk_norm_forward`] and then [`super::rope_qk_forward`] with `rope` on the q and k heads
/// (Qwen3's attention input). On the GPU one pass: the norm's kernel turns each head after
/// normalising it (the bits of the two kernels, `rope.cuh`'s arithmetic in both), one read and
/// write of q and k fewer.
pub fn qk_norm_rope_forward(
    qkv: Tensor,
    wq: &Tensor,
    wk: &Tensor,
    rope: &RopeTables,
    n_head: usize,
    n_kv_head: usize,
    eps: f64,
) -> Result<(Tensor, QkNormSaved)> {
    #[cfg(feature = "cuda")]
    if super::on_gpu(&qkv) {
        sizes(&qkv, wq.dim(0)?, n_head, n_kv_head)?;
        let _span = kernels::profile::scope(qkv.device(), kernels::profile::Family::Norm);
        let fused = cuda::forward(&qkv, wq, wk, Some(rope), n_head, n_kv_head, eps)?;
        if let Some((x, rstd)) = fused {
            let kept = Kept::Packed { x, rstd };
            let saved = QkNormSaved {
                kept,
                n_head,
                n_kv_head,
            };
            return Ok((qkv, saved));
        }
    }
    let (qkv, saved) = qk_norm_forward(qkv, wq, wk, n_head, n_kv_head, eps)?;
    Ok((super::rope_qk_forward(qkv, rope, n_head, n_kv_head)?, saved))
}

/// Gradients of [`qk_norm_rope_forward`]: [`super::rope_qk_backward`] and then
/// [`qk_norm_backward`], `(dqkv, dwq, dwk)`. On the GPU (when the kernel kept the heads) one
/// pass, in place over dout's q and k columns.
pub fn qk_norm_rope_backward(
    dout: Tensor,
    saved: &QkNormSaved,
    wq: &Tensor,
    wk: &Tensor,
    rope: &RopeTables,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (nh, kv) = (saved.n_head, saved.n_kv_head);
    #[cfg(feature = "cuda")]
    if let (true, Kept::Packed { x, rstd }) = (super::on_gpu(&dout), &saved.kept) {
        sizes(&dout, wq.dim(0)?, nh, kv)?;
        let _span = kernels::profile::scope(dout.device(), kernels::profile::Family::Norm);
        if let Some((dwq, dwk)) = cuda::backward(&dout, x, rstd, wq, wk, Some(rope), nh, kv)? {
            return Ok((dout, dwq, dwk));
        }
    }
    let dout = super::rope_qk_backward(dout, rope, nh, kv)?;
    qk_norm_backward(dout, saved, wq, wk)
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Launchers of `kernels/cuda/qk_norm.cu`: a head row a group of lanes, in place on the
    //! packed buffer. They take bf16 `qkv` (or its gradient) and weights, contiguous and
    //! 16-byte aligned, with `hs % 8 == 0` and `hs <= 256`; anything else returns `None` (the
    //! reference runs).
    use super::{RopeTables, QK_NORM_MAX_HEAD_SIZE};
    use crate::error::{ModelError, Result};
    use crate::gpu;
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    use candle_core::cuda_backend::cudarc::driver::{DriverError, LaunchConfig};
    use candle_core::{DType, Tensor};
    use kernels::Precision;

    /// Threads a CTA (qk_norm.cu's THREADS).
    const THREADS: usize = 256;
    /// At most this many CTAs an SM in the backward's persistent grid.
    const BWD_CTAS_PER_SM: u32 = 8;

    fn driver(e: DriverError) -> ModelError {
        ModelError::Candle(candle_core::Error::wrap(e))
    }

    /// Head rows a CTA holds at once (qk_norm.cu's GROUPS): a head is `hs / 8` lanes rounded
    /// up to a power of two.
    fn groups(hs: usize) -> usize {
        THREADS / (hs / 8).next_power_of_two()
    }

    /// `(N, hs, W)` of a packed `(B, T, W)` buffer and weights the kernels take, with their
    /// addresses `[qkv, wq, wk]`; `None` otherwise.
    fn takes(
        qkv: &Tensor,
        wq: &Tensor,
        wk: &Tensor,
        heads: usize,
    ) -> Result<Option<((usize, usize, usize), [u64; 3])>> {
        let (b, t, w) = qkv.dims3()?;
        let hs = wq.dim(0)?;
        let n = b * t;
        let fits = hs > 0
            && hs % 8 == 0
            && hs <= QK_NORM_MAX_HEAD_SIZE
            && wk.dims() == [hs]
            && n > 0
            // Head rows and the grid's stride over them stay under 2^31 (int in the kernels).
            && n * heads <= (i32::MAX / 2) as usize
            && w <= i32::MAX as usize;
        if !fits {
            return Ok(None);
        }
        let mut ptrs = [0u64; 3];
        for (p, t) in ptrs.iter_mut().zip([qkv, wq, wk]) {
            if t.dtype() != DType::BF16 || !t.is_contiguous() {
                return Ok(None);
            }
            *p = gpu::ptr(t)?;
            if *p % 16 != 0 {
                return Ok(None);
            }
        }
        Ok(Some(((n, hs, w), ptrs)))
    }

    /// The rotary tables as the fused rotation reads them: `(cos, sin, T)` addresses and the
    /// positions a sequence, for `qkv (B, T, W)` of heads `hs` wide; `Ok(None)` where the kernel
    /// cannot fuse them (`hs % 16 != 0`, tables not bf16 `(>= T, hs)` contiguous and aligned),
    /// and `(0, 0, 1)` (no rotation) without tables.
    fn rope_args(
        rope: Option<&RopeTables>,
        qkv: &Tensor,
        hs: usize,
    ) -> Result<Option<(u64, u64, i32)>> {
        let Some(tables) = rope else {
            return Ok(Some((0, 0, 1)));
        };
        let t = qkv.dim(1)?;
        let mut ptrs = [0u64; 2];
        for (p, table) in ptrs.iter_mut().zip([&tables.cos, &tables.sin]) {
            let fits = hs.is_multiple_of(16)
                && table.dtype() == DType::BF16
                && table.is_contiguous()
                && table
                    .dims2()
                    .is_ok_and(|(rows, cols)| rows >= t && cols == hs)
                && gpu::ptr(table)? % 16 == 0;
            if !fits {
                return Ok(None);
            }
            *p = gpu::ptr(table)?;
        }
        Ok(Some((ptrs[0], ptrs[1], t as i32)))
    }

    /// Normalises the first `NH + KV` heads of every row of `qkv` in place, and with `rope`
    /// turns them by their positions' angles in the same pass; returns what the backward
    /// reads, `(x (N, (NH + KV) hs) bf16, rstd (N, NH + KV) f32)`, or `None` (nothing queued)
    /// where the kernel does not take the inputs.
    pub(super) fn forward(
        qkv: &Tensor,
        wq: &Tensor,
        wk: &Tensor,
        rope: Option<&RopeTables>,
        nh: usize,
        kv: usize,
        eps: f64,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let heads = nh + kv;
        let Some(((n, hs, w), [p, pq, pk])) = takes(qkv, wq, wk, heads)? else {
            return Ok(None);
        };
        let Some((pc, psn, t)) = rope_args(rope, qkv, hs)? else {
            return Ok(None);
        };
        let dev = gpu::device(qkv)?;
        let x = gpu::uninit((n, heads * hs), DType::BF16, &dev)?;
        let rstd = gpu::uninit((n, heads), DType::F32, &dev)?;
        let defines = [("HS", hs as i64)];
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::QK_NORM,
            &defines,
            "qk_norm_forward",
        )?;
        let cfg = LaunchConfig {
            grid_dim: ((n * heads).div_ceil(groups(hs)) as u32, 1, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (px, pr) = (gpu::ptr(&x)?, gpu::ptr(&rstd)?);
        // SAFETY: qkv (N, W) bf16 contiguous and 16-byte aligned, its first NH + KV heads
        // normalised in place; x (N, (NH + KV) hs) bf16 and rstd (N, NH + KV) f32 fresh; wq, wk
        // (hs) bf16 aligned; arguments in kernel order.
        unsafe {
            func.launch(
                cfg,
                &[
                    &p,
                    &px,
                    &pr,
                    &pq,
                    &pk,
                    &pc,
                    &psn,
                    &t,
                    &(n as i32),
                    &(w as i32),
                    &(nh as i32),
                    &(heads as i32),
                    &(eps as f32),
                ],
            )?;
        }
        Ok(Some((x, rstd)))
    }

    /// Writes dq and dk over dout's q and k heads in place from the forward's `x` and `rstd`
    /// (with `rope`, dout turned back by its positions' angles first, in the same pass);
    /// returns `(dwq, dwk)`, or `None` (nothing queued) where the kernels do not take the
    /// inputs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn backward(
        dout: &Tensor,
        x: &Tensor,
        rstd: &Tensor,
        wq: &Tensor,
        wk: &Tensor,
        rope: Option<&RopeTables>,
        nh: usize,
        kv: usize,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let heads = nh + kv;
        let Some(((n, hs, w), [p, pq, pk])) = takes(dout, wq, wk, heads)? else {
            return Ok(None);
        };
        let Some((pc, psn, t)) = rope_args(rope, dout, hs)? else {
            return Ok(None);
        };
        let saved_fits = x.dims() == [n, heads * hs]
            && x.dtype() == DType::BF16
            && x.is_contiguous()
            && rstd.dims() == [n, heads]
            && rstd.dtype() == DType::F32
            && rstd.is_contiguous();
        if !saved_fits {
            return Ok(None);
        }
        let (px, pr) = (gpu::ptr(x)?, gpu::ptr(rstd)?);
        if px % 16 != 0 {
            return Ok(None);
        }
        let dev = gpu::device(dout)?;
        let defines = [("HS", hs as i64)];
        let func = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::QK_NORM,
            &defines,
            "qk_norm_backward",
        )?;
        let ctx = dev.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(driver)?;
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(THREADS as u32, 0, None)
            .map_err(driver)?
            .clamp(1, BWD_CTAS_PER_SM) as usize;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver)?
            .max(1) as usize;
        let grid = (sms * per_sm).min((n * heads).div_ceil(groups(hs)));
        let partials = gpu::uninit((grid, 2 * hs), DType::F32, &dev)?;
        let dwq = gpu::uninit(hs, DType::BF16, &dev)?;
        let dwk = gpu::uninit(hs, DType::BF16, &dev)?;
        let ppart = gpu::ptr(&partials)?;
        // SAFETY: dout (N, W) bf16 contiguous and aligned, its first NH + KV heads rewritten
        // in place; partials (grid, 2 hs) f32 fresh; x (N, (NH + KV) hs) bf16 aligned, rstd
        // (N, NH + KV) f32, wq, wk (hs) bf16 aligned; arguments in kernel order.
        unsafe {
            func.launch(
                LaunchConfig {
                    grid_dim: (grid as u32, 1, 1),
                    block_dim: (THREADS as u32, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[
                    &p,
                    &ppart,
                    &px,
                    &pr,
                    &pq,
                    &pk,
                    &pc,
                    &psn,
                    &t,
                    &(n as i32),
                    &(w as i32),
                    &(nh as i32),
                    &(heads as i32),
                ],
            )?;
        }
        let reduce = gpu::function(
            &dev,
            Precision::Bf16,
            &kernels::QK_NORM,
            &defines,
            "qk_norm_backward_reduce",
        )?;
        let (pdq, pdk) = (gpu::ptr(&dwq)?, gpu::ptr(&dwk)?);
        // SAFETY: dwq, dwk (hs) bf16 fresh; partials written above on this stream; arguments
        // in kernel order.
        unsafe {
            reduce.launch(
                LaunchConfig {
                    grid_dim: ((2 * hs).div_ceil(32) as u32, 1, 1),
                    block_dim: (32, 8, 1),
                    shared_mem_bytes: 0,
                },
                &[&pdq, &pdk, &ppart, &(grid as i32)],
            )?;
        }
        Ok(Some((dwq, dwk)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, D};

    /// Each head's channels come out with unit RMS (times the weight), v as it went in, and
    /// the backward's gradients equal central differences of a weighted sum of the output.
    #[test]
    fn normalises_each_head_and_its_gradients_match_finite_differences() {
        let dev = Device::Cpu;
        let (b, t, nh, kv, hs) = (2, 3, 4, 2, 6);
        let w = (nh + 2 * kv) * hs;
        let qkv = (Tensor::randn(0f64, 1.0, (b, t, w), &dev).unwrap() * 3.0).unwrap();
        let wq = Tensor::randn(1f64, 0.2, hs, &dev).unwrap();
        let wk = Tensor::randn(1f64, 0.2, hs, &dev).unwrap();
        let ones = Tensor::ones(hs, DType::F64, &dev).unwrap();
        let (y, _) = qk_norm_forward(qkv.clone(), &ones, &ones, nh, kv, 1e-6).unwrap();
        let heads = y
            .narrow(2, 0, (nh + kv) * hs)
            .unwrap()
            .reshape((b * t * (nh + kv), hs))
            .unwrap();
        let ms: Vec<f64> = heads
            .sqr()
            .unwrap()
            .mean(D::Minus1)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(ms.iter().all(|m| (m - 1.0).abs() < 1e-4), "{ms:?}");
        let v_in = qkv.narrow(2, (nh + kv) * hs, kv * hs).unwrap();
        let v_out = y.narrow(2, (nh + kv) * hs, kv * hs).unwrap();
        let diff: f64 = (v_in - v_out)
            .unwrap()
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(diff, 0.0);

        let probe = Tensor::randn(0f64, 1.0, (b, t, w), &dev).unwrap();
        let f = |qkv: &Tensor, wq: &Tensor, wk: &Tensor| -> f64 {
            let (y, _) = qk_norm_forward(qkv.clone(), wq, wk, nh, kv, 1e-6).unwrap();
            (y * &probe)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar()
                .unwrap()
        };
        let (_, saved) = qk_norm_forward(qkv.clone(), &wq, &wk, nh, kv, 1e-6).unwrap();
        let (dqkv, dwq, dwk) = qk_norm_backward(probe.clone(), &saved, &wq, &wk).unwrap();
        let h = 1e-6;
        let bump = |t: &Tensor, i: usize, by: f64| -> Tensor {
            let mut v: Vec<f64> = t.flatten_all().unwrap().to_vec1().unwrap();
            v[i] += by;
            Tensor::from_vec(v, t.shape(), &dev).unwrap()
        };
        let dqkv: Vec<f64> = dqkv.flatten_all().unwrap().to_vec1().unwrap();
        for i in [0, 7, hs * nh + 3, hs * (nh + kv) + 1, w + 5, b * t * w - 1] {
            let num =
                (f(&bump(&qkv, i, h), &wq, &wk) - f(&bump(&qkv, i, -h), &wq, &wk)) / (2.0 * h);
            assert!(
                (num - dqkv[i]).abs() < 1e-6,
                "dqkv[{i}]: {num} vs {}",
                dqkv[i]
            );
        }
        let (dwq, dwk): (Vec<f64>, Vec<f64>) = (dwq.to_vec1().unwrap(), dwk.to_vec1().unwrap());
        for i in 0..hs {
            let num =
                (f(&qkv, &bump(&wq, i, h), &wk) - f(&qkv, &bump(&wq, i, -h), &wk)) / (2.0 * h);
            assert!((num - dwq[i]).abs() < 1e-6, "dwq[{i}]: {num} vs {}", dwq[i]);
            let num =
                (f(&qkv, &wq, &bump(&wk, i, h)) - f(&qkv, &wq, &bump(&wk, i, -h))) / (2.0 * h);
            assert!((num - dwk[i]).abs() < 1e-6, "dwk[{i}]: {num} vs {}", dwk[i]);
        }
        // A packed width that is not (NH + 2 KV) hs is named.
        let e = qk_norm_forward(qkv, &wq, &wk, nh, kv + 1, 1e-6).unwrap_err();
        assert!(e.to_string().contains("q/k norm input"), "{e}");
    }

    /// The reference backward reads the GPU kernel's packed copy (`Kept::Packed`) as it reads
    /// its own rows: the same gradients, bit for bit, from the same values kept either way.
    /// That is the path a GPU backward takes when its kernel declines after the forward's ran.
    #[test]
    fn the_packed_copy_gives_the_reference_the_same_gradients() {
        let dev = Device::Cpu;
        let (b, t, nh, kv, hs) = (2, 5, 4, 2, 8);
        let (n, w) = (b * t, (nh + 2 * kv) * hs);
        let qkv = Tensor::randn(0f32, 2.0, (b, t, w), &dev).unwrap();
        let wq = Tensor::randn(1f32, 0.2, hs, &dev).unwrap();
        let wk = Tensor::randn(1f32, 0.2, hs, &dev).unwrap();
        let (_, saved) = qk_norm_forward(qkv.clone(), &wq, &wk, nh, kv, 1e-6).unwrap();
        let Kept::Rows { q_rms, k_rms, .. } = &saved.kept else {
            panic!("the CPU keeps rows");
        };
        let x = qkv
            .narrow(2, 0, (nh + kv) * hs)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((n, (nh + kv) * hs))
            .unwrap();
        let rstd = Tensor::cat(
            &[
                q_rms.rstd.reshape((n, nh)).unwrap(),
                k_rms.rstd.reshape((n, kv)).unwrap(),
            ],
            1,
        )
        .unwrap();
        let packed = QkNormSaved {
            kept: Kept::Packed { x, rstd },
            n_head: nh,
            n_kv_head: kv,
        };
        let dout = Tensor::randn(0f32, 1.0, (b, t, w), &dev).unwrap();
        let (d1, q1, k1) = qk_norm_backward(dout.clone(), &saved, &wq, &wk).unwrap();
        let (d2, q2, k2) = qk_norm_backward(dout, &packed, &wq, &wk).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&d1), bits(&d2), "dqkv");
        assert_eq!(bits(&q1), bits(&q2), "dwq");
        assert_eq!(bits(&k1), bits(&k2), "dwk");
    }
}
