//! The element-wise kernels (bf16 on the GPU) against the CPU reference in f32 on the same
//! bf16-rounded values: GELU forward and backward (an element count with a scalar tail, an
//! unaligned view, gpt350m's MLP activation (16384, 4096)), GELU backward fused with its bias
//! gradient (the same dh as the plain kernel, bit for bit, and its column sums), and the bias
//! gradient of
//! `matmul_backward` (column sums, deterministic) against `dout.to_dtype(F32).sum(0)`.

use crate::common::{f32_bits, gpu, rel_err, uniform};
use candle_core::{DType, Device, Tensor};
use model::layers::{gelu_backward, gelu_backward_bias_grad, gelu_forward, matmul_backward};

/// Deterministic values `scale * u`, u uniform in [-1, 1), every 1000th times 8 (the tails of
/// GELU), rounded to bf16 (on the CPU).
fn values(n: usize, seed: u64, scale: f32) -> Tensor {
    let v: Vec<f32> = uniform(n, seed, scale)
        .into_iter()
        .enumerate()
        .map(|(i, u)| if i % 1000 == 7 { 8.0 * u } else { u })
        .collect();
    Tensor::from_vec(v, n, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap()
}

/// GELU forward and backward of `h`, `dout` (bf16 on the CPU, shape `dims`), GPU vs CPU f32.
/// `skip` elements are dropped from the front on the GPU side (an unaligned view when not a
/// multiple of 8: the element-by-element path).
fn check_gelu(dims: &[usize], seed: u64, skip: usize) {
    let n: usize = dims.iter().product();
    let h = values(n + skip, seed, 4.0);
    let dout = values(n + skip, seed + 1, 1.0);
    let cpu_of = |t: &Tensor| {
        t.narrow(0, skip, n)
            .unwrap()
            .reshape(dims)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let gpu_of = |t: &Tensor| {
        t.to_device(&gpu())
            .unwrap()
            .narrow(0, skip, n)
            .unwrap()
            .reshape(dims)
            .unwrap()
    };
    let (h_c, h_g) = (cpu_of(&h), gpu_of(&h));
    let (d_c, d_g) = (cpu_of(&dout), gpu_of(&dout));
    // bf16 outputs of f32 math (ex2/rcp approximations ~1e-6 relative): one rounding, 1e-2.
    let out_g = gelu_forward(&h_g).unwrap();
    assert_eq!(out_g.dtype(), DType::BF16);
    let e = rel_err(&out_g, &gelu_forward(&h_c).unwrap());
    assert!(
        e < 1e-2,
        "gelu forward {dims:?} skip {skip}: max rel err {e:e}"
    );
    let dh_g = gelu_backward(&d_g, &h_g).unwrap();
    assert_eq!(dh_g.dtype(), DType::BF16);
    let e = rel_err(&dh_g, &gelu_backward(&d_c, &h_c).unwrap());
    assert!(
        e < 1e-2,
        "gelu backward {dims:?} skip {skip}: max rel err {e:e}"
    );
    if dims.len() == 2 {
        // Fused with the bias gradient: the same dh (the kernels share the math), and the
        // column sums of the CPU's dh in f32 (bf16 result of a sum over N rows: 1e-2).
        let (dh_f, db_f) = gelu_backward_bias_grad(&d_g, &h_g).unwrap();
        let (dh_c, db_c) = gelu_backward_bias_grad(&d_c, &h_c).unwrap();
        assert!(
            f32_bits(&dh_f) == f32_bits(&dh_g),
            "fused gelu backward {dims:?} skip {skip}: dh differs from the plain kernel's"
        );
        assert_eq!(db_f.dims(), &[dims[1]]);
        let e = rel_err(&db_f, &db_c);
        assert!(
            e < 1e-2,
            "fused gelu bias grad {dims:?} skip {skip}: max rel err {e:e}"
        );
        let e = rel_err(&dh_f, &dh_c);
        assert!(
            e < 1e-2,
            "fused gelu backward {dims:?} skip {skip}: max rel err {e:e}"
        );
    }
}

#[test]
fn gelu_odd_count_with_scalar_tail() {
    check_gelu(&[1_000_003], 1, 0);
}

#[test]
fn gelu_unaligned_view_takes_the_scalar_path() {
    check_gelu(&[3001, 7], 2, 3);
}

#[test]
fn gelu_gpt350m_mlp_shape() {
    check_gelu(&[16384, 4096], 3, 0);
}

/// db of `matmul_backward` on the GPU (the bias-gradient kernels) against the CPU column sums
/// in f32. bf16 result of an f32 sum over N rows: one rounding plus summation order, 1e-2.
fn check_bias_grad(n: usize, out: usize, seed: u64) {
    let k = 64;
    let dout = values(n * out, seed, 1.0).reshape((n, out)).unwrap();
    let x = values(n * k, seed + 1, 1.0).reshape((n, k)).unwrap();
    let w = values(k * out, seed + 2, 0.1).reshape((k, out)).unwrap();
    let want = dout.to_dtype(DType::F32).unwrap().sum(0).unwrap();
    let (dout_g, x_g, w_g) = (
        dout.to_device(&gpu()).unwrap(),
        x.to_device(&gpu()).unwrap(),
        w.to_device(&gpu()).unwrap(),
    );
    let (_, _, db) = matmul_backward(&dout_g, &x_g, &w_g).unwrap();
    assert_eq!(db.dims(), &[out]);
    let e = rel_err(&db, &want);
    assert!(e < 1e-2, "bias grad ({n}, {out}): max rel err {e:e}");
    // Deterministic: the same bits again.
    let (_, _, db2) = matmul_backward(&dout_g, &x_g, &w_g).unwrap();
    assert_eq!(
        f32_bits(&db),
        f32_bits(&db2),
        "bias grad ({n}, {out}) differs between runs"
    );
}

#[test]
fn bias_grad_small() {
    check_bias_grad(77, 192, 10);
}

#[test]
fn bias_grad_gpt350m_mlp_shape() {
    check_bias_grad(16384, 3072, 11);
}
