//! ZeRO++ at W = 8 as 2 nodes x 4: each technique alone and all three against plain ZeRO-3.

use comm::{Communicator, Topology};
use model::{LinearFormat, Model, ModelConfig, ModelLayout, Pass, Sizes};
use zero::{volume, Engine, EngineOptions, ZeroConfig};

fn cfg() -> ModelConfig {
    ModelConfig::gpt2(2, 16, 2, 8, 37)
}

fn zero(qwz: bool, hpz: bool, qgz: bool) -> ZeroConfig {
    ZeroConfig {
        quantized_weights: qwz,
        hpz_partition_size: if hpz { 4 } else { 1 },
        quantized_gradients: qgz,
        weight_quant_block: 64,
        grad_quant_block: 32,
        ..Default::default()
    }
}

fn options(z: ZeroConfig) -> EngineOptions {
    options_in(LinearFormat::Dense, z)
}

fn options_in(linears: LinearFormat, z: ZeroConfig) -> EngineOptions {
    EngineOptions {
        zero: z,
        total_steps: 100,
        seed: 5,
        linears,
        ..Default::default()
    }
}

fn sequence(s: usize) -> Vec<u32> {
    (0..8u32)
        .map(|i| (i * 7 + s as u32 * 13 + 1) % 37)
        .collect()
}

struct Outcome {
    losses: Vec<f64>,
    params: Vec<Vec<f32>>,
    bytes: Vec<comm::ByteCounters>,
}

/// `steps` steps of a 16-sequence global batch (2 micro-batches per rank) at W = 8 (2 x 4).
fn train(z: ZeroConfig, steps: usize) -> Outcome {
    train_model(&cfg(), z, steps)
}

/// [`train`] of the model `model` (T = 8, V = 37).
fn train_model(model: &ModelConfig, z: ZeroConfig, steps: usize) -> Outcome {
    train_in(LinearFormat::Dense, model, z, steps)
}

/// [`train_model`] with the blocks' linear layers in `linears`.
fn train_in(linears: LinearFormat, model: &ModelConfig, z: ZeroConfig, steps: usize) -> Outcome {
    let out = comm::run_local(
        Topology::new(8, 4).unwrap(),
        |c| -> Result<_, zero::ZeroError> {
            let rank = c.rank();
            let mut e = Engine::new(model.clone(), options_in(linears, z.clone()), Box::new(c))?;
            let mut losses = Vec::new();
            let mut bytes = Vec::new();
            for _ in 0..steps {
                let before = e.comm().counters();
                let mut loss = 0.0;
                for m in 0..2 {
                    let s = sequence(rank * 2 + m);
                    loss += e.forward_backward(&s, &s, 0.5)?;
                }
                losses.push(e.mean_over_world(loss / 2.0)?);
                e.step(1e-2)?;
                bytes.push(e.comm().counters() - before);
            }
            let params = e
                .gathered_parameters()?
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            Ok(Outcome {
                losses,
                params,
                bytes,
            })
        },
    )
    .unwrap();
    let bytes = out.iter().flat_map(|o| o.bytes.clone()).collect();
    let first = out.into_iter().next().unwrap();
    Outcome { bytes, ..first }
}

#[test]
fn hpz_changes_no_number() {
    let plain = train(zero(false, false, false), 4);
    let hpz = train(zero(false, true, false), 4);
    assert_eq!(plain.losses, hpz.losses);
    assert_eq!(plain.params, hpz.params);
    let both = train(zero(true, false, false), 4);
    let both_hpz = train(zero(true, true, false), 4);
    assert_eq!(
        both.losses, both_hpz.losses,
        "with qwZ, hpZ regathers the same INT8 codes"
    );
}

#[test]
fn counters_equal_the_logical_volume_in_every_mode() {
    let layout = ModelLayout::new(&cfg());
    let numels: Vec<usize> = layout.units.iter().map(|u| u.numel).collect();
    let order = Model::new(cfg()).unwrap().gather_order(Pass::Train);
    let topology = Topology::new(8, 4).unwrap();
    let mut inter = Vec::new();
    for (qwz, hpz, qgz) in [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (false, false, true),
        (true, true, true),
    ] {
        let z = zero(qwz, hpz, qgz);
        let plan = zero::ZeroPlan::resolve(&z, topology, 100).unwrap();
        let expected = volume::logical_step_bytes(&plan, &numels, &order, 4, 2, 1);
        let out = train(z, 2);
        for b in &out.bytes {
            assert_eq!(*b, expected, "qwz {qwz} hpz {hpz} qgz {qgz}");
        }
        inter.push(expected.inter as f64);
    }
    // hpZ alone keeps only the first forward gather of the step and the reductions across
    // nodes: with 2 micro-batches 3 of ZeRO-3's 6 transfers (with one, 2 of 3), but for the two
    // one-float all-reduces that close a step. Full ZeRO++ sends under 0.27 of them.
    let allreduce = (2 * 4 * 4) as f64;
    assert!((((inter[2] - allreduce) / (inter[0] - allreduce)) - 0.5).abs() < 1e-12);
    let one_micro = |z| {
        volume::logical_step_bytes(
            &zero::ZeroPlan::resolve(&z, topology, 1).unwrap(),
            &numels,
            &order,
            4,
            1,
            1,
        )
    };
    let (h, p) = (
        one_micro(zero(false, true, false)).inter as f64,
        one_micro(zero(false, false, false)).inter as f64,
    );
    assert!((((h - allreduce) / (p - allreduce)) - 2.0 / 3.0).abs() < 1e-12);
    assert!(
        inter[4] / inter[0] < 0.27,
        "full ZeRO++ / ZeRO-3 = {}",
        inter[4] / inter[0]
    );
}

/// The counters equal the logical volume where a walk is not two gathers a unit: for every
/// family, tied and untied (an untied Llama gathers its embedding and its final norm once), and
/// with hpZ prefetching 3 deep (a backward gather issued before its unit's forward gather was
/// waited comes from the world, in the step's first micro-batch).
#[test]
fn counters_equal_the_logical_volume_of_every_walk() {
    let topology = Topology::new(8, 4).unwrap();
    let shapes = model::every_family(&Sizes {
        n_layer: 2,
        n_embd: 16,
        n_head: 4,
        seq_len: 8,
        vocab_size: 37,
        n_kv_head: Some(2),
        head_dim: None,
        ffn_hidden: Some(24),
        tie_embeddings: None,
    });
    assert!(shapes.iter().any(|(name, _)| name.contains("untied")));
    let mut deeper = false;
    for (name, cfg) in &shapes {
        let model = Model::new(cfg.clone()).unwrap();
        let numels: Vec<usize> = model.units().iter().map(|u| u.numel).collect();
        let order = model.gather_order(Pass::Train);
        let mut hpz_inter = vec![];
        for (z, depth) in [
            (zero(false, false, false), 2),
            (zero(true, true, true), 2),
            (zero(false, true, false), 2),
            (zero(false, true, false), 3),
            (zero(true, true, true), 3),
        ] {
            let hpz = z.hpz_partition_size > 1 && !z.quantized_weights;
            let z = ZeroConfig {
                prefetch_depth: depth,
                ..z
            };
            let plan = zero::ZeroPlan::resolve(&z, topology, 100).unwrap();
            let expected = volume::logical_step_bytes(&plan, &numels, &order, 4, 2, 1);
            for b in &train_model(cfg, z.clone(), 2).bytes {
                assert_eq!(*b, expected, "{name}: {z:?}");
            }
            if hpz {
                hpz_inter.push(expected.inter);
            }
        }
        // Prefetching 3 deep, some backward gather leaves the node: more bytes cross it.
        deeper |= hpz_inter[1] > hpz_inter[0];
    }
    assert!(
        deeper,
        "no walk issues a backward gather before its forward's wait"
    );
}

/// FP8 qwZ's bytes are what the counters count: a block's codes, and from the world each
/// rank's slot of tile absmax and norms and biases (none over the node, where hpZ keeps them);
/// the embedding and the final norm as INT8 qwZ. Every family, and with weights of two tiles
/// a side; the engine's memory estimate keeps a block's node codes and resolved absmax.
#[test]
fn counters_equal_the_logical_volume_of_fp8_qwz() {
    let topology = Topology::new(8, 4).unwrap();
    let sizes = |n_embd, ffn| Sizes {
        n_layer: 2,
        n_embd,
        n_head: 4,
        seq_len: 8,
        vocab_size: 37,
        n_kv_head: Some(2),
        head_dim: None,
        ffn_hidden: Some(ffn),
        tie_embeddings: None,
    };
    let shapes = model::every_family(&sizes(16, 24))
        .into_iter()
        .chain(model::every_family(&sizes(144, 272)).into_iter().take(2));
    for (name, cfg) in shapes {
        let model = Model::new(cfg.clone()).unwrap();
        let numels: Vec<usize> = model.units().iter().map(|u| u.numel).collect();
        let order = model.gather_order(Pass::Train);
        for z in [zero(true, false, false), zero(true, true, true)] {
            let plan = zero::ZeroPlan::resolve(&z, topology, 100)
                .unwrap()
                .with_linears(LinearFormat::Fp8, model.layout());
            let int8 = zero::ZeroPlan::resolve(&z, topology, 100).unwrap();
            let expected = volume::logical_step_bytes(&plan, &numels, &order, 4, 2, 1);
            let as_int8 = volume::logical_step_bytes(&int8, &numels, &order, 4, 2, 1);
            assert_ne!(expected, as_int8, "{name}: FP8 qwZ is counted as itself");
            for b in &train_in(LinearFormat::Fp8, &cfg, z.clone(), 2).bytes {
                assert_eq!(*b, expected, "{name}: {z:?}");
            }
            if z.hpz_partition_size > 1 {
                let kept = zero::memory::rank_memory(&plan, &numels, 4, 1).hpz_secondary;
                let blocks: u64 = (0..numels.len())
                    .filter(|&u| !plan.linears(u).matrices.is_empty())
                    .map(|u| {
                        let codes = plan.partition(numels[u]).padded / 4;
                        (codes + 4 * plan.linears(u).resolved_len()) as u64
                    })
                    .sum();
                assert!(kept > blocks, "{name}: hpZ keeps {kept} bytes");
                let int8_kept = zero::memory::rank_memory(&int8, &numels, 4, 1).hpz_secondary;
                assert_ne!(kept, int8_kept, "{name}");
            }
        }
    }
}

/// Every weight the forward sees under qwZ, for `tiny` at W = 8 (2 x 4).
#[test]
fn qwz_weights_stay_within_the_int8_block_bound() {
    let block = 64;
    let out = comm::run_local(
        Topology::new(8, 4).unwrap(),
        |c| -> Result<_, zero::ZeroError> {
            let e = Engine::new(
                model::preset("tiny").expect("tiny is a preset"),
                options(zero(true, false, false)),
                Box::new(c),
            )?;
            let exact = e.gathered_parameters()?;
            let mut worst = 0.0f32;
            for (u, (_, master)) in exact.iter().enumerate() {
                let seen = e.gather_for_compute(u)?;
                for (b, chunk) in master.chunks(block).enumerate() {
                    let absmax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let bound = quant::int8_bound(absmax / 127.0);
                    for (i, v) in chunk.iter().enumerate() {
                        let err = (seen[b * block + i] - v).abs();
                        assert!(
                            err <= bound,
                            "unit {u} element {}: error {err} > {bound}",
                            b * block + i
                        );
                        worst = worst.max(err);
                    }
                }
            }
            Ok(worst)
        },
    )
    .unwrap();
    assert!(out[0] > 0.0, "qwZ must actually quantise");
}

#[test]
fn qwz_and_qgz_train_close_to_zero3() {
    let plain = train(zero(false, false, false), 30);
    let full = train(zero(true, true, true), 30);
    assert!(plain.losses[29] < plain.losses[0] - 0.5, "the model learns");
    let gap: f64 = plain
        .losses
        .iter()
        .zip(&full.losses)
        .map(|(a, b)| ((a - b) / a).abs())
        .sum::<f64>()
        / 30.0;
    assert!(
        gap < 0.02,
        "mean relative gap of ZeRO++ to ZeRO-3 over 30 steps: {gap}"
    );
}

/// How deep the gathers are prefetched changes no number, with every technique on: each unit is
/// gathered from the same shards (or secondary partitions) and reduced in the same order, at
/// depth 0 (each gather issued when needed) as at 1, 2 and 8 (a backward gather of the final
/// norm issued before its forward gather was waited then comes from the world). Depth 2 (the
/// default) moves exactly the bytes of depth 0.
#[test]
fn prefetch_depth_changes_no_number() {
    let at = |depth| {
        let z = ZeroConfig {
            prefetch_depth: depth,
            ..zero(true, true, true)
        };
        train(z, 3)
    };
    let none = at(0);
    for depth in [1, 2, 8] {
        let other = at(depth);
        assert_eq!(none.losses, other.losses, "depth {depth}");
        assert_eq!(none.params, other.params, "depth {depth}");
        if depth <= 2 {
            assert_eq!(none.bytes, other.bytes, "depth {depth}");
        }
    }
}

/// qgZ with error feedback (all three techniques on): a run resumed from its state after 2 steps
/// takes exactly the straight run's next steps, because each rank's error buffers travel in its
/// state; resumed without them, it leaves that curve. Feedback on keeps the training close to
/// ZeRO-3's, as qgZ alone does.
#[test]
fn error_feedback_resumes_exactly_from_the_state() {
    type State = std::collections::HashMap<String, Vec<f32>>;
    let z = ZeroConfig {
        qgz_error_feedback: true,
        ..zero(true, true, true)
    };
    // Losses of steps 3 and 4, resumed from the state after 2 steps through `keep`.
    let resumed = |keep: &(dyn Fn(&str) -> bool + Sync)| -> Vec<f64> {
        let out = comm::run_local(
            Topology::new(8, 4).unwrap(),
            |c| -> Result<_, zero::ZeroError> {
                let rank = c.rank();
                let mut e = Engine::new(cfg(), options(z.clone()), Box::new(c))?;
                let mut losses = Vec::new();
                let step = |e: &mut Engine| -> Result<f64, zero::ZeroError> {
                    let mut loss = 0.0;
                    for m in 0..2 {
                        let s = sequence(rank * 2 + m);
                        loss += e.forward_backward(&s, &s, 0.5)?;
                    }
                    let loss = e.mean_over_world(loss / 2.0)?;
                    e.step(1e-2)?;
                    Ok(loss)
                };
                for _ in 0..2 {
                    step(&mut e)?;
                }
                let state: State = e
                    .state()?
                    .into_iter()
                    .filter(|s| keep(&s.name))
                    .map(|s| (s.name, s.data))
                    .collect();
                // Restoring replaces every state of the engine, its error buffers included.
                let steps = e.step_count();
                e.restore(steps, &|n| state.get(n).cloned())?;
                for _ in 0..2 {
                    losses.push(step(&mut e)?);
                }
                Ok(losses)
            },
        )
        .unwrap();
        out[0].clone()
    };
    let straight = train(z.clone(), 4).losses[2..].to_vec();
    assert_eq!(resumed(&|_| true), straight);
    let without = resumed(&|name| !name.contains("qgz_error"));
    assert_ne!(without, straight, "the error buffers change the next steps");
    let zero3 = train(zero(false, false, false), 4).losses;
    for (a, b) in straight.iter().zip(&zero3[2..]) {
        assert!((a - b).abs() < 0.05 * b, "{a} vs ZeRO-3 {b}");
    }
    assert!(zero::QGZ_ERROR_STATES
        .iter()
        .all(|s| s.starts_with("qgz_error")));
}
