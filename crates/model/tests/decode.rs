//! Incremental decoding (model::decode) against the units' training forwards, in f32 on the CPU,
//! for every registered family (a small shape of each, grouped-query and tied where the family
//! has them), and for Llama with multi-query attention (KV = 1, untied head) too.
//!
//! The reference is the full-sequence forward through the schedule's units
//! ([`Model::forward`]: embedding, blocks, final norm) with `logits = final norm output @
//! head^T` at every position, the head being the `(V, C)` matrix of the head's unit. Parameters come from
//! `init_unit_range`, the matrices scaled up (std ~0.4) and the norm weights and biases
//! perturbed, so that attention is far from uniform and every position, offset and head
//! mapping shows in the logits; Llama's rotary base is 100 so that 9 positions turn visibly.

use candle_core::{Device, Tensor};
use model::decode::{Decoder, KvCache, Sampling};
use model::{init_unit_range, Model, ModelConfig, ModelError, ModelLayout, ParamInit, Sizes};

mod common;
use common::Rng;

const SEQ: usize = 9;
const VOCAB: usize = 23;

/// Every family at L=2, C=16, NH=4 (hs=4), KV=2 and F=24 where it takes them, tied and
/// untied ([`model::every_family`]); and Llama with multi-query attention (KV=1). A rotary base
/// of 100 where the family rotates.
fn configs() -> Vec<(String, ModelConfig)> {
    let sizes = Sizes {
        n_layer: 2,
        n_embd: 16,
        n_head: 4,
        seq_len: SEQ,
        vocab_size: VOCAB,
        n_kv_head: Some(2),
        head_dim: None,
        ffn_hidden: Some(24),
        tie_embeddings: None,
    };
    let mut configs = model::every_family(&sizes);
    let mqa = Sizes {
        n_kv_head: Some(1),
        tie_embeddings: Some(false),
        ..sizes
    };
    let llama = model::family("llama").unwrap().config(&mqa).unwrap();
    configs.push(("llama mqa untied".into(), llama));
    // Llama 3.1's scaling, from a context of 4 so that it turns the angles of these 9
    // positions: the decoder's tables must be the training forward's.
    let mut scaled = model::family("llama").unwrap().config(&sizes).unwrap();
    scaled.rope_scaling = model::RopeScaling::Llama3 {
        factor: 4.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 4,
    };
    configs.push(("llama scaled".into(), scaled));
    for (_, c) in &mut configs {
        c.rope_theta = 100.0;
    }
    configs
}

/// Each unit's flat buffer (plus 3 elements of padding, which the decoder must ignore):
/// `init_unit_range`, the normal matrices times 20, the ones and zeros moved by up to 0.2.
fn units(cfg: &ModelConfig, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng(seed);
    ModelLayout::new(cfg)
        .units
        .iter()
        .map(|u| {
            let mut buf = vec![0f32; u.numel + 3];
            init_unit_range(cfg, u, seed, 0, &mut buf);
            for p in &u.params {
                for x in &mut buf[p.offset..p.offset + p.numel] {
                    match p.init {
                        ParamInit::Normal { .. } => *x *= 20.0,
                        ParamInit::Ones | ParamInit::Zeros => *x += 0.2 * rng.unif() as f32,
                    }
                }
            }
            Tensor::from_vec(buf, u.numel + 3, &Device::Cpu).unwrap()
        })
        .collect()
}

/// The logits `(T, V)` of every position of `tokens`, through the units' training forwards.
fn full_logits(cfg: &ModelConfig, p: &[Tensor], tokens: &[u32]) -> Vec<Vec<f32>> {
    let t = tokens.len();
    let mut x = Tensor::from_slice(tokens, (1, t), &Device::Cpu).unwrap();
    let model = Model::new(cfg.clone()).unwrap();
    for (u, params) in p.iter().enumerate() {
        x = model
            .forward(u, &params.clone().into(), &x, model::Recompute::Off)
            .unwrap()
            .0;
    }
    let head = &model.units()[model.head_unit()];
    let w = head
        .params
        .iter()
        .find(|w| w.shape == [cfg.vocab_size, cfg.n_embd])
        .unwrap()
        .view(&p[model.head_unit()])
        .unwrap();
    x.reshape((t, cfg.n_embd))
        .unwrap()
        .matmul(&w.t().unwrap())
        .unwrap()
        .to_vec2()
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The lowest index of the largest value (torch.argmax), written here independently.
fn argmax(v: &[f32]) -> u32 {
    let m = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    v.iter().position(|&x| x == m).unwrap() as u32
}

/// Indices of the `k` largest values.
fn top(v: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    idx.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

fn decoder(cfg: &ModelConfig, seed: u64) -> (Vec<Tensor>, Decoder) {
    let p = units(cfg, seed);
    let dec = Decoder::new(cfg.clone(), p.clone()).unwrap();
    (p, dec)
}

const TOL: f32 = 1e-4;

#[test]
fn decode_matches_the_full_forward_at_every_position() {
    for (name, cfg) in configs() {
        let (p, dec) = decoder(&cfg, 11);
        let tokens = Rng(3).ids(SEQ, VOCAB);
        let full = full_logits(&cfg, &p, &tokens);
        // The context must matter, or this test could not see a wrong cache: changing the
        // first token moves the logits of every later position.
        let mut other = tokens.clone();
        other[0] = (other[0] + 1) % VOCAB as u32;
        let moved = full_logits(&cfg, &p, &other);
        for i in 1..SEQ {
            assert!(max_diff(&full[i], &moved[i]) > 0.05, "{name}: position {i}");
        }
        for prefill in [1, 4, SEQ] {
            let mut cache = dec.cache(SEQ).unwrap();
            let logits = dec.forward(&tokens[..prefill], &mut cache).unwrap();
            let d = max_diff(&logits, &full[prefill - 1]);
            assert!(d < TOL, "{name}: prefill {prefill}: {d}");
            for i in prefill..SEQ {
                let logits = dec.forward(&tokens[i..=i], &mut cache).unwrap();
                let d = max_diff(&logits, &full[i]);
                assert!(d < TOL, "{name}: prefill {prefill}, position {i}: {d}");
            }
            assert_eq!(cache.len(), SEQ);
        }
    }
}

#[test]
fn prefill_equals_feeding_token_by_token_or_in_chunks() {
    for (name, cfg) in configs() {
        let (_, dec) = decoder(&cfg, 12);
        let tokens = Rng(4).ids(SEQ, VOCAB);
        let mut whole = dec.cache(SEQ).unwrap();
        let a = dec.forward(&tokens[..7], &mut whole).unwrap();
        let mut single = dec.cache(SEQ).unwrap();
        let mut b = vec![];
        for i in 0..7 {
            b = dec.forward(&tokens[i..=i], &mut single).unwrap();
        }
        let mut chunked = dec.cache(SEQ).unwrap();
        let mut c = vec![];
        for (s, e) in [(0, 2), (2, 5), (5, 7)] {
            c = dec.forward(&tokens[s..e], &mut chunked).unwrap();
        }
        assert!(max_diff(&a, &b) < 1e-5, "{name}: token by token");
        assert!(max_diff(&a, &c) < 1e-5, "{name}: chunks");
        for l in 0..cfg.n_layer {
            for cache in [&single, &chunked] {
                let (x, y) = (whole.layer(l), cache.layer(l));
                for (u, v) in [(x.keys(), y.keys()), (x.values(), y.values())] {
                    let (u, v) = (u.unwrap(), v.unwrap());
                    assert_eq!(u.dims(), [1, cfg.n_kv_head, 7, 4]);
                    let d = (u - v).unwrap().abs().unwrap().max_all().unwrap();
                    assert!(d.to_scalar::<f32>().unwrap() < 1e-5, "{name}: layer {l}");
                }
            }
        }
        // and the next step reads them alike, at position 7, 8 in one go
        let a = dec.forward(&tokens[7..], &mut whole).unwrap();
        let b = dec.forward(&tokens[7..], &mut single).unwrap();
        assert!(max_diff(&a, &b) < 1e-5, "{name}: after the prefill");
        // rewinding to the prompt replays the same step
        whole.truncate(7);
        let c = dec.forward(&tokens[7..], &mut whole).unwrap();
        assert!(max_diff(&a, &c) < 1e-6, "{name}: after truncate");
    }
}

#[test]
fn greedy_generation_is_deterministic_and_follows_the_full_forward() {
    for (name, cfg) in configs() {
        let (p, dec) = decoder(&cfg, 13);
        let prompt = Rng(5).ids(3, VOCAB);
        let mut streamed = vec![];
        let out = dec
            .generate(&prompt, &Sampling::greedy(100), |t| {
                streamed.push(t);
                true
            })
            .unwrap();
        // stops once the SEQ positions are full: the last token is predicted at SEQ - 1
        assert_eq!(out.len(), SEQ + 1 - prompt.len(), "{name}");
        assert_eq!(streamed, out, "{name}");
        let again = dec.generate(&prompt, &Sampling::greedy(100), |_| true);
        assert_eq!(again.unwrap(), out, "{name}: not deterministic");
        let mut seq = prompt.clone();
        for (i, &tok) in out.iter().enumerate() {
            let full = full_logits(&cfg, &p, &seq);
            let last = full.last().unwrap();
            assert_eq!(tok, argmax(last), "{name}: token {i}");
            let best = top(last, 2);
            let gap = last[best[0] as usize] - last[best[1] as usize];
            assert!(gap > 10.0 * TOL, "{name}: token {i} is a near tie ({gap})");
            seq.push(tok);
        }
        // fewer tokens, a stop token, a callback that says stop
        let four = dec
            .generate(&prompt, &Sampling::greedy(4), |_| true)
            .unwrap();
        assert_eq!(four, out[..4], "{name}");
        let stop = Sampling {
            stop: Some(out[2]),
            ..Sampling::greedy(100)
        };
        let first = out.iter().position(|&t| t == out[2]).unwrap();
        let stopped = dec.generate(&prompt, &stop, |_| true).unwrap();
        assert_eq!(stopped, out[..=first], "{name}");
        let mut n = 0;
        let two = dec.generate(&prompt, &Sampling::greedy(100), |_| {
            n += 1;
            n < 2
        });
        assert_eq!(two.unwrap(), out[..2], "{name}");
        assert!(dec
            .generate(&prompt, &Sampling::greedy(0), |_| true)
            .unwrap()
            .is_empty());
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_top_1_is_greedy() {
    for (name, cfg) in configs() {
        let (p, dec) = decoder(&cfg, 14);
        let prompt = Rng(6).ids(2, VOCAB);
        let opts = |temperature, top_k, seed| Sampling {
            max_new_tokens: 100,
            temperature,
            top_k,
            seed,
            stop: None,
        };
        let draw = |o: &Sampling| dec.generate(&prompt, o, |_| true).unwrap();
        let a = draw(&opts(1.5, None, 5));
        assert_eq!(a, draw(&opts(1.5, None, 5)), "{name}: same seed");
        assert_eq!(a.len(), SEQ + 1 - prompt.len());
        // the seed is used: several seeds do not all give one sequence
        let seqs: Vec<_> = (0..6).map(|s| draw(&opts(1.5, None, s))).collect();
        assert!(seqs.iter().any(|s| *s != seqs[0]), "{name}: seed ignored");
        let greedy = draw(&Sampling::greedy(100));
        assert!(seqs.iter().any(|s| *s != greedy), "{name}: always greedy");
        for seed in 0..4 {
            assert_eq!(draw(&opts(0.7, Some(1), seed)), greedy, "{name}: top_k 1");
        }
        // top_k = 3: every token among the full forward's three largest logits there
        for seed in 0..4 {
            let out = draw(&opts(3.0, Some(3), seed));
            let mut seq = prompt.clone();
            for &tok in &out {
                let full = full_logits(&cfg, &p, &seq);
                assert!(top(full.last().unwrap(), 3).contains(&tok), "{name}");
                seq.push(tok);
            }
        }
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    for (name, cfg) in configs() {
        let (p, dec) = decoder(&cfg, 15);
        let greedy = Sampling::greedy(5);
        let long = vec![1u32; SEQ + 1];
        let e = dec.generate(&long, &greedy, |_| true).unwrap_err();
        assert!(
            matches!(e, ModelError::SequenceTooLong { got: 10, max: 9 }),
            "{name}: {e}"
        );
        let e = dec.generate(&[], &greedy, |_| true).unwrap_err();
        assert!(matches!(e, ModelError::NoTokens { .. }), "{name}: {e}");
        // a prompt of exactly seq_len fills the context: one token
        let full = dec.generate(&long[..SEQ], &greedy, |_| true).unwrap();
        assert_eq!(full.len(), 1, "{name}");

        let mut cache = dec.cache(SEQ).unwrap();
        let e = dec.forward(&long, &mut cache).unwrap_err();
        assert!(matches!(e, ModelError::ContextFull { .. }), "{name}: {e}");
        let e = dec.forward(&[], &mut cache).unwrap_err();
        assert!(matches!(e, ModelError::NoTokens { .. }), "{name}: {e}");
        dec.forward(&[1, 2, 3], &mut cache).unwrap();
        let e = dec.forward(&[4, VOCAB as u32], &mut cache).unwrap_err();
        assert!(
            matches!(e, ModelError::TokenOutOfVocab { token: 23, .. }),
            "{name}: {e}"
        );
        let e = dec
            .generate(&[VOCAB as u32], &greedy, |_| true)
            .unwrap_err();
        assert!(matches!(e, ModelError::TokenOutOfVocab { .. }), "{name}");
        assert_eq!(cache.len(), 3, "{name}: a refused call changes nothing");
        dec.forward(&long[..6], &mut cache).unwrap();
        let e = dec.forward(&[1], &mut cache).unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::ContextFull {
                    len: 9,
                    new: 1,
                    capacity: 9
                }
            ),
            "{name}: {e}"
        );
        let e = dec.cache(SEQ + 1).unwrap_err();
        assert!(matches!(e, ModelError::SequenceTooLong { .. }), "{name}");

        // options
        for bad in [
            Sampling {
                temperature: -1.0,
                ..greedy.clone()
            },
            Sampling {
                temperature: f64::NAN,
                ..greedy.clone()
            },
            Sampling {
                temperature: 1.0,
                top_k: Some(0),
                ..greedy.clone()
            },
        ] {
            let e = dec.generate(&[1], &bad, |_| true).unwrap_err();
            assert!(matches!(e, ModelError::BadSampling { .. }), "{name}: {e}");
        }

        // parameters and caches that are not the model's
        let e = Decoder::new(cfg.clone(), p[..p.len() - 1].to_vec()).unwrap_err();
        assert!(matches!(e, ModelError::UnitCount { .. }), "{name}: {e}");
        let mut short = p.clone();
        short[1] = short[1].narrow(0, 0, 10).unwrap();
        let e = Decoder::new(cfg.clone(), short).unwrap_err();
        assert!(
            matches!(e, ModelError::DecodeMismatch { .. }),
            "{name}: {e}"
        );
        let mut mixed = p.clone();
        mixed[1] = mixed[1].to_dtype(candle_core::DType::F64).unwrap();
        let e = Decoder::new(cfg.clone(), mixed).unwrap_err();
        assert!(
            matches!(e, ModelError::DecodeMismatch { .. }),
            "{name}: {e}"
        );
        let mut three = cfg.clone();
        three.n_layer = 3;
        let mut wrong = KvCache::new(&three, SEQ, candle_core::DType::F32, &Device::Cpu).unwrap();
        let e = dec.forward(&[1], &mut wrong).unwrap_err();
        assert!(
            matches!(e, ModelError::DecodeMismatch { .. }),
            "{name}: {e}"
        );
    }
}
