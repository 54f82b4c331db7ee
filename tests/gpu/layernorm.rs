//! The LayerNorm kernels (bf16 on the GPU) against the CPU reference in f32 on the same
//! bf16-rounded values: forward out, mean, rstd; backward dx (with and without dresidual), dw,
//! db. Sizes: a C below one warp's vector width (64), a row count no tile divides (77, 300), and
//! gpt350m's C = 1024 at N = B*T = 16384.

use crate::common::{gpu, rel_err, uniform};
use candle_core::{DType, Device, Tensor};
use model::layers::{layernorm_backward, layernorm_forward, LnSaved};

/// Deterministic values `offset + scale * u`, u uniform in [-1, 1), rounded to bf16 (on the CPU).
fn values(n: usize, seed: u64, offset: f32, scale: f32) -> Tensor {
    let v: Vec<f32> = uniform(n, seed, scale)
        .into_iter()
        .map(|u| offset + u)
        .collect();
    Tensor::from_vec(v, n, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap()
}

/// The bf16 CPU tensor `t` reshaped to `dims`: (f32 on the CPU, bf16 on the GPU).
fn pair(t: Tensor, dims: &[usize]) -> (Tensor, Tensor) {
    let t = t.reshape(dims).unwrap();
    (
        t.to_dtype(DType::F32).unwrap(),
        t.to_device(&gpu()).unwrap(),
    )
}

fn check(n: usize, c: usize, seed: u64) {
    let (x_c, x_g) = pair(values(n * c, seed, 0.3, 2.0), &[n, c]);
    let (w_c, w_g) = pair(values(c, seed + 1, 1.0, 0.3), &[c]);
    let (b_c, b_g) = pair(values(c, seed + 2, 0.0, 0.2), &[c]);
    let (dout_c, dout_g) = pair(values(n * c, seed + 3, 0.0, 1.0), &[n, c]);
    let (dres_c, dres_g) = pair(values(n * c, seed + 4, 0.0, 0.5), &[n, c]);

    // Forward. bf16 outputs: one rounding (2^-9 relative) of values of about max size: 1e-2.
    // mean, rstd are f32 on both sides, only the summation order differs: 1e-4.
    let (out_c, saved_c) = layernorm_forward(&x_c, &w_c, &b_c).unwrap();
    let (out_g, saved_g) = layernorm_forward(&x_g, &w_g, &b_g).unwrap();
    assert_eq!(
        saved_g.mean.dtype(),
        DType::F32,
        "({n}, {c}): the GPU forward took the reference (mean not f32)"
    );
    assert_eq!(saved_g.mean.dims(), &[n, 1]);
    assert_eq!(saved_g.rstd.dims(), &[n, 1]);
    let e = rel_err(&out_g, &out_c);
    assert!(e < 1e-2, "forward out ({n}, {c}): max rel err {e:e}");
    let e = rel_err(&saved_g.mean, &saved_c.mean);
    assert!(e < 1e-4, "forward mean ({n}, {c}): max rel err {e:e}");
    let e = rel_err(&saved_g.rstd, &saved_c.rstd);
    assert!(e < 1e-4, "forward rstd ({n}, {c}): max rel err {e:e}");

    // Backward, on the GPU's own saved statistics. dx: bf16 output of f32 math: 1e-2. dw, db:
    // f32 sums over N rows (order differs), rounded to bf16 once: 1e-2.
    for with_res in [false, true] {
        let (dres_c, dres_g) = if with_res {
            (Some(&dres_c), Some(&dres_g))
        } else {
            (None, None)
        };
        let (dx_c, dw_c, db_c) = layernorm_backward(&dout_c, &saved_c, &x_c, &w_c, dres_c).unwrap();
        let (dx_g, dw_g, db_g) = layernorm_backward(&dout_g, &saved_g, &x_g, &w_g, dres_g).unwrap();
        assert_eq!(dx_g.dtype(), DType::BF16);
        assert_eq!(dw_g.dims(), &[c]);
        assert_eq!(db_g.dims(), &[c]);
        let e = rel_err(&dx_g, &dx_c);
        assert!(
            e < 1e-2,
            "backward dx ({n}, {c}), dresidual {with_res}: max rel err {e:e}"
        );
        let e = rel_err(&dw_g, &dw_c);
        assert!(
            e < 1e-2,
            "backward dw ({n}, {c}), dresidual {with_res}: max rel err {e:e}"
        );
        let e = rel_err(&db_g, &db_c);
        assert!(
            e < 1e-2,
            "backward db ({n}, {c}), dresidual {with_res}: max rel err {e:e}"
        );
    }
}

#[test]
fn layernorm_small_rows_and_narrow_c() {
    // C = 64: 8 vectors a row, most lanes idle (the guarded register path).
    check(77, 64, 1);
}

#[test]
fn layernorm_odd_row_count() {
    check(300, 1024, 2);
}

#[test]
fn layernorm_gpt350m_shape() {
    check(16384, 1024, 3);
}

#[test]
fn layernorm_wide_rows_take_the_loop_paths() {
    // C = 8192: rows re-read from memory in both kernels; one warp a backward CTA.
    check(37, 8192, 4);
}

#[test]
fn layernorm_backward_is_deterministic() {
    let (n, c) = (5000, 1024);
    let (_, x) = pair(values(n * c, 11, 0.1, 1.5), &[n, c]);
    let (_, w) = pair(values(c, 12, 1.0, 0.3), &[c]);
    let (_, b) = pair(values(c, 13, 0.0, 0.2), &[c]);
    let (_, dout) = pair(values(n * c, 14, 0.0, 1.0), &[n, c]);
    let (_, saved): (Tensor, LnSaved) = layernorm_forward(&x, &w, &b).unwrap();
    let bits = |t: &Tensor| -> Vec<u16> {
        t.to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|f| (f.to_bits() >> 16) as u16)
            .collect()
    };
    let (_, dw0, db0) = layernorm_backward(&dout, &saved, &x, &w, None).unwrap();
    for _ in 0..3 {
        let (_, dw, db) = layernorm_backward(&dout, &saved, &x, &w, None).unwrap();
        assert_eq!(bits(&dw), bits(&dw0), "dw differs between runs");
        assert_eq!(bits(&db), bits(&db0), "db differs between runs");
    }
}
