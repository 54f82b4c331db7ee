//! Every unit's backward, and the loss's, checked two ways in f64:
//! (a) central finite differences of `sum(out * dout)` (or the loss) on every coordinate;
//! (b) candle autograd through an unfused reference forward written below with basic ops
//!     (per-head loop, `where_cond` mask, division-form LayerNorm), comparing full gradients.
//!
//! Sizes don't coincide: B=3, T=5, seq_len=7 (so wpe has unused rows), C=8, NH=2 (hs=4), V=11, L=2.

use candle_core::{DType, Device, Tensor, Var, D};
use model::gpt2::*;
use model::LinearFormat::Dense;
use model::*;

mod common;
use common::*;

const B: usize = 3;
const T: usize = 5;

fn cfg() -> ModelConfig {
    ModelConfig::gpt2(2, 8, 2, 7, 11)
}

fn t3(v: &[f64]) -> Tensor {
    Tensor::from_slice(v, (B, T, cfg().n_embd), &Device::Cpu).unwrap()
}

const AD_RTOL: f64 = 1e-10;
const AD_ATOL: f64 = 1e-12;

// ------------------------------------------------------------------------------------------
// The unfused reference forward (autograd-able).

mod reference {
    use super::*;

    pub fn layernorm(x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
        let mean = x.mean_keepdim(D::Minus1).unwrap();
        let xc = x.broadcast_sub(&mean).unwrap();
        let var = xc.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        let xhat = xc
            .broadcast_div(&(var + 1e-5).unwrap().sqrt().unwrap())
            .unwrap();
        xhat.broadcast_mul(w).unwrap().broadcast_add(b).unwrap()
    }

    pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Tensor {
        x.broadcast_matmul(w).unwrap().broadcast_add(b).unwrap()
    }

    pub fn gelu(x: &Tensor) -> Tensor {
        let inner = (x + x.powf(3.0).unwrap().affine(0.044715, 0.0).unwrap()).unwrap();
        let t = inner
            .affine((2.0 / std::f64::consts::PI).sqrt(), 0.0)
            .unwrap()
            .tanh()
            .unwrap();
        (x * t.affine(0.5, 0.5).unwrap()).unwrap()
    }

    /// Per-head loop, `where_cond` mask, softmax with a detached max.
    pub fn attention(qkv: &Tensor, n_head: usize) -> Tensor {
        let (b, t, c3) = qkv.dims3().unwrap();
        let c = c3 / 3;
        let hs = c / n_head;
        let keep: Vec<u8> = (0..t * t).map(|ij| u8::from(ij % t <= ij / t)).collect();
        let keep = Tensor::from_vec(keep, (1, t, t), qkv.device())
            .unwrap()
            .broadcast_as((b, t, t))
            .unwrap();
        let neg = Tensor::full(f64::NEG_INFINITY, (b, t, t), qkv.device()).unwrap();
        let heads: Vec<Tensor> = (0..n_head)
            .map(|h| {
                let part = |i: usize| {
                    qkv.narrow(2, i * c + h * hs, hs)
                        .unwrap()
                        .contiguous()
                        .unwrap()
                };
                let (q, k, v) = (part(0), part(1), part(2));
                let s = (q.matmul(&k.t().unwrap()).unwrap() / (hs as f64).sqrt()).unwrap();
                let s = keep.where_cond(&s, &neg).unwrap();
                let e = s
                    .broadcast_sub(&s.max_keepdim(D::Minus1).unwrap().detach())
                    .unwrap()
                    .exp()
                    .unwrap();
                let p = e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap();
                p.matmul(&v).unwrap()
            })
            .collect();
        Tensor::cat(&heads, 2).unwrap()
    }

    pub fn embedding(unit: &UnitLayout, params: &Tensor, tokens: &Tensor) -> Tensor {
        let wte = unit.param("wte.weight").view(params).unwrap();
        let wpe = unit.param("wpe.weight").view(params).unwrap();
        let (b, t) = tokens.dims2().unwrap();
        let tok = wte
            .index_select(&tokens.flatten_all().unwrap(), 0)
            .unwrap()
            .reshape((b, t, ()))
            .unwrap();
        tok.broadcast_add(&wpe.narrow(0, 0, t).unwrap()).unwrap()
    }

    pub fn block(cfg: &ModelConfig, unit: &UnitLayout, params: &Tensor, x: &Tensor) -> Tensor {
        let p = |n: &str| unit.param(n).view(params).unwrap();
        let a = layernorm(x, &p("ln_1.weight"), &p("ln_1.bias"));
        let a = linear(&a, &p("attn.c_attn.weight"), &p("attn.c_attn.bias"));
        let a = attention(&a, cfg.n_head);
        let x = (x + linear(&a, &p("attn.c_proj.weight"), &p("attn.c_proj.bias"))).unwrap();
        let m = layernorm(&x, &p("ln_2.weight"), &p("ln_2.bias"));
        let m = gelu(&linear(&m, &p("mlp.c_fc.weight"), &p("mlp.c_fc.bias")));
        (&x + linear(&m, &p("mlp.c_proj.weight"), &p("mlp.c_proj.bias"))).unwrap()
    }

    pub fn final_norm(unit: &UnitLayout, params: &Tensor, x: &Tensor) -> Tensor {
        layernorm(
            x,
            &unit.param("ln_f.weight").view(params).unwrap(),
            &unit.param("ln_f.bias").view(params).unwrap(),
        )
    }

    /// Mean cross-entropy via log-softmax and gather.
    pub fn loss(emb: &UnitLayout, emb_params: &Tensor, x: &Tensor, targets: &Tensor) -> Tensor {
        let wte = emb.param("wte.weight").view(emb_params).unwrap();
        let logits = x.broadcast_matmul(&wte.t().unwrap()).unwrap(); // (B, T, V)
        let m = logits.max_keepdim(D::Minus1).unwrap().detach();
        let sh = logits.broadcast_sub(&m).unwrap();
        let lsm = sh
            .broadcast_sub(
                &sh.exp()
                    .unwrap()
                    .sum_keepdim(D::Minus1)
                    .unwrap()
                    .log()
                    .unwrap(),
            )
            .unwrap();
        let picked = lsm.gather(&targets.unsqueeze(2).unwrap(), 2).unwrap();
        picked.mean_all().unwrap().neg().unwrap()
    }

    pub fn model(
        cfg: &ModelConfig,
        layout: &ModelLayout,
        params: &[Tensor],
        tokens: &Tensor,
        targets: &Tensor,
    ) -> Tensor {
        let mut x = embedding(layout.embedding(), &params[0], tokens);
        for l in 0..cfg.n_layer {
            x = block(cfg, layout.block(l), &params[1 + l], &x);
        }
        let x = final_norm(layout.final_norm(), &params[cfg.n_layer + 1], &x);
        loss(layout.embedding(), &params[0], &x, targets)
    }
}

/// Autograd gradients of `f` with respect to each of `inputs` (as flat vectors).
fn autograd(inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Tensor) -> Vec<Vec<f64>> {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let grads = f(&ts).backward().unwrap();
    ts.iter()
        .map(|t| vec1(grads.get(t).expect("gradient")))
        .collect()
}

// ------------------------------------------------------------------------------------------

#[test]
fn embedding_backward_matches_fd_and_autograd() {
    let cfg = cfg();
    let layout = ModelLayout::new(&cfg);
    let unit = layout.embedding();
    let mut rng = Rng(1);
    let p = rand_params(unit, &mut rng);
    let tokens = rng.tokens((B, T), cfg.vocab_size);
    let dout = t3(&rng.vec(B * T * cfg.n_embd, 1.0));

    let out = embedding_unit_forward(&cfg, &t1(&p), &tokens).unwrap();
    assert_eq!(out.dims(), [B, T, cfg.n_embd]);
    let index = model::layers::TokenIndex::new(&tokens, cfg.vocab_size).unwrap();
    let g = vec1(&embedding_unit_backward(&cfg, &index, &dout, None).unwrap());
    assert_eq!(g.len(), unit.numel);

    let fd = finite_diff(&p, |p| {
        dot(
            &embedding_unit_forward(&cfg, &t1(p), &tokens).unwrap(),
            &dout,
        )
    });
    assert_close("embedding fd", &g, &fd[..unit.numel], FD_RTOL, FD_ATOL);
    let ad = autograd(&[t1(&p)], |v| {
        (reference::embedding(unit, &v[0], &tokens) * &dout)
            .unwrap()
            .sum_all()
            .unwrap()
    });
    assert_close(
        "embedding autograd",
        &g,
        &ad[0][..unit.numel],
        AD_RTOL,
        AD_ATOL,
    );
}

#[test]
fn block_backward_matches_fd_and_autograd() {
    let cfg = cfg();
    let layout = ModelLayout::new(&cfg);
    let unit = layout.block(1);
    let mut rng = Rng(2);
    let p = rand_params(unit, &mut rng);
    let x = rng.vec(B * T * cfg.n_embd, 1.0);
    let dout = t3(&rng.vec(B * T * cfg.n_embd, 1.0));

    for recompute in [Recompute::Off, Recompute::Full] {
        let (out, saved) = block_forward(&cfg, Dense, &t1(&p).into(), &t3(&x), recompute).unwrap();
        assert_eq!(saved.recompute(), recompute);
        assert_eq!(out.dims(), [B, T, cfg.n_embd]);
        let (dx, dp) = block_backward(&cfg, Dense, &t1(&p).into(), &saved, &dout).unwrap();
        let (dx, dp) = (vec1(&dx), vec1(&dp));
        assert_eq!(dp.len(), unit.numel);

        let f = |p: &[f64], x: &[f64]| {
            dot(
                &block_forward(&cfg, Dense, &t1(p).into(), &t3(x), Recompute::Off)
                    .unwrap()
                    .0,
                &dout,
            )
        };
        let fd_p = finite_diff(&p, |p| f(p, &x));
        let fd_x = finite_diff(&x, |x| f(&p, x));
        assert_close(
            "block fd params",
            &dp,
            &fd_p[..unit.numel],
            FD_RTOL,
            FD_ATOL,
        );
        assert_close("block fd x", &dx, &fd_x, FD_RTOL, FD_ATOL);

        let ad = autograd(&[t1(&p), t3(&x)], |v| {
            (reference::block(&cfg, unit, &v[0], &v[1]) * &dout)
                .unwrap()
                .sum_all()
                .unwrap()
        });
        assert_close(
            "block autograd params",
            &dp,
            &ad[0][..unit.numel],
            AD_RTOL,
            AD_ATOL,
        );
        assert_close("block autograd x", &dx, &ad[1], AD_RTOL, AD_ATOL);
        // Padding gets no gradient in the reference either.
        assert!(ad[0][unit.numel..].iter().all(|&g| g == 0.0));
    }
}

#[test]
fn final_norm_backward_matches_fd_and_autograd() {
    let cfg = cfg();
    let layout = ModelLayout::new(&cfg);
    let unit = layout.final_norm();
    let mut rng = Rng(3);
    let p = rand_params(unit, &mut rng);
    let x = rng.vec(B * T * cfg.n_embd, 2.0);
    let dout = t3(&rng.vec(B * T * cfg.n_embd, 1.0));

    let (_, saved) = final_norm_forward(&cfg, &t1(&p), &t3(&x)).unwrap();
    let (dx, dp) = final_norm_backward(&cfg, &t1(&p), &saved, &dout).unwrap();
    let (dx, dp) = (vec1(&dx), vec1(&dp));
    assert_eq!(dp.len(), unit.numel);

    let f = |p: &[f64], x: &[f64]| dot(&final_norm_forward(&cfg, &t1(p), &t3(x)).unwrap().0, &dout);
    assert_close(
        "ln_f fd params",
        &dp,
        &finite_diff(&p, |p| f(p, &x))[..unit.numel],
        FD_RTOL,
        FD_ATOL,
    );
    assert_close(
        "ln_f fd x",
        &dx,
        &finite_diff(&x, |x| f(&p, x)),
        FD_RTOL,
        FD_ATOL,
    );
    let ad = autograd(&[t1(&p), t3(&x)], |v| {
        (reference::final_norm(unit, &v[0], &v[1]) * &dout)
            .unwrap()
            .sum_all()
            .unwrap()
    });
    assert_close(
        "ln_f autograd params",
        &dp,
        &ad[0][..unit.numel],
        AD_RTOL,
        AD_ATOL,
    );
    assert_close("ln_f autograd x", &dx, &ad[1], AD_RTOL, AD_ATOL);
}

#[test]
fn lm_head_loss_backward_matches_fd_and_autograd() {
    let cfg = cfg();
    let layout = ModelLayout::new(&cfg);
    let unit = layout.embedding();
    let mut rng = Rng(4);
    let p = rand_params(unit, &mut rng);
    let x = rng.vec(B * T * cfg.n_embd, 1.0);
    let targets = rng.tokens((B, T), cfg.vocab_size);

    let (loss, dx, dp) = lm_head_loss_backward(&cfg, &t1(&p), &t3(&x), &targets).unwrap();
    let loss_only = lm_head_loss(&cfg, &t1(&p), &t3(&x), &targets).unwrap();
    assert_eq!(loss, loss_only);
    let (dx, dp) = (vec1(&dx), vec1(&dp));
    assert_eq!(dp.len(), unit.numel);
    let wte_n = unit.param("wte.weight").numel;
    assert!(
        dp[wte_n..].iter().all(|&g| g == 0.0),
        "wpe part must be zero"
    );

    let f = |p: &[f64], x: &[f64]| lm_head_loss(&cfg, &t1(p), &t3(x), &targets).unwrap();
    assert_close(
        "head fd params",
        &dp,
        &finite_diff(&p, |p| f(p, &x))[..unit.numel],
        FD_RTOL,
        FD_ATOL,
    );
    assert_close(
        "head fd x",
        &dx,
        &finite_diff(&x, |x| f(&p, x)),
        FD_RTOL,
        FD_ATOL,
    );
    let ad = autograd(&[t1(&p), t3(&x)], |v| {
        reference::loss(unit, &v[0], &v[1], &targets)
    });
    let ref_loss = reference::loss(unit, &t1(&p), &t3(&x), &targets)
        .to_scalar::<f64>()
        .unwrap();
    assert!((loss - ref_loss).abs() < 1e-12, "{loss} vs {ref_loss}");
    assert_close(
        "head autograd params",
        &dp,
        &ad[0][..unit.numel],
        AD_RTOL,
        AD_ATOL,
    );
    assert_close("head autograd x", &dx, &ad[1], AD_RTOL, AD_ATOL);
}

#[test]
fn crossentropy_chunking_does_not_change_results() {
    let cfg = cfg();
    let mut rng = Rng(10);
    let x = Tensor::from_vec(
        rng.vec(B * T * cfg.n_embd, 1.0),
        (B * T, cfg.n_embd),
        &Device::Cpu,
    )
    .unwrap();
    let wte = Tensor::from_vec(
        rng.vec(cfg.vocab_size * cfg.n_embd, 0.5),
        (cfg.vocab_size, cfg.n_embd),
        &Device::Cpu,
    )
    .unwrap();
    let targets = rng.tokens((B, T), cfg.vocab_size).flatten_all().unwrap();
    let (l0, g0) =
        model::layers::crossentropy_chunked(&x, &wte, &targets, true, usize::MAX).unwrap();
    // 2 rows per chunk: 8 chunks, the last one short.
    let (l1, g1) =
        model::layers::crossentropy_chunked(&x, &wte, &targets, true, 2 * cfg.vocab_size).unwrap();
    let (l0, l1) = (l0.value().unwrap(), l1.value().unwrap());
    assert!((l0 - l1).abs() < 1e-12);
    let ((dx0, dw0), (dx1, dw1)) = (g0.unwrap(), g1.unwrap());
    assert_close("chunked dx", &vec1(&dx1), &vec1(&dx0), 1e-12, 1e-14);
    assert_close("chunked dwte", &vec1(&dw1), &vec1(&dw0), 1e-12, 1e-14);
}

#[test]
fn whole_model_gradients_match_fd_and_autograd() {
    let cfg = cfg();
    let layout = ModelLayout::new(&cfg);
    let mut rng = Rng(5);
    let ps: Vec<Vec<f64>> = layout
        .units
        .iter()
        .map(|u| rand_params(u, &mut rng))
        .collect();
    let tokens = rng.tokens((B, T), cfg.vocab_size);
    let targets = rng.tokens((B, T), cfg.vocab_size);
    let tensors: Vec<Tensor> = ps.iter().map(|p| t1(p)).collect();

    let (loss, grads) = Model::new(cfg.clone())
        .unwrap()
        .loss_and_grads(&tensors, &tokens, &targets, model::Recompute::Off)
        .unwrap();
    assert_eq!(
        loss,
        Model::new(cfg.clone())
            .unwrap()
            .loss(&tensors, &tokens, &targets)
            .unwrap()
    );
    let ad = autograd(&tensors, |v| {
        reference::model(&cfg, &layout, v, &tokens, &targets)
    });
    for (u, unit) in layout.units.iter().enumerate() {
        let g = vec1(&grads[u]);
        assert_eq!(g.len(), unit.numel);
        assert_close(
            &format!("model autograd {}", unit.name),
            &g,
            &ad[u][..unit.numel],
            AD_RTOL,
            AD_ATOL,
        );
        // Finite differences on a sample of every unit's coordinates.
        let idx: Vec<usize> = (0..unit.numel).step_by(7).collect();
        let mut p = ps.clone();
        let fd: Vec<f64> = idx
            .iter()
            .map(|&i| {
                let h = 1e-5;
                let x0 = p[u][i];
                let mut eval = |x: f64| {
                    p[u][i] = x;
                    let ts: Vec<Tensor> = p.iter().map(|q| t1(q)).collect();
                    Model::new(cfg.clone())
                        .unwrap()
                        .loss(&ts, &tokens, &targets)
                        .unwrap()
                };
                let d = (eval(x0 + h) - eval(x0 - h)) / (2.0 * h);
                p[u][i] = x0;
                d
            })
            .collect();
        let got: Vec<f64> = idx.iter().map(|&i| g[i]).collect();
        assert_close(
            &format!("model fd {}", unit.name),
            &got,
            &fd,
            FD_RTOL,
            FD_ATOL,
        );
    }
}

/// f32 parameters initialised the way training does.
fn init_params(cfg: &ModelConfig, layout: &ModelLayout, seed: u64) -> Vec<Tensor> {
    layout
        .units
        .iter()
        .map(|u| {
            let mut buf = vec![0f32; u.numel];
            init_unit_range(cfg, u, seed, 0, &mut buf);
            Tensor::from_vec(buf, u.numel, &Device::Cpu).unwrap()
        })
        .collect()
}

#[test]
fn recompute_gives_bitwise_identical_gradients() {
    let cfg = cfg();
    let layout = ModelLayout::new(&cfg);
    let mut rng = Rng(6);
    let params: Vec<Tensor> = layout
        .units
        .iter()
        .map(|u| t1(&rand_params(u, &mut rng)).to_dtype(DType::F32).unwrap())
        .collect();
    let (tokens, targets) = (
        rng.tokens((B, T), cfg.vocab_size),
        rng.tokens((B, T), cfg.vocab_size),
    );
    let (l0, g0) = Model::new(cfg.clone())
        .unwrap()
        .loss_and_grads(&params, &tokens, &targets, model::Recompute::Off)
        .unwrap();
    let (l1, g1) = Model::new(cfg.clone())
        .unwrap()
        .loss_and_grads(&params, &tokens, &targets, model::Recompute::Full)
        .unwrap();
    assert_eq!(l0.to_bits(), l1.to_bits());
    for (a, b) in g0.iter().zip(&g1) {
        assert_eq!(a.dtype(), DType::F32);
        let bits = |t: &Tensor| {
            t.to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(a), bits(b));
    }
}

#[test]
fn loss_at_init_is_ln_vocab() {
    let cfg = preset("tiny").unwrap();
    let layout = ModelLayout::new(&cfg);
    let params = init_params(&cfg, &layout, 1234);
    let mut rng = Rng(7);
    let tok = |rng: &mut Rng| {
        let t: Vec<u32> = (0..2 * 32)
            .map(|_| (rng.next_u64() % 50257) as u32)
            .collect();
        Tensor::from_vec(t, (2, 32), &Device::Cpu).unwrap()
    };
    let (tokens, targets) = (tok(&mut rng), tok(&mut rng));
    let loss = Model::new(cfg.clone())
        .unwrap()
        .loss(&params, &tokens, &targets)
        .unwrap();
    let ln_v = (cfg.vocab_size as f64).ln();
    assert!((loss - ln_v).abs() < 0.1, "loss {loss} vs ln V {ln_v}");
}

#[test]
fn outputs_are_causal() {
    let cfg = cfg();
    let layout = ModelLayout::new(&cfg);
    let mut rng = Rng(8);
    let params: Vec<Tensor> = layout
        .units
        .iter()
        .map(|u| t1(&rand_params(u, &mut rng)))
        .collect();
    let tokens = rng.tokens((B, T), cfg.vocab_size);
    let hidden = |tokens: &Tensor| {
        let mut x = embedding_unit_forward(&cfg, &params[0], tokens).unwrap();
        for l in 0..cfg.n_layer {
            x = block_forward(
                &cfg,
                Dense,
                &params[1 + l].clone().into(),
                &x,
                Recompute::Off,
            )
            .unwrap()
            .0;
        }
        final_norm_forward(&cfg, &params[cfg.n_layer + 1], &x)
            .unwrap()
            .0
    };
    assert_causal(&tokens, cfg.vocab_size, hidden);
}

#[test]
fn bad_inputs_are_errors() {
    let cfg = cfg();
    let layout = ModelLayout::new(&cfg);
    let short = Tensor::zeros(layout.block(0).numel - 1, DType::F64, &Device::Cpu).unwrap();
    let x = Tensor::zeros((B, T, cfg.n_embd), DType::F64, &Device::Cpu).unwrap();
    assert!(matches!(
        block_forward(&cfg, Dense, &short.clone().into(), &x, Recompute::Off),
        Err(ModelError::ParamsTooShort { .. })
    ));
    let emb = Tensor::zeros(layout.embedding().numel, DType::F64, &Device::Cpu).unwrap();
    let long = Tensor::zeros((1, cfg.seq_len + 1), DType::U32, &Device::Cpu).unwrap();
    assert!(matches!(
        embedding_unit_forward(&cfg, &emb, &long),
        Err(ModelError::SequenceTooLong { .. })
    ));
    let float_tokens = Tensor::zeros((1, 2), DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        embedding_unit_forward(&cfg, &emb, &float_tokens),
        Err(ModelError::TokenDType { .. })
    ));
    assert!(matches!(
        Model::new(cfg.clone()).unwrap().loss(&[emb], &long, &long),
        Err(ModelError::UnitCount {
            expected: 4,
            got: 1
        })
    ));
}

/// `cargo test -p model --release -- --ignored --nocapture time_tiny` prints the time of one
/// f32 `model_loss_and_grads` on the `tiny` preset with B=16, T=64.
#[test]
#[ignore]
fn time_tiny_b16() {
    let cfg = preset("tiny").unwrap();
    let layout = ModelLayout::new(&cfg);
    let params = init_params(&cfg, &layout, 1);
    let mut rng = Rng(9);
    let tok = |rng: &mut Rng| {
        let t: Vec<u32> = (0..16 * 64)
            .map(|_| (rng.next_u64() % 50257) as u32)
            .collect();
        Tensor::from_vec(t, (16, 64), &Device::Cpu).unwrap()
    };
    let (tokens, targets) = (tok(&mut rng), tok(&mut rng));
    for recompute in [Recompute::Off, Recompute::Full, Recompute::Off] {
        let t0 = std::time::Instant::now();
        let (loss, _) = Model::new(cfg.clone())
            .unwrap()
            .loss_and_grads(&params, &tokens, &targets, recompute)
            .unwrap();
        println!(
            "tiny B=16 T=64 f32 recompute={recompute}: loss {loss:.4}, {:?}",
            t0.elapsed()
        );
    }
    let t0 = std::time::Instant::now();
    Model::new(cfg.clone())
        .unwrap()
        .loss(&params, &tokens, &targets)
        .unwrap();
    println!("forward only: {:?}", t0.elapsed());
}
