//! The world-1 engine against the model's own loss and gradients.

use candle_core::{Device, Tensor};
use model::ModelConfig;
use zero::{Engine, EngineOptions};

fn cfg() -> ModelConfig {
    ModelConfig::gpt2(2, 16, 2, 8, 37)
}

fn options(recompute: bool) -> EngineOptions {
    EngineOptions {
        total_steps: 100,
        seed: 7,
        recompute: match recompute {
            true => model::Recompute::Full,
            false => model::Recompute::Off,
        },
        ..Default::default()
    }
}

fn engine(recompute: bool) -> Engine {
    Engine::new(cfg(), options(recompute), Box::new(comm::Solo)).unwrap()
}

/// A deterministic batch of `b` sequences: (inputs, targets).
fn batch(b: usize, salt: u32) -> (Vec<u32>, Vec<u32>) {
    let c = cfg();
    let n = b * c.seq_len;
    let tok =
        |i: u32| (i.wrapping_mul(2654435761).wrapping_add(salt * 97) >> 7) % c.vocab_size as u32;
    (
        (0..n as u32).map(tok).collect(),
        (1..=n as u32).map(tok).collect(),
    )
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn gradients_equal_the_models_own() {
    let c = cfg();
    let mut e = engine(false);
    let (x, y) = batch(3, 1);
    let loss = e.forward_backward(&x, &y, 1.0).unwrap();

    let params: Vec<Tensor> = e
        .gathered_parameters()
        .unwrap()
        .into_iter()
        .map(|(_, p)| Tensor::from_vec(p.clone(), p.len(), &Device::Cpu).unwrap())
        .collect();
    let tokens = Tensor::from_slice(&x, (3, c.seq_len), &Device::Cpu).unwrap();
    let targets = Tensor::from_slice(&y, (3, c.seq_len), &Device::Cpu).unwrap();
    let (ref_loss, grads) = model::Model::new(c.clone())
        .unwrap()
        .loss_and_grads(&params, &tokens, &targets, model::Recompute::Off)
        .unwrap();
    assert!((loss - ref_loss).abs() < 1e-6, "{loss} vs {ref_loss}");
    for (u, g) in grads.iter().enumerate() {
        let g = g.to_vec1::<f32>().unwrap();
        assert!(
            max_abs_diff(&e.grad_shard(u).unwrap()[..g.len()], &g) < 1e-6,
            "unit {u}"
        );
    }
}

#[test]
fn accumulated_micro_batches_equal_one_batch() {
    let (x, y) = batch(4, 2);
    let half = x.len() / 2;
    let mut whole = engine(false);
    whole.forward_backward(&x, &y, 1.0).unwrap();
    let mut split = engine(true);
    split.forward_backward(&x[..half], &y[..half], 0.5).unwrap();
    split.forward_backward(&x[half..], &y[half..], 0.5).unwrap();
    for u in 0..whole.num_units() {
        assert!(
            max_abs_diff(&whole.grad_shard(u).unwrap(), &split.grad_shard(u).unwrap()) < 1e-6,
            "unit {u}"
        );
    }
}

#[test]
fn training_lowers_the_loss_and_restore_continues_exactly() {
    let (x, y) = batch(4, 3);
    let mut e = engine(false);
    let first = e.forward_backward(&x, &y, 1.0).unwrap();
    let stats = e.step(1e-2).unwrap();
    assert!(stats.grad_norm > 0.0);
    for _ in 0..20 {
        e.forward_backward(&x, &y, 1.0).unwrap();
        e.step(1e-2).unwrap();
    }
    let later = e.eval_loss(&x, &y).unwrap();
    assert!(later < first - 0.5, "{first} -> {later}");

    // A fresh engine restored from this one's state takes the identical next step.
    let saved: std::collections::HashMap<String, Vec<f32>> = e
        .state()
        .unwrap()
        .into_iter()
        .map(|s| (s.name, s.data))
        .collect();
    let mut r = engine(false);
    r.restore(e.step_count(), &|n| saved.get(n).cloned())
        .unwrap();
    for eng in [&mut e, &mut r] {
        eng.forward_backward(&x, &y, 1.0).unwrap();
        eng.step(1e-2).unwrap();
    }
    let (a, b) = (
        e.gathered_parameters().unwrap(),
        r.gathered_parameters().unwrap(),
    );
    for ((_, pa), (_, pb)) in a.iter().zip(&b) {
        assert_eq!(pa, pb);
    }
    assert!(
        r.restore(0, &|_| Some(vec![0.0; 3])).is_err(),
        "a shard of the wrong length is refused"
    );
}

/// `state_into` gives what `state` gives: into buffers of an earlier state (reused in place,
/// the same allocations), and into buffers that do not fit (rebuilt).
#[test]
fn state_into_reuses_the_buffers_of_an_earlier_state() {
    let (x, y) = batch(4, 3);
    let mut e = engine(false);
    let mut buffers = e.state().unwrap();
    let before: Vec<*const f32> = buffers.iter().map(|s| s.data.as_ptr()).collect();
    e.forward_backward(&x, &y, 1.0).unwrap();
    e.step(1e-2).unwrap();
    e.state_into(&mut buffers).unwrap();
    let fresh = e.state().unwrap();
    assert_eq!(buffers.len(), fresh.len());
    for ((b, f), p) in buffers.iter().zip(&fresh).zip(&before) {
        assert_eq!((&b.name, &b.data), (&f.name, &f.data));
        assert_eq!(b.data.as_ptr(), *p, "{}: not copied in place", b.name);
    }
    // Any other buffers are replaced by the state.
    let mut other = vec![zero::NamedShard {
        name: "x".into(),
        data: vec![0.0; 3],
    }];
    e.state_into(&mut other).unwrap();
    assert!(other
        .iter()
        .zip(&fresh)
        .all(|(o, f)| o.name == f.name && o.data == f.data));
    assert_eq!(other.len(), fresh.len());
}

#[test]
fn initialisation_does_not_depend_on_the_engine() {
    let a = engine(false).gathered_parameters().unwrap();
    let b = engine(true).gathered_parameters().unwrap();
    assert_eq!(
        a.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
        b.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>()
    );
}

/// A NaN weight is not an error: the loss is NaN, the backward runs, the step is skipped (the
/// step count still advances), and the state is refused for a checkpoint, naming the tensor.
#[test]
fn a_nan_weight_gives_a_nan_loss_a_skipped_step_and_no_checkpoint() {
    let mut e = engine(false);
    let (x, y) = batch(2, 3);
    let mut state = e.state().unwrap();
    state[0].data[5] = f32::NAN;
    let name = state[0].name.clone();
    let saved: std::collections::HashMap<String, Vec<f32>> =
        state.into_iter().map(|s| (s.name, s.data)).collect();
    e.restore(4, &|n| saved.get(n).cloned()).unwrap();
    let loss = e.forward_backward(&x, &y, 1.0).unwrap();
    assert!(loss.is_nan(), "{loss}");
    let stats = e.step(1e-2).unwrap();
    assert!(stats.skipped && stats.grad_norm.is_nan(), "{stats:?}");
    assert_eq!(e.step_count(), 5);
    let err = e.check_finite_state(&e.state().unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("state tensor {name} holds a non-finite value on rank 0 after step 5")
    );
}
