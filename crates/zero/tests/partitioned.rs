//! The engine over several simulated ranks: partition-independent initialisation, the same
//! gradients as one rank, and byte counters equal to the ZeRO-3 volume formula.

use comm::{Communicator, Topology};
use model::{ModelConfig, ModelLayout};
use zero::{Engine, EngineOptions, Partition};

fn cfg() -> ModelConfig {
    ModelConfig::gpt2(2, 16, 2, 8, 37)
}

fn options() -> EngineOptions {
    EngineOptions {
        total_steps: 100,
        seed: 11,
        ..Default::default()
    }
}

/// Sequence `s` of a fixed global batch of 8.
fn sequence(s: usize) -> Vec<u32> {
    (0..cfg().seq_len as u32)
        .map(|i| (i * 5 + s as u32 * 11 + 3) % 37)
        .collect()
}

/// Runs `steps` steps with a global batch of 8 sequences at world `w` (`d` per node) and
/// returns rank 0's gathered parameters before and after, and rank 0's comm counters.
fn train(
    w: usize,
    d: usize,
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<comm::ByteCounters>) {
    let out = comm::run_local(
        Topology::new(w, d).unwrap(),
        |c| -> Result<_, zero::ZeroError> {
            let rank = c.rank();
            let mut e = Engine::new(cfg(), options(), Box::new(c))?;
            let initial: Vec<Vec<f32>> = e
                .gathered_parameters()?
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            let before = e.comm().counters();
            let per_rank = 8 / w;
            for _ in 0..steps {
                for m in 0..per_rank {
                    let s = sequence(rank * per_rank + m);
                    e.forward_backward(&s, &s, 1.0 / per_rank as f32)?;
                }
                e.step(1e-2)?;
            }
            let bytes = e.comm().counters() - before;
            let last: Vec<Vec<f32>> = e
                .gathered_parameters()?
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            Ok((initial, last, bytes))
        },
    )
    .unwrap();
    let counters = out.iter().map(|o| o.2).collect();
    let (initial, last, _) = out.into_iter().next().unwrap();
    (initial, last, counters)
}

#[test]
fn every_world_size_starts_bitwise_identical_and_trains_alike() {
    let (init1, last1, _) = train(1, 1, 3);
    for (w, d) in [(2, 2), (4, 2), (8, 4)] {
        let (init, last, _) = train(w, d, 3);
        assert_eq!(
            init, init1,
            "W={w}: initial parameters must be bitwise identical"
        );
        for (a, b) in last.iter().flatten().zip(last1.iter().flatten()) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "W={w}: {a} vs {b}");
        }
    }
}

#[test]
fn counters_equal_the_zero3_volume_exactly() {
    let (w, d) = (8, 4);
    let steps = 2;
    let (_, _, counters) = train(w, d, steps);
    let layout = ModelLayout::new(&cfg());
    let shard: u64 = layout
        .units
        .iter()
        .map(|u| Partition::new(u.numel, w, zero::MIN_ALIGN).shard_len() as u64)
        .sum();
    // Per micro-batch each unit is gathered twice and reduce-scattered once, each sending my
    // shard (fp32) to every peer; per step one f32 all-reduce (the gradient norm).
    let micro = (8 / w) as u64;
    let per_peer = steps as u64 * (3 * 4 * shard * micro + 4);
    for c in counters {
        assert_eq!(c.intra, per_peer * (d as u64 - 1));
        assert_eq!(c.inter, per_peer * (w - d) as u64);
    }
}

/// A communicator that counts the gradient reductions submitted and not yet waited, and the
/// most there ever were.
struct CountsReductions<C> {
    inner: C,
    outstanding: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<C: Communicator> Communicator for CountsReductions<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn topology(&self) -> Topology {
        self.inner.topology()
    }
    fn all_gather(
        &self,
        g: comm::Group,
        send: candle_core::Tensor,
    ) -> comm::Pending<candle_core::Tensor> {
        self.inner.all_gather(g, send)
    }
    fn all_to_all(
        &self,
        g: comm::Group,
        send: candle_core::Tensor,
    ) -> comm::Pending<candle_core::Tensor> {
        self.inner.all_to_all(g, send)
    }
    fn reduce_scatter(
        &self,
        g: comm::Group,
        send: candle_core::Tensor,
    ) -> comm::Pending<candle_core::Tensor> {
        self.inner.reduce_scatter(g, send)
    }
    fn submit(&self, job: comm::Job) -> comm::Pending<Vec<candle_core::Tensor>> {
        use std::sync::atomic::Ordering::SeqCst;
        if job.label != zero::GRADIENT_REDUCTION {
            return self.inner.submit(job);
        }
        let now = self.outstanding.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        let outstanding = self.outstanding.clone();
        self.inner.submit(job).map(move |t| {
            outstanding.fetch_sub(1, SeqCst);
            Ok(t)
        })
    }
    fn all_reduce(
        &self,
        g: comm::Group,
        buf: candle_core::Tensor,
    ) -> comm::Pending<candle_core::Tensor> {
        self.inner.all_reduce(g, buf)
    }
    fn broadcast(
        &self,
        g: comm::Group,
        root: usize,
        buf: candle_core::Tensor,
    ) -> comm::Pending<candle_core::Tensor> {
        self.inner.broadcast(g, root, buf)
    }
    fn barrier(&self, g: comm::Group) -> comm::Pending<()> {
        self.inner.barrier(g)
    }
    fn counters(&self) -> comm::ByteCounters {
        self.inner.counters()
    }
    fn abort(&self, reason: String) {
        self.inner.abort(reason)
    }
}

/// Backward keeps at most `REDUCTIONS_IN_FLIGHT` gradient reductions in flight (one more while
/// the next is issued), not one per unit: a reduction holds its unit's full gradient until it
/// is waited, so unbounded, a step held the whole model's gradient at once.
#[test]
fn backward_bounds_the_reductions_in_flight() {
    let cfg = ModelConfig {
        n_layer: 6,
        ..cfg()
    };
    let most = comm::run_local(
        Topology::new(2, 2).unwrap(),
        |c| -> Result<_, zero::ZeroError> {
            let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counting = CountsReductions {
                inner: c,
                outstanding: Default::default(),
                most: most.clone(),
            };
            let mut e = Engine::new(cfg.clone(), options(), Box::new(counting))?;
            let s = sequence(0);
            e.forward_backward(&s, &s, 1.0)?;
            Ok(most.load(std::sync::atomic::Ordering::SeqCst))
        },
    )
    .unwrap();
    assert_eq!(ModelLayout::new(&cfg).units.len(), 8);
    for m in most {
        assert_eq!(m, zero::REDUCTIONS_IN_FLIGHT + 1);
    }
}
