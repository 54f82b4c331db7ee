//! Qwen3's q/k norm: an RMSNorm of each query head and each key head over its `hs` channels,
//! with one `(hs)` weight for all query heads and another for all key heads, applied to the
//! packed q|k|v projection before the rotation (HF `Qwen3Attention`: `q_norm(q_proj(x).view(..,
//! hs))`). v passes unchanged.
//!
//! Shapes: `qkv (B, T, W)`, `W = (NH + 2 KV) hs`, q in columns `0..NH hs`, k in the next
//! `KV hs`; `wq, wk (hs)`. The norm is the RMSNorm of `rmsnorm.rs` on the `(B T NH, hs)` rows
//! of q and the `(B T KV, hs)` rows of k (on the GPU its kernels, on those rows copied out of
//! the packed buffer and back), so it matches that layer's reference and its GPU kernels to
//! the same bounds; the statistics are f32 (f64 for f64).

use candle_core::Tensor;

use super::rmsnorm::{rmsnorm_backward, rmsnorm_forward, RmsSaved};
use crate::error::{ModelError, Result};

/// What [`qk_norm_backward`] reads: q's and k's rows before the norm and their statistics.
#[derive(Clone, Debug)]
pub struct QkNormSaved {
    q: Tensor,
    k: Tensor,
    q_rms: RmsSaved,
    k_rms: RmsSaved,
    n_head: usize,
    n_kv_head: usize,
}

/// `(b, t, hs)` of a packed `qkv` of `n_head` query and `n_kv_head` key/value heads of width
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
/// reads (q's and k's rows before the norm, `2 (NH + KV) hs` elements a position).
pub fn qk_norm_forward(
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
        q,
        k,
        q_rms,
        k_rms,
        n_head,
        n_kv_head,
    };
    Ok((out, saved))
}

/// Gradients of [`qk_norm_forward`]: `dout (B, T, W)` -> `(dqkv (B, T, W), dwq (hs), dwk
/// (hs))`; dv passes unchanged.
pub fn qk_norm_backward(
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
    let (dq, dwq) = rmsnorm_backward(&rows(0, nh)?, &saved.q_rms, &saved.q, wq, None)?;
    let (dk, dwk) = rmsnorm_backward(&rows(nh, kv)?, &saved.k_rms, &saved.k, wk, None)?;
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
        let (y, _) = qk_norm_forward(&qkv, &ones, &ones, nh, kv, 1e-6).unwrap();
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
            let (y, _) = qk_norm_forward(qkv, wq, wk, nh, kv, 1e-6).unwrap();
            (y * &probe)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar()
                .unwrap()
        };
        let (_, saved) = qk_norm_forward(&qkv, &wq, &wk, nh, kv, 1e-6).unwrap();
        let (dqkv, dwq, dwk) = qk_norm_backward(&probe, &saved, &wq, &wk).unwrap();
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
        let e = qk_norm_forward(&qkv, &wq, &wk, nh, kv + 1, 1e-6).unwrap_err();
        assert!(e.to_string().contains("q/k norm input"), "{e}");
    }
}
