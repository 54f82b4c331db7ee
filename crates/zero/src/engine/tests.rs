//! The divergence policy of [`Engine::step`]: a non-finite gradient norm (or a rank's
//! non-finite loss) skips the step on every rank alike and changes no state, on one rank and
//! over 2 nodes x 2 ranks, with plain ZeRO-3 and with ZeRO++ (a NaN survives qgZ's two hops).

use std::collections::VecDeque;

use candle_core::{Device, Tensor};
use comm::Topology;

use super::*;

fn cfg() -> ModelConfig {
    ModelConfig::gpt2(2, 16, 2, 8, 37)
}

fn zero(zeropp: bool) -> ZeroConfig {
    ZeroConfig {
        quantized_weights: zeropp,
        hpz_partition_size: if zeropp { 2 } else { 1 },
        quantized_gradients: zeropp,
        weight_quant_block: 64,
        grad_quant_block: 32,
        ..Default::default()
    }
}

fn engine(z: ZeroConfig, comm: Box<dyn Communicator>) -> Result<Engine> {
    let opts = EngineOptions {
        zero: z,
        total_steps: 10,
        seed: 3,
        ..Default::default()
    };
    Engine::new(cfg(), opts, comm)
}

fn sequence(s: usize) -> Vec<u32> {
    (0..8u32)
        .map(|i| (i * 5 + s as u32 * 11 + 2) % 37)
        .collect()
}

/// Every state value's bits, in [`Engine::state`] order.
fn state_bits(e: &Engine) -> Result<Vec<Vec<u32>>> {
    Ok(e.state()?
        .into_iter()
        .map(|s| s.data.iter().map(|v| v.to_bits()).collect())
        .collect())
}

/// Sets element `i` of unit `u`'s gradient shard to NaN.
fn poison_grad(e: &mut Engine, u: usize, i: usize) -> Result<()> {
    let mut g = e.grad_shard(u)?;
    g[i] = f32::NAN;
    let n = g.len();
    e.units[u].grad = Some(GradShard::f32(Tensor::from_vec(g, n, &Device::Cpu)?));
    Ok(())
}

#[test]
fn a_nan_gradient_skips_the_step_and_changes_no_state() {
    let mut e = engine(zero(false), Box::new(comm::Solo)).unwrap();
    let s = sequence(0);
    // One normal step first, so the moments are nonzero.
    e.forward_backward(&s, &s, 1.0).unwrap();
    assert!(!e.step(1e-2).unwrap().skipped);
    let before = state_bits(&e).unwrap();
    e.forward_backward(&s, &s, 1.0).unwrap();
    poison_grad(&mut e, 1, 3).unwrap();
    let stats = e.step(1e-2).unwrap();
    assert!(stats.skipped && stats.grad_norm.is_nan(), "{stats:?}");
    assert_eq!(
        state_bits(&e).unwrap(),
        before,
        "master and moments untouched"
    );
    assert_eq!(e.step_count(), 2, "the step count is the training step");
    assert!(
        e.units.iter().all(|u| u.grad.is_none()),
        "gradients dropped"
    );
    // The next finite step trains again.
    e.forward_backward(&s, &s, 1.0).unwrap();
    let stats = e.step(1e-2).unwrap();
    assert!(!stats.skipped && stats.grad_norm.is_finite());
    assert_ne!(state_bits(&e).unwrap(), before);
}

/// Rank `bad` poisons its shard of unit `u` (or, with `loss`, only flags a non-finite loss
/// while its gradient stays finite): every rank of 2 nodes x 2 skips, its state bitwise
/// unchanged and its hpZ secondaries dropped. Returns each rank's stats.
fn skip_over_two_nodes(z: ZeroConfig, bad: usize, u: usize, loss: bool) -> Vec<StepStats> {
    comm::run_local(Topology::new(4, 2).unwrap(), |c| -> Result<_> {
        let rank = c.rank();
        let mut e = engine(z.clone(), Box::new(c))?;
        let s = sequence(rank);
        e.forward_backward(&s, &s, 1.0)?;
        e.step(1e-2)?;
        let before = state_bits(&e)?;
        e.forward_backward(&s, &s, 1.0)?;
        if rank == bad {
            if loss {
                e.non_finite_loss = true;
            } else {
                poison_grad(&mut e, u, 0)?;
            }
        }
        let stats = e.step(1e-2)?;
        assert_eq!(state_bits(&e)?, before, "rank {rank}");
        let weights = e.weights;
        assert!(
            e.units.iter().all(|u| u
                .secondary
                .as_ref()
                .is_none_or(|s| s.serve(weights).is_none())),
            "no secondary partition serves the next step"
        );
        Ok(stats)
    })
    .unwrap()
}

#[test]
fn every_rank_skips_alike_over_two_nodes() {
    for zeropp in [false, true] {
        for (bad, u, loss) in [(1, 0, false), (2, 3, false), (3, 0, true)] {
            let stats = skip_over_two_nodes(zero(zeropp), bad, u, loss);
            for (rank, s) in stats.iter().enumerate() {
                assert!(
                    s.skipped && !s.grad_norm.is_finite(),
                    "ZeRO++ {zeropp}, bad rank {bad}: rank {rank} {s:?}"
                );
            }
        }
    }
}

/// qgZ with a NaN in one rank's full gradient, before any reduction: the block holding it stays
/// NaN through both hops on the rank that owns it (every other block and rank stays finite),
/// the norm is NaN everywhere, and every rank skips.
#[test]
fn a_nan_gradient_on_one_rank_survives_qgz_and_every_rank_skips() {
    const BAD_RANK: usize = 2;
    let out = comm::run_local(Topology::new(4, 2).unwrap(), |c| -> Result<_> {
        let rank = c.rank();
        let mut e = engine(zero(true), Box::new(c))?;
        assert!(e.plan.qgz.is_some());
        let u = 1;
        let numel = e.units[u].layout.numel;
        let shard = e.units[u].partition.shard_len();
        // Element `at` lies in rank 1's shard, in its second quantisation block.
        let at = shard + 40;
        let mut g: Vec<f32> = (0..numel)
            .map(|i| ((i * 7 + rank * 3) % 23) as f32 * 0.01 - 0.1)
            .collect();
        if rank == BAD_RANK {
            g[at] = f32::NAN;
        }
        let g = Tensor::from_vec(g, numel, &Device::Cpu)?;
        let before = state_bits(&e)?;
        {
            let step = e.plan.step_plan(1, Pass::Train);
            let parts = Parts {
                comm: e.comm.as_ref(),
                opts: &e.opts,
                plan: &e.plan,
                weights: e.weights,
                first_walk: true,
            };
            let shards = Shards::Train {
                units: &mut e.units,
                reductions: VecDeque::new(),
                grad_scale: 1.0,
            };
            let mut source = Source::new(parts, step, shards, vec![], 0, 0);
            model::UnitSource::grad(&mut source, u, g)?;
            source.finish_reductions()?;
        }
        let reduced = e.grad_shard(u)?;
        let stats = e.step(1e-2)?;
        assert_eq!(state_bits(&e)?, before, "rank {rank}");
        Ok((reduced, stats))
    })
    .unwrap();
    for (rank, (reduced, stats)) in out.iter().enumerate() {
        assert!(stats.skipped && stats.grad_norm.is_nan(), "rank {rank}");
        for (b, block) in reduced.chunks(32).enumerate() {
            if rank == 1 && b == 1 {
                assert!(block.iter().all(|v| v.is_nan()), "{block:?}");
            } else {
                assert!(block.iter().all(|v| v.is_finite()), "rank {rank} block {b}");
            }
        }
    }
}

/// A non-finite value in one rank's state to checkpoint fails [`Engine::check_finite_state`] on
/// every rank, with the same error naming the first such tensor and the lowest rank holding it.
#[test]
fn a_non_finite_state_on_one_rank_is_refused_on_every_rank() {
    let out = comm::run_local(Topology::new(4, 2).unwrap(), |c| -> Result<_> {
        let rank = c.rank();
        let e = engine(zero(false), Box::new(c))?;
        let mut state = e.state()?;
        e.check_finite_state(&state)?;
        // Ranks 1 and 3 spoil tensors 7 and 4 (rank 3's comes first in state order).
        if rank == 1 {
            state[7].data[2] = f32::NAN;
        }
        if rank == 3 {
            state[4].data[0] = f32::INFINITY;
        }
        Ok((
            state[4].name.clone(),
            e.check_finite_state(&state).map_err(|e| e.to_string()),
        ))
    })
    .unwrap();
    for (name, result) in out {
        let e = result.unwrap_err();
        assert_eq!(
            e,
            format!("state tensor {name} holds a non-finite value on rank 3 after step 0")
        );
    }
}

/// With a bf16 compute dtype the optimizer writes each shard's working copy, bit for bit the
/// master cast to bf16 (so the gathers that read it instead of casting build the same buffers),
/// stamped with the new weights; a skipped step or a checkpoint load makes it refuse, and the
/// gathers cast the master again. Training with it gives the same losses on 1 rank and on 2 x 2
/// whether the copies serve or not (the second run refuses them by loading its own state back
/// before each step).
#[test]
fn the_working_copy_is_the_cast_master_and_refuses_other_weights() {
    let bf16 = |z: ZeroConfig, comm: Box<dyn Communicator>| {
        let opts = EngineOptions {
            zero: z,
            total_steps: 10,
            seed: 3,
            compute_dtype: DType::BF16,
            ..Default::default()
        };
        Engine::new(cfg(), opts, comm)
    };
    let cast_bits = |t: &Tensor| -> Vec<u16> {
        t.to_dtype(DType::BF16)
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .unwrap()
            .iter()
            .map(|v| (v.to_bits() >> 16) as u16)
            .collect()
    };
    let serving = |e: &Engine| {
        e.units
            .iter()
            .filter(|u| {
                u.working
                    .as_ref()
                    .and_then(|w| w.serve(e.weights))
                    .is_some()
            })
            .count()
    };
    let mut e = bf16(zero(false), Box::new(comm::Solo)).unwrap();
    let s = sequence(0);
    assert_eq!(serving(&e), 0, "no copy before the first step");
    e.forward_backward(&s, &s, 1.0).unwrap();
    assert!(!e.step(1e-2).unwrap().skipped);
    assert_eq!(serving(&e), e.units.len(), "every unit's copy serves");
    for u in &e.units {
        let w = u.working.as_ref().and_then(|w| w.serve(e.weights)).unwrap();
        assert_eq!(w.dtype(), DType::BF16);
        assert_eq!(cast_bits(w), cast_bits(&u.master), "{}", u.layout.name);
    }
    // A skipped step makes new weights: the copies refuse.
    e.forward_backward(&s, &s, 1.0).unwrap();
    poison_grad(&mut e, 1, 0).unwrap();
    assert!(e.step(1e-2).unwrap().skipped);
    assert_eq!(serving(&e), 0, "copies of the weights before a skip refuse");

    // Losses with the copies serving, and with them refused before every step.
    let losses = |refuse: bool, c: Box<dyn Communicator>, rank: usize| -> Result<Vec<u64>> {
        let z = ZeroConfig {
            quantized_weights: false,
            ..zero(false)
        };
        let mut e = bf16(z, c)?;
        let mut out = Vec::new();
        for step in 0..4 {
            if refuse {
                let state = e.state()?;
                let lookup = |name: &str| {
                    state
                        .iter()
                        .find(|s| s.name == name)
                        .map(|s| s.data.clone())
                };
                e.restore(e.step_count(), &lookup)?;
                assert_eq!(serving(&e), 0);
            }
            let s = sequence(rank + step);
            out.push(e.forward_backward(&s, &s, 1.0)?.to_bits());
            e.step(1e-2)?;
        }
        Ok(out)
    };
    assert_eq!(
        losses(false, Box::new(comm::Solo), 0).unwrap(),
        losses(true, Box::new(comm::Solo), 0).unwrap(),
        "one rank"
    );
    let world = |refuse: bool| {
        comm::run_local(Topology::new(4, 2).unwrap(), move |c| {
            let rank = c.rank();
            losses(refuse, Box::new(c), rank)
        })
        .unwrap()
    };
    assert_eq!(world(false), world(true), "2 x 2");
}
