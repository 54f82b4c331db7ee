//! The Llama family's layers, checked in f64: every backward against central finite
//! differences of `sum(out * dout)`, the forwards against direct formulas written with plain
//! loops here, RoPE's backward as the transpose of its forward, and the packed layers the
//! block runs against the separate ones. Its units and the whole model: `llama.rs`.
//!
//! Sizes don't coincide: B=2, T=5, seq_len=7, C=16, NH=4 (hs=4), KV=2, F=12, V=11, L=2.

use candle_core::{DType, Device, Tensor};
use model::layers::{
    attention_forward, gqa_attention_backward, gqa_attention_forward, rmsnorm_backward,
    rmsnorm_forward, rope_backward, rope_forward, rope_tables, swiglu_backward, swiglu_forward,
};
use model::{ModelError, RopeScaling};

mod common;
use common::*;

const B: usize = 2;
const T: usize = 5;

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
}

// ------------------------------------------------------------------------------------------
// Layers

#[test]
fn rmsnorm_matches_the_formula_and_fd() {
    let (n, c, eps) = (7, 6, 1e-5);
    let mut rng = Rng(1);
    let x = rng.vec(n * c, 2.0);
    let w: Vec<f64> = rng.vec(c, 0.5).iter().map(|v| 1.0 + v).collect();
    let dy = t(&rng.vec(n * c, 1.0), &[n, c]);
    let res = t(&rng.vec(n * c, 1.0), &[n, c]);

    let (y, saved) = rmsnorm_forward(&t(&x, &[n, c]), &t1(&w), eps).unwrap();
    assert_eq!(saved.rstd.dims(), [n]);
    let want: Vec<f64> = (0..n * c)
        .map(|ij| {
            let row = &x[ij / c * c..(ij / c + 1) * c];
            let ms = row.iter().map(|v| v * v).sum::<f64>() / c as f64;
            w[ij % c] * x[ij] / (ms + eps).sqrt()
        })
        .collect();
    assert_close("rmsnorm forward", &vec1(&y), &want, 1e-14, 1e-15);

    let (dx, dw) = rmsnorm_backward(&dy, &saved, &t(&x, &[n, c]), &t1(&w), Some(&res)).unwrap();
    let f = |x: &[f64], w: &[f64]| {
        let y = rmsnorm_forward(&t(x, &[n, c]), &t1(w), eps).unwrap().0;
        dot(&y, &dy) + dot(&t(x, &[n, c]), &res)
    };
    let fd_x = finite_diff(&x, |x| f(x, &w));
    let fd_w = finite_diff(&w, |w| f(&x, w));
    assert_close("rmsnorm dx", &vec1(&dx), &fd_x, FD_RTOL, FD_ATOL);
    assert_close("rmsnorm dw", &vec1(&dw), &fd_w, FD_RTOL, FD_ATOL);

    // Half precision: the statistics in f32, the output in the input dtype.
    let xb = t(&x, &[n, c]).to_dtype(DType::BF16).unwrap();
    let (yb, sb) = rmsnorm_forward(&xb, &t1(&w).to_dtype(DType::BF16).unwrap(), eps).unwrap();
    assert_eq!((yb.dtype(), sb.rstd.dtype()), (DType::BF16, DType::F32));
    let yb = vec1(&yb.to_dtype(DType::F64).unwrap());
    assert_close("rmsnorm bf16", &yb, &want, 1e-2, 1e-2);
}

#[test]
fn rope_convention_is_hf_rotate_half() {
    let (hs, theta) = (4, 100.0);
    let tab = rope_tables(
        3,
        hs,
        theta,
        &RopeScaling::Default,
        DType::F64,
        &Device::Cpu,
    )
    .unwrap();
    // angle[t, j] = t / theta^(2 (j mod hs/2) / hs)
    let angle = |t: usize, j: usize| t as f64 / theta.powf((2 * (j % (hs / 2))) as f64 / hs as f64);
    let cos = tab.cos.to_vec2::<f64>().unwrap();
    let sin = tab.sin.to_vec2::<f64>().unwrap();
    for (t, (crow, srow)) in cos.iter().zip(&sin).enumerate() {
        for j in 0..hs {
            assert!((crow[j] - angle(t, j).cos()).abs() < 1e-15);
            assert!((srow[j] - angle(t, j).sin()).abs() < 1e-15);
        }
    }
    // x = e_0 at position 2: out = cos(a) e_0 + sin(a) e_{hs/2} (the pair (0, hs/2) rotates).
    let mut x = vec![0.0; 3 * hs];
    x[2 * hs] = 1.0;
    let out = vec1(&rope_forward(&t(&x, &[1, 3, 1, hs]), &tab).unwrap());
    let a = angle(2, 0);
    assert_close(
        "rope e0",
        &out[2 * hs..],
        &[a.cos(), 0.0, a.sin(), 0.0],
        1e-15,
        1e-15,
    );
    assert!(out[..2 * hs].iter().all(|&v| v == 0.0));
    // Position 0 is the identity.
    let x = Rng(2).vec(3 * hs, 1.0);
    let out = vec1(&rope_forward(&t(&x, &[1, 3, 1, hs]), &tab).unwrap());
    assert_eq!(&out[..hs], &x[..hs]);

    // The f32 tables (as HF computes them) agree with the f64 ones to f32 precision.
    let tab32 = rope_tables(
        7,
        8,
        500_000.0,
        &RopeScaling::Default,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let tab64 = rope_tables(
        7,
        8,
        500_000.0,
        &RopeScaling::Default,
        DType::F64,
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(tab32.cos.dtype(), DType::F32);
    let v = |x: &Tensor| vec1(&x.to_dtype(DType::F64).unwrap());
    assert_close("cos f32", &v(&tab32.cos), &v(&tab64.cos), 1e-6, 1e-6);
    assert_close("sin f32", &v(&tab32.sin), &v(&tab64.sin), 1e-6, 1e-6);
}

#[test]
fn rope_backward_is_the_transpose_and_rotation_keeps_norms() {
    let (h, hs) = (3, 8);
    let tab = rope_tables(
        T + 2,
        hs,
        10.0,
        &RopeScaling::Default,
        DType::F64,
        &Device::Cpu,
    )
    .unwrap();
    let mut rng = Rng(3);
    let shape = [B, T, h, hs];
    let x = t(&rng.vec(B * T * h * hs, 1.0), &shape);
    let dy = t(&rng.vec(B * T * h * hs, 1.0), &shape);
    let y = rope_forward(&x, &tab).unwrap();
    let dx = rope_backward(&dy, &tab).unwrap();
    // <R x, dy> = <x, R^T dy>
    let (a, b) = (dot(&y, &dy), dot(&x, &dx));
    assert!((a - b).abs() < 1e-13 * a.abs().max(1.0), "{a} vs {b}");
    // Every head vector keeps its norm, forward and backward; and backward undoes forward.
    let norms = |x: &Tensor| vec1(&x.sqr().unwrap().sum(3).unwrap());
    assert_close("rope norms", &norms(&y), &norms(&x), 1e-14, 1e-15);
    assert_close("rope^T norms", &norms(&dx), &norms(&dy), 1e-14, 1e-15);
    let back = rope_backward(&y, &tab).unwrap();
    assert_close("rope^T rope", &vec1(&back), &vec1(&x), 1e-14, 1e-15);
    assert!(
        (vec1(&y)
            .iter()
            .zip(vec1(&x))
            .map(|(a, b)| (a - b).abs())
            .sum::<f64>())
            > 1e-2,
        "rope rotates something"
    );
}

#[test]
fn swiglu_backward_matches_fd() {
    let (n, f) = (5, 6);
    let mut rng = Rng(4);
    let g = rng.vec(n * f, 4.0);
    let u = rng.vec(n * f, 1.0);
    let dy = t(&rng.vec(n * f, 1.0), &[n, f]);
    let out = vec1(&swiglu_forward(&t(&g, &[n, f]), &t(&u, &[n, f])).unwrap());
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    assert_close("swiglu forward", &out, &want, 1e-15, 1e-15);
    let (dg, du) = swiglu_backward(&dy, &t(&g, &[n, f]), &t(&u, &[n, f])).unwrap();
    let fwd = |g: &[f64], u: &[f64]| {
        dot(
            &swiglu_forward(&t(g, &[n, f]), &t(u, &[n, f])).unwrap(),
            &dy,
        )
    };
    assert_close(
        "swiglu dgate",
        &vec1(&dg),
        &finite_diff(&g, |g| fwd(g, &u)),
        FD_RTOL,
        FD_ATOL,
    );
    assert_close(
        "swiglu dup",
        &vec1(&du),
        &finite_diff(&u, |u| fwd(&g, u)),
        FD_RTOL,
        FD_ATOL,
    );
    // bf16 in, bf16 out, close to the f64 values.
    let b = |v: &[f64]| t(v, &[n, f]).to_dtype(DType::BF16).unwrap();
    let ob = swiglu_forward(&b(&g), &b(&u)).unwrap();
    assert_eq!(ob.dtype(), DType::BF16);
    assert_close(
        "swiglu bf16",
        &vec1(&ob.to_dtype(DType::F64).unwrap()),
        &want,
        2e-2,
        2e-2,
    );
}

/// Grouped-query attention with plain loops: query head `h` reads kv head `h / (NH / KV)`.
fn naive_gqa(q: &[f64], k: &[f64], v: &[f64], nh: usize, kv: usize, hs: usize) -> Vec<f64> {
    let g = nh / kv;
    let mut y = vec![0.0; B * T * nh * hs];
    for b in 0..B {
        for h in 0..nh {
            let j = h / g;
            for t in 0..T {
                let qi = |d: usize| q[(b * T + t) * nh * hs + h * hs + d];
                let ki = |s: usize, d: usize| k[(b * T + s) * kv * hs + j * hs + d];
                let s: Vec<f64> = (0..=t)
                    .map(|s| (0..hs).map(|d| qi(d) * ki(s, d)).sum::<f64>() / (hs as f64).sqrt())
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hs {
                    y[(b * T + t) * nh * hs + h * hs + d] = (0..=t)
                        .map(|s| e[s] / z * v[(b * T + s) * kv * hs + j * hs + d])
                        .sum();
                }
            }
        }
    }
    y
}

#[test]
fn gqa_matches_loops_and_fd_for_every_grouping() {
    let (nh, hs) = (4, 4);
    for kv in [4, 2, 1] {
        let mut rng = Rng(5 + kv as u64);
        let (cq, ck) = (nh * hs, kv * hs);
        let q = rng.vec(B * T * cq, 1.5);
        let k = rng.vec(B * T * ck, 1.5);
        let v = rng.vec(B * T * ck, 1.0);
        let dy = t(&rng.vec(B * T * cq, 1.0), &[B, T, cq]);
        let (qt, kt, vt) = (t(&q, &[B, T, cq]), t(&k, &[B, T, ck]), t(&v, &[B, T, ck]));

        let (y, saved) = gqa_attention_forward(&qt, &kt, &vt, nh, kv).unwrap();
        assert_eq!(saved.lse.dims(), [B, nh, T]);
        assert_close(
            &format!("gqa kv={kv} forward"),
            &vec1(&y),
            &naive_gqa(&q, &k, &v, nh, kv, hs),
            1e-13,
            1e-14,
        );
        if kv == nh {
            // Plain multi-head attention: GPT-2's layer on [q | k | v] gives the same.
            let qkv = Tensor::cat(&[&qt, &kt, &vt], 2).unwrap();
            let (y2, _) = attention_forward(&qkv, nh).unwrap();
            assert_close("gqa = mha", &vec1(&y), &vec1(&y2), 1e-13, 1e-14);
        }

        let (dq, dk, dv) = gqa_attention_backward(&dy, &saved).unwrap();
        assert_eq!(dk.dims(), [B, T, ck]);
        let f = |q: &[f64], k: &[f64], v: &[f64]| {
            let (y, _) = gqa_attention_forward(
                &t(q, &[B, T, cq]),
                &t(k, &[B, T, ck]),
                &t(v, &[B, T, ck]),
                nh,
                kv,
            )
            .unwrap();
            dot(&y, &dy)
        };
        let what = |x: &str| format!("gqa kv={kv} {x}");
        let fd_q = finite_diff(&q, |q| f(q, &k, &v));
        let fd_k = finite_diff(&k, |k| f(&q, k, &v));
        let fd_v = finite_diff(&v, |v| f(&q, &k, v));
        assert_close(&what("dq"), &vec1(&dq), &fd_q, FD_RTOL, FD_ATOL);
        assert_close(&what("dk"), &vec1(&dk), &fd_k, FD_RTOL, FD_ATOL);
        assert_close(&what("dv"), &vec1(&dv), &fd_v, FD_RTOL, FD_ATOL);
    }
    let z = Tensor::zeros((B, T, 16), DType::F64, &Device::Cpu).unwrap();
    assert!(gqa_attention_forward(&z, &z, &z, 4, 3).is_err());
    let k8 = Tensor::zeros((B, T, 8), DType::F64, &Device::Cpu).unwrap();
    assert!(matches!(
        gqa_attention_forward(&z, &k8, &z, 4, 2),
        Err(ModelError::ShapeMismatch { .. })
    ));
}

/// The packed layers the block runs (q|k|v and gate|up as one buffer each, the residual add
/// inside the norm) compute what the separate layers compute: bit for bit on the reference.
#[test]
fn packed_layers_equal_the_separate_ones() {
    use model::layers::{
        add_rmsnorm_forward, gqa_packed_backward, gqa_packed_forward, matmul_cols_backward,
        matmul_cols_forward, rope_qk_backward, rope_qk_forward, swiglu_packed_backward,
        swiglu_packed_forward,
    };
    let (nh, kv, hs, c, f) = (4, 2, 4, 16, 12);
    let n = B * T;
    let mut rng = Rng(90);
    let x = t(&rng.vec(n * c, 1.0), &[n, c]);
    let ws: Vec<Tensor> = [c, kv * hs, kv * hs]
        .iter()
        .map(|&o| t(&rng.vec(c * o, 0.5), &[c, o]))
        .collect();
    let bits = |t: &Tensor| vec1(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();

    // The projections side by side, and their backward summing dx over the blocks.
    let qkv = matmul_cols_forward(&x, &ws, None).unwrap();
    for (i, w) in ws.iter().enumerate() {
        let from = [0, c, c + kv * hs][i];
        let part = qkv.narrow(1, from, w.dim(1).unwrap()).unwrap();
        assert_eq!(bits(&part), bits(&x.matmul(w).unwrap()), "projection {i}");
    }
    let dqkv = t(&rng.vec(n * (c + 2 * kv * hs), 1.0), &[n, c + 2 * kv * hs]);
    let (dx, dws) = matmul_cols_backward(&dqkv, &x, &ws, &[]).unwrap();
    let mut want_dx: Option<Tensor> = None;
    let mut from = 0;
    for (i, w) in ws.iter().enumerate() {
        let o = w.dim(1).unwrap();
        let d = dqkv.narrow(1, from, o).unwrap().contiguous().unwrap();
        from += o;
        let part = d.matmul(&w.t().unwrap()).unwrap();
        want_dx = Some(match want_dx {
            Some(a) => (a + part).unwrap(),
            None => part,
        });
        let dw = x.t().unwrap().matmul(&d).unwrap();
        assert_eq!(bits(&dws[i]), bits(&dw), "dw {i}");
    }
    assert_eq!(bits(&dx), bits(&want_dx.unwrap()), "dx");

    // The rotation of the packed q and k heads, v passed through.
    let tab = rope_tables(
        T,
        hs,
        10_000.0,
        &RopeScaling::Default,
        DType::F64,
        &Device::Cpu,
    )
    .unwrap();
    let qkv3 = qkv.reshape((B, T, c + 2 * kv * hs)).unwrap();
    let turned = rope_qk_forward(qkv3.clone(), &tab, nh, kv).unwrap();
    let q = qkv3
        .narrow(2, 0, c)
        .unwrap()
        .reshape((B, T, nh, hs))
        .unwrap();
    let k = qkv3
        .narrow(2, c, kv * hs)
        .unwrap()
        .reshape((B, T, kv, hs))
        .unwrap();
    let q_want = rope_forward(&q, &tab).unwrap().reshape((B, T, c)).unwrap();
    let k_want = rope_forward(&k, &tab)
        .unwrap()
        .reshape((B, T, kv * hs))
        .unwrap();
    assert_eq!(bits(&turned.narrow(2, 0, c).unwrap()), bits(&q_want));
    assert_eq!(bits(&turned.narrow(2, c, kv * hs).unwrap()), bits(&k_want));
    assert_eq!(
        bits(&turned.narrow(2, c + kv * hs, kv * hs).unwrap()),
        bits(&qkv3.narrow(2, c + kv * hs, kv * hs).unwrap()),
        "v passes through"
    );
    let back = rope_qk_backward(turned.clone(), &tab, nh, kv).unwrap();
    let q_back = rope_backward(&q_want.reshape((B, T, nh, hs)).unwrap(), &tab).unwrap();
    assert_eq!(
        bits(&back.narrow(2, 0, c).unwrap()),
        bits(&q_back.reshape((B, T, c)).unwrap())
    );

    // Attention on the packed buffer equals it on q, k, v apart.
    let (q, k, v) = (
        turned.narrow(2, 0, c).unwrap().contiguous().unwrap(),
        turned.narrow(2, c, kv * hs).unwrap().contiguous().unwrap(),
        turned
            .narrow(2, c + kv * hs, kv * hs)
            .unwrap()
            .contiguous()
            .unwrap(),
    );
    let (y, saved) = gqa_packed_forward(&turned, nh, kv).unwrap();
    let (y_want, saved_want) = gqa_attention_forward(&q, &k, &v, nh, kv).unwrap();
    assert_eq!(bits(&y), bits(&y_want));
    let dy = t(&rng.vec(B * T * c, 1.0), &[B, T, c]);
    let dpacked = gqa_packed_backward(&dy, &saved).unwrap();
    let (dq, dk, dv) = gqa_attention_backward(&dy, &saved_want).unwrap();
    let want = Tensor::cat(&[dq, dk, dv], 2).unwrap();
    assert_eq!(bits(&dpacked), bits(&want));

    // SwiGLU on [gate | up].
    let gu = t(&rng.vec(n * 2 * f, 2.0), &[n, 2 * f]);
    let (g, u) = (gu.narrow(1, 0, f).unwrap(), gu.narrow(1, f, f).unwrap());
    let act = swiglu_packed_forward(&gu).unwrap();
    assert_eq!(bits(&act), bits(&swiglu_forward(&g, &u).unwrap()));
    let dact = t(&rng.vec(n * f, 1.0), &[n, f]);
    let dgu = swiglu_packed_backward(&dact, &gu).unwrap();
    let (dg, du) = swiglu_backward(&dact, &g, &u).unwrap();
    assert_eq!(bits(&dgu), bits(&Tensor::cat(&[dg, du], 1).unwrap()));

    // The residual add inside the norm: h = x + delta, then the norm of h.
    let delta = t(&rng.vec(n * c, 1.0), &[n, c]);
    let w = t1(&rng.vec(c, 1.0));
    let (h, y2, s2) = add_rmsnorm_forward(&x, &delta, &w, 1e-5).unwrap();
    let h_want = (&x + &delta).unwrap();
    let (y2_want, s2_want) = rmsnorm_forward(&h_want, &w, 1e-5).unwrap();
    assert_eq!(bits(&h), bits(&h_want));
    assert_eq!(bits(&y2), bits(&y2_want));
    assert_eq!(bits(&s2.rstd), bits(&s2_want.rstd));
}
