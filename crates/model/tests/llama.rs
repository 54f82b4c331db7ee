//! The Llama family's units and the whole model, checked in f64: every backward against
//! central finite differences of `sum(out * dout)` (or the loss), recomputation bitwise,
//! causality, and f32 / bf16 close to f64. Its layers: `llama_layers.rs`. The block's
//! additions of the other families of Llama's block (Qwen2's q/k/v biases, Qwen3's q/k norm
//! and head width of its own) are checked the same way ([`block_shapes`]).
//!
//! Sizes don't coincide: B=2, T=5, seq_len=7, C=16, NH=4 (hs=4; Qwen3's 6), KV=2, F=12, V=11,
//! L=2.

use candle_core::{DType, Device, Tensor};
use model::LinearFormat::Dense;
use model::{llama, ModelConfig, ModelLayout, Recompute};

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

/// Llama with grouped (KV=2) and multi-query (KV=1) attention, Qwen2 and Qwen3 (hs 6, wider
/// than C / NH = 4): each family's block additions, at the small rotary base.
fn block_shapes(tied: bool) -> Vec<(String, ModelConfig)> {
    let small_base = |c: ModelConfig| ModelConfig {
        rope_theta: 100.0,
        ..c
    };
    vec![
        ("llama kv=2".into(), cfg(2, tied)),
        ("llama kv=1".into(), cfg(1, tied)),
        (
            "qwen2".into(),
            small_base(model::qwen2::QWEN2.shape(2, 16, 4, 2, 4, 12, 7, 11, tied)),
        ),
        (
            "qwen3 hs=6".into(),
            small_base(model::qwen3::QWEN3.shape(2, 16, 4, 2, 6, 12, 7, 11, tied)),
        ),
    ]
}

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
}

// ------------------------------------------------------------------------------------------
// Units

#[test]
fn block_backward_matches_fd_and_recompute_is_bitwise() {
    for (n, (kv, cfg)) in block_shapes(true).into_iter().enumerate() {
        let layout = ModelLayout::new(&cfg);
        let unit = layout.block(1);
        let c = cfg.n_embd;
        let mut rng = Rng(20 + n as u64);
        let p = rand_params(unit, &mut rng);
        let x = rng.vec(B * T * c, 1.0);
        let dout = t(&rng.vec(B * T * c, 1.0), &[B, T, c]);
        let xt = |x: &[f64]| t(x, &[B, T, c]);

        let mut results = Vec::new();
        for recompute in [Recompute::Off, Recompute::Full, Recompute::Attention] {
            let (out, saved) =
                llama::block_forward(&cfg, Dense, &t1(&p).into(), &xt(&x), recompute).unwrap();
            assert_eq!(saved.recompute(), recompute);
            assert_eq!(out.dims(), [B, T, c]);
            let (dx, dp) =
                llama::block_backward(&cfg, Dense, &t1(&p).into(), &saved, &dout).unwrap();
            results.push((vec1(&out), vec1(&dx), vec1(&dp)));
        }
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (mode, r) in results.iter().enumerate().skip(1) {
            for (i, (a, b)) in [
                (&results[0].0, &r.0),
                (&results[0].1, &r.1),
                (&results[0].2, &r.2),
            ]
            .into_iter()
            .enumerate()
            {
                assert_eq!(
                    bits(a),
                    bits(b),
                    "kv={kv}: recompute mode {mode} changed part {i}"
                );
            }
        }
        let (_, dx, dp) = &results[0];
        assert_eq!(dp.len(), unit.numel);
        let f = |p: &[f64], x: &[f64]| {
            dot(
                &llama::block_forward(&cfg, Dense, &t1(p).into(), &xt(x), Recompute::Off)
                    .unwrap()
                    .0,
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

/// The embedding's gradient added onto a tied head's (`onto`) is the sum of the two, for Llama's
/// table alone and GPT-2's table and positions.
#[test]
fn embedding_backward_onto_a_head_gradient_adds_to_it() {
    for cfg in [cfg(2, true), model::preset("tiny").unwrap()] {
        let unit = ModelLayout::new(&cfg).embedding().clone();
        let mut rng = Rng(41);
        let tokens = rng.tokens((B, T), cfg.vocab_size);
        let dout = t(&rng.vec(B * T * cfg.n_embd, 1.0), &[B, T, cfg.n_embd]);
        let head = t(&rng.vec(unit.numel, 1.0), &[unit.numel]);
        let model = model::Model::new(cfg.clone()).unwrap();
        let index = index(&cfg, &tokens);
        let saved = model::Saved::new(index);
        let (_, alone) = model.backward(0, None, &saved, &dout).unwrap();
        let (_, onto) = model
            .backward_onto(0, None, &saved, &dout, Some(head.clone()))
            .unwrap();
        assert_eq!(
            vec1(&onto),
            vec1(&(head + alone).unwrap()),
            "{:?}",
            cfg.arch
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
    let g = vec1(&llama::embedding_backward(&cfg, &index(&cfg, &tokens), &dout, None).unwrap());
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
        let mode = [Recompute::Off, Recompute::Full, Recompute::Attention][i % 3];
        let (out, s) =
            llama::block_forward(cfg, Dense, &ps[1 + i].clone().into(), &x, mode).unwrap();
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
        let (d, g) =
            llama::block_backward(cfg, Dense, &ps[1 + i].clone().into(), &saved[i], &dx).unwrap();
        grads[1 + i] = Some(g);
        dx = d;
    }
    grads[0] = Some(llama::embedding_backward(cfg, &index(cfg, tokens), &dx, None).unwrap());
    let h = grads[head].take().unwrap();
    grads[head] = Some((h + dhead).unwrap());
    (loss, grads.into_iter().map(Option::unwrap).collect())
}

#[test]
fn whole_model_gradients_match_fd_tied_and_untied() {
    let shapes = [true, false]
        .into_iter()
        .flat_map(|tied| block_shapes(tied).into_iter().map(move |s| (tied, s)));
    for (tied, (name, cfg)) in shapes.filter(|(_, (name, _))| name != "llama kv=1") {
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
                &format!("{name} tied={tied} {}", unit.name),
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
            x = llama::block_forward(&cfg, Dense, &ps[1 + l].clone().into(), &x, Recompute::Off)
                .unwrap()
                .0;
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
        let (out, saved) =
            llama::block_forward(&cfg, Dense, &p.clone().into(), &x, Recompute::Attention).unwrap();
        let (dx, dp) =
            llama::block_backward(&cfg, Dense, &p.clone().into(), &saved, &dout).unwrap();
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

/// The tokens as the embedding's backward takes them.
fn index(cfg: &ModelConfig, tokens: &Tensor) -> model::layers::TokenIndex {
    model::layers::TokenIndex::new(tokens, cfg.vocab_size).unwrap()
}
