//! The Llama layers and units, checked in f64: every backward against central finite
//! differences of `sum(out * dout)` (or the loss), the forwards against direct formulas
//! written with plain loops here, RoPE's backward as the transpose of its forward.
//!
//! Sizes don't coincide: B=2, T=5, seq_len=7, C=16, NH=4 (hs=4), KV=2, F=12, V=11, L=2.

use candle_core::{DType, Device, Tensor};
use model::layers::{
    attention_forward, gqa_attention_backward, gqa_attention_forward, rmsnorm_backward,
    rmsnorm_forward, rope_backward, rope_forward, rope_tables, swiglu_backward, swiglu_forward,
};
use model::{llama, ModelConfig, ModelError, ModelLayout};

mod common;
use common::*;

const B: usize = 2;
const T: usize = 5;

fn cfg(kv: usize, tied: bool) -> ModelConfig {
    let mut c = ModelConfig::llama(2, 16, 4, kv, 12, 7, 11, tied);
    // A small base, so that the angles of 5 positions cover every pair visibly.
    c.rope_theta = 100.0;
    c
}

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
    let tab = rope_tables(3, hs, theta, DType::F64, &Device::Cpu).unwrap();
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
    let tab32 = rope_tables(7, 8, 500_000.0, DType::F32, &Device::Cpu).unwrap();
    let tab64 = rope_tables(7, 8, 500_000.0, DType::F64, &Device::Cpu).unwrap();
    assert_eq!(tab32.cos.dtype(), DType::F32);
    let v = |x: &Tensor| vec1(&x.to_dtype(DType::F64).unwrap());
    assert_close("cos f32", &v(&tab32.cos), &v(&tab64.cos), 1e-6, 1e-6);
    assert_close("sin f32", &v(&tab32.sin), &v(&tab64.sin), 1e-6, 1e-6);
}

#[test]
fn rope_backward_is_the_transpose_and_rotation_keeps_norms() {
    let (h, hs) = (3, 8);
    let tab = rope_tables(T + 2, hs, 10.0, DType::F64, &Device::Cpu).unwrap();
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

// ------------------------------------------------------------------------------------------
// Units

#[test]
fn block_backward_matches_fd_and_recompute_is_bitwise() {
    for kv in [2, 1] {
        let cfg = cfg(kv, true);
        let layout = ModelLayout::new(&cfg);
        let unit = layout.block(1);
        let c = cfg.n_embd;
        let mut rng = Rng(20 + kv as u64);
        let p = rand_params(unit, &mut rng);
        let x = rng.vec(B * T * c, 1.0);
        let dout = t(&rng.vec(B * T * c, 1.0), &[B, T, c]);
        let xt = |x: &[f64]| t(x, &[B, T, c]);

        let mut results = Vec::new();
        for recompute in [false, true] {
            let (out, saved) = llama::block_forward(&cfg, &t1(&p), &xt(&x), recompute).unwrap();
            assert_eq!(saved.is_recompute(), recompute);
            assert_eq!(out.dims(), [B, T, c]);
            let (dx, dp) = llama::block_backward(&cfg, &t1(&p), &saved, &dout).unwrap();
            results.push((vec1(&out), vec1(&dx), vec1(&dp)));
        }
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for i in 0..3 {
            let (a, b) = match i {
                0 => (&results[0].0, &results[1].0),
                1 => (&results[0].1, &results[1].1),
                _ => (&results[0].2, &results[1].2),
            };
            assert_eq!(bits(a), bits(b), "kv={kv}: recompute changed part {i}");
        }
        let (_, dx, dp) = &results[0];
        assert_eq!(dp.len(), unit.numel);
        let f = |p: &[f64], x: &[f64]| {
            dot(
                &llama::block_forward(&cfg, &t1(p), &xt(x), false).unwrap().0,
                &dout,
            )
        };
        let fd_p = finite_diff(&p, |p| f(p, &x));
        let fd_x = finite_diff(&x, |x| f(&p, x));
        for spec in &unit.params {
            let r = spec.offset..spec.offset + spec.numel;
            assert_close(
                &format!("kv={kv} {}", spec.name),
                &dp[r.clone()],
                &fd_p[r],
                FD_RTOL,
                FD_ATOL,
            );
        }
        assert_close(&format!("kv={kv} block dx"), dx, &fd_x, FD_RTOL, FD_ATOL);
    }
}

#[test]
fn final_norm_and_heads_match_fd() {
    for tied in [true, false] {
        let cfg = cfg(2, tied);
        let layout = ModelLayout::new(&cfg);
        let c = cfg.n_embd;
        let mut rng = Rng(30 + tied as u64);
        let unit = layout.final_norm();
        let p = rand_params(unit, &mut rng);
        let x = rng.vec(B * T * c, 2.0);
        let dout = t(&rng.vec(B * T * c, 1.0), &[B, T, c]);
        let xt = |x: &[f64]| t(x, &[B, T, c]);

        let (_, saved) = llama::final_norm_forward(&cfg, &t1(&p), &xt(&x)).unwrap();
        let (dx, dp) = llama::final_norm_backward(&cfg, &t1(&p), &saved, &dout).unwrap();
        let dp = vec1(&dp);
        assert_eq!(dp.len(), unit.numel);
        let f = |p: &[f64], x: &[f64]| {
            dot(
                &llama::final_norm_forward(&cfg, &t1(p), &xt(x)).unwrap().0,
                &dout,
            )
        };
        let fd_p = finite_diff(&p, |p| f(p, &x));
        assert_close("norm dw", &dp[..c], &fd_p[..c], FD_RTOL, FD_ATOL);
        assert!(dp[c..].iter().all(|&g| g == 0.0), "lm_head part is zero");
        assert_close(
            "norm dx",
            &vec1(&dx),
            &finite_diff(&x, |x| f(&p, x)),
            FD_RTOL,
            FD_ATOL,
        );

        // The head reads the embedding when tied, the norm unit otherwise.
        let (head, name) = llama::head_unit(&cfg);
        assert_eq!(
            head.kind,
            if tied {
                layout.units[0].kind
            } else {
                unit.kind
            }
        );
        let hp = rand_params(&head, &mut rng);
        let targets = rng.tokens((B, T), cfg.vocab_size);
        let (loss, grads) = llama::head_loss(&cfg, &t1(&hp), &xt(&x), &targets, true).unwrap();
        let (loss_only, none) = llama::head_loss(&cfg, &t1(&hp), &xt(&x), &targets, false).unwrap();
        assert!(none.is_none());
        assert_eq!(loss.value().unwrap(), loss_only.value().unwrap());
        let (dx, dhp) = grads.unwrap();
        let dhp = vec1(&dhp);
        assert_eq!(dhp.len(), head.numel);
        let w = head.param(name);
        let f = |hp: &[f64], x: &[f64]| {
            llama::head_loss(&cfg, &t1(hp), &xt(x), &targets, false)
                .unwrap()
                .0
                .value()
                .unwrap()
        };
        let fd = finite_diff(&hp, |hp| f(hp, &x));
        for spec in &head.params {
            let r = spec.offset..spec.offset + spec.numel;
            if spec.name == w.name {
                assert_close("head dW", &dhp[r.clone()], &fd[r], FD_RTOL, FD_ATOL);
            } else {
                assert!(dhp[r].iter().all(|&g| g == 0.0), "{} is zero", spec.name);
            }
        }
        assert_close(
            "head dx",
            &vec1(&dx),
            &finite_diff(&x, |x| f(&hp, x)),
            FD_RTOL,
            FD_ATOL,
        );
    }
}

#[test]
fn embedding_backward_matches_fd() {
    let cfg = cfg(2, true);
    let layout = ModelLayout::new(&cfg);
    let unit = layout.embedding();
    let mut rng = Rng(40);
    let p = rand_params(unit, &mut rng);
    let tokens = rng.tokens((B, T), cfg.vocab_size);
    let dout = t(&rng.vec(B * T * cfg.n_embd, 1.0), &[B, T, cfg.n_embd]);
    let out = llama::embedding_forward(&cfg, &t1(&p), &tokens).unwrap();
    assert_eq!(out.dims(), [B, T, cfg.n_embd]);
    let g = vec1(&llama::embedding_backward(&cfg, &index(&cfg, &tokens), &dout).unwrap());
    let fd = finite_diff(&p, |p| {
        dot(
            &llama::embedding_forward(&cfg, &t1(p), &tokens).unwrap(),
            &dout,
        )
    });
    assert_close("embedding", &g, &fd[..unit.numel], FD_RTOL, FD_ATOL);
}

/// The whole model, chained by hand: loss, and every unit's flat gradient.
fn model_loss_and_grads(
    cfg: &ModelConfig,
    ps: &[Tensor],
    tokens: &Tensor,
    targets: &Tensor,
    grad: bool,
) -> (f64, Vec<Tensor>) {
    let l = cfg.n_layer;
    let mut x = llama::embedding_forward(cfg, &ps[0], tokens).unwrap();
    let mut saved = Vec::new();
    for i in 0..l {
        let (out, s) = llama::block_forward(cfg, &ps[1 + i], &x, i % 2 == 1).unwrap();
        saved.push(s);
        x = out;
    }
    let (xn, ns) = llama::final_norm_forward(cfg, &ps[l + 1], &x).unwrap();
    let head = if cfg.tie_embeddings { 0 } else { l + 1 };
    let (loss, g) = llama::head_loss(cfg, &ps[head], &xn, targets, grad).unwrap();
    let loss = loss.value().unwrap();
    let Some((dxn, dhead)) = g else {
        return (loss, vec![]);
    };
    let mut grads = vec![None; l + 2];
    let (mut dx, gn) = llama::final_norm_backward(cfg, &ps[l + 1], &ns, &dxn).unwrap();
    grads[l + 1] = Some(gn);
    for i in (0..l).rev() {
        let (d, g) = llama::block_backward(cfg, &ps[1 + i], &saved[i], &dx).unwrap();
        grads[1 + i] = Some(g);
        dx = d;
    }
    grads[0] = Some(llama::embedding_backward(cfg, &index(cfg, tokens), &dx).unwrap());
    let h = grads[head].take().unwrap();
    grads[head] = Some((h + dhead).unwrap());
    (loss, grads.into_iter().map(Option::unwrap).collect())
}

#[test]
fn whole_model_gradients_match_fd_tied_and_untied() {
    for tied in [true, false] {
        let cfg = cfg(2, tied);
        let layout = ModelLayout::new(&cfg);
        let mut rng = Rng(50 + tied as u64);
        let ps: Vec<Vec<f64>> = layout
            .units
            .iter()
            .map(|u| rand_params(u, &mut rng))
            .collect();
        let tokens = rng.tokens((B, T), cfg.vocab_size);
        let targets = rng.tokens((B, T), cfg.vocab_size);
        let tensors: Vec<Tensor> = ps.iter().map(|p| t1(p)).collect();
        let (loss, grads) = model_loss_and_grads(&cfg, &tensors, &tokens, &targets, true);
        assert!(loss.is_finite());
        for (u, unit) in layout.units.iter().enumerate() {
            let g = vec1(&grads[u]);
            assert_eq!(g.len(), unit.numel);
            // A sample of every unit's coordinates, at least one in each parameter.
            let mut idx: Vec<usize> = (0..unit.numel).step_by(13).collect();
            idx.extend(unit.params.iter().map(|p| p.offset + p.numel / 2));
            let mut p = ps.clone();
            let fd: Vec<f64> = idx
                .iter()
                .map(|&i| {
                    let h = 1e-5;
                    let x0 = p[u][i];
                    let mut eval = |x: f64| {
                        p[u][i] = x;
                        let ts: Vec<Tensor> = p.iter().map(|q| t1(q)).collect();
                        model_loss_and_grads(&cfg, &ts, &tokens, &targets, false).0
                    };
                    let d = (eval(x0 + h) - eval(x0 - h)) / (2.0 * h);
                    p[u][i] = x0;
                    d
                })
                .collect();
            let got: Vec<f64> = idx.iter().map(|&i| g[i]).collect();
            assert_close(
                &format!("model tied={tied} {}", unit.name),
                &got,
                &fd,
                FD_RTOL,
                FD_ATOL,
            );
        }
    }
}

#[test]
fn loss_at_init_is_near_ln_vocab_on_llama_tiny_shape() {
    // llama-tiny's shape with a small vocabulary, f32, initialised as training does.
    let mut cfg = model::preset("llama-tiny").unwrap();
    cfg.vocab_size = 97;
    let layout = ModelLayout::new(&cfg);
    let ps: Vec<Tensor> = layout
        .units
        .iter()
        .map(|u| {
            let mut buf = vec![0f32; u.numel];
            model::init_unit_range(&cfg, u, 7, 0, &mut buf);
            Tensor::from_vec(buf, u.numel, &Device::Cpu).unwrap()
        })
        .collect();
    let mut rng = Rng(60);
    let (tokens, targets) = (
        rng.tokens((B, T), cfg.vocab_size),
        rng.tokens((B, T), cfg.vocab_size),
    );
    let (loss, grads) = model_loss_and_grads(&cfg, &ps, &tokens, &targets, true);
    let ln_v = (cfg.vocab_size as f64).ln();
    assert!((loss - ln_v).abs() < 0.1, "loss {loss} vs ln V {ln_v}");
    for (g, u) in grads.iter().zip(&layout.units) {
        assert_eq!((g.dims1().unwrap(), g.dtype()), (u.numel, DType::F32));
    }
}

#[test]
fn outputs_are_causal() {
    let cfg = cfg(2, false);
    let layout = ModelLayout::new(&cfg);
    let mut rng = Rng(70);
    let ps: Vec<Tensor> = layout
        .units
        .iter()
        .map(|u| t1(&rand_params(u, &mut rng)))
        .collect();
    let tokens = rng.tokens((B, T), cfg.vocab_size);
    let hidden = |tokens: &Tensor| {
        let mut x = llama::embedding_forward(&cfg, &ps[0], tokens).unwrap();
        for l in 0..cfg.n_layer {
            x = llama::block_forward(&cfg, &ps[1 + l], &x, false).unwrap().0;
        }
        llama::final_norm_forward(&cfg, &ps[cfg.n_layer + 1], &x)
            .unwrap()
            .0
    };
    assert_causal(&tokens, cfg.vocab_size, hidden);
}

#[test]
fn block_runs_in_f32_and_bf16_close_to_f64() {
    let cfg = cfg(2, true);
    let layout = ModelLayout::new(&cfg);
    let unit = layout.block(0);
    let c = cfg.n_embd;
    let mut rng = Rng(80);
    let p = t1(&rand_params(unit, &mut rng));
    let x = t(&rng.vec(B * T * c, 1.0), &[B, T, c]);
    let dout = t(&rng.vec(B * T * c, 1.0), &[B, T, c]);
    let run = |dtype: DType| {
        let (p, x, dout) = (
            p.to_dtype(dtype).unwrap(),
            x.to_dtype(dtype).unwrap(),
            dout.to_dtype(dtype).unwrap(),
        );
        let (out, saved) = llama::block_forward(&cfg, &p, &x, true).unwrap();
        let (dx, dp) = llama::block_backward(&cfg, &p, &saved, &dout).unwrap();
        for r in [&out, &dx, &dp] {
            assert_eq!(r.dtype(), dtype);
        }
        let v = |t: &Tensor| vec1(&t.to_dtype(DType::F64).unwrap());
        (v(&out), v(&dx), v(&dp))
    };
    let want = run(DType::F64);
    // bf16 rounds every stored activation to 8 bits: compare by the norm of the difference.
    let rel = |got: &[f64], want: &[f64]| {
        let d: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
        let n: f64 = want.iter().map(|b| b * b).sum();
        (d / n).sqrt()
    };
    for (dtype, tol) in [(DType::F32, 1e-6), (DType::BF16, 2e-2)] {
        let got = run(dtype);
        let errs = [
            rel(&got.0, &want.0),
            rel(&got.1, &want.1),
            rel(&got.2, &want.2),
        ];
        eprintln!("{dtype:?}: relative errors of out, dx, dparams {errs:?}");
        assert!(errs.iter().all(|&e| e < tol), "{dtype:?}: {errs:?}");
    }
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
    let tab = rope_tables(T, hs, 10_000.0, DType::F64, &Device::Cpu).unwrap();
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

/// The tokens as the embedding's backward takes them.
fn index(cfg: &ModelConfig, tokens: &Tensor) -> model::layers::TokenIndex {
    model::layers::TokenIndex::new(tokens, cfg.vocab_size).unwrap()
}
