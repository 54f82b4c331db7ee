//! Gradient reduction, one job on the communication side per unit ([`comm::Job`]): a
//! reduce-scatter over the world, or qgZ's 2-hop INT4 all-to-all, then the sum added into the
//! unit's fp32 gradient shard, all of it off the compute stream.
//!
//! The gradient is cast to f32 (or, for a plain reduce-scatter with `zero.reduce_dtype =
//! "bf16"`, to bf16), padded, and scaled by `coef` (the micro-batch's weight over the world
//! size) in one pass before it is reduced, so that the sum over the world is already the mean:
//! a reduced slice is taken as the new shard as it is (widened to f32 from bf16), or added into
//! the shard of the earlier micro-batches in place. The shard and the optimizer stay f32.
//!
//! What is sent is the codec's ([`GradReduction::codec`], [`crate::GradCodec::reduce`]): the
//! job gives it the gradient and the unit's codec state, and keeps the shard; qgZ's two hops and
//! its error feedback are in [`crate::qgz`].

use candle_core::{DType, Tensor};
use comm::{Communicator, Lane, Topology};
use kernels::profile::Family;

use crate::codec::{GradState, ReduceInput};
use crate::typed_job::{self, TypedPending};
use crate::{shard_passes, GradReduction, Partition, Result};

/// What a reduction job is reported as ([`comm::JobTime`]).
pub const GRADIENT_REDUCTION: &str = "gradient reduction";

/// What a reduction job returns: the unit's new fp32 gradient shard, and the unit's codec state
/// it took (qgZ's error feedback: what its quantisers dropped this time).
pub(crate) struct Reduced {
    pub shard: Tensor,
    pub state: GradState,
}

/// A reduction in flight.
pub(crate) struct InFlight {
    pub unit: usize,
    pending: TypedPending<Reduced>,
}

/// Submits the reduction of unit `unit`'s full gradient `grad` (its `numel` elements, in the
/// compute dtype), weighted by `coef`, into `acc` (the unit's fp32 gradient shard so far, or
/// `None`: a new shard), as `how` says, with the unit's codec state `state` (handed back by
/// [`finish`], as the codec left it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn submit(
    comm: &dyn Communicator,
    unit: usize,
    partition: &Partition,
    grad: &Tensor,
    acc: Option<Tensor>,
    coef: f32,
    how: GradReduction,
    state: GradState,
) -> InFlight {
    let (padded, shard) = (partition.padded, partition.shard_len());
    let topology = comm.topology();
    let outputs = match acc {
        Some(_) => vec![],
        None => vec![(DType::F32, shard)],
    };
    let mut inputs = vec![grad.clone()];
    inputs.extend(acc.clone());
    inputs.extend(how.reads(&state, padded, topology));
    let grad = grad.clone();
    let job = Reduce {
        coef,
        padded,
        how,
        topology,
    };
    let pending = typed_job::submit(
        comm,
        GRADIENT_REDUCTION,
        grad.device().clone(),
        inputs,
        outputs,
        move |lane, outputs| job.run(lane, &grad, acc.as_ref(), outputs.into_iter().next(), state),
    );
    InFlight { unit, pending }
}

/// Waits for a reduction: its unit and what it returned.
pub(crate) fn finish(r: InFlight) -> Result<(usize, Reduced)> {
    Ok((r.unit, r.pending.wait()?))
}

/// A reduction job's settings.
struct Reduce {
    coef: f32,
    padded: usize,
    how: GradReduction,
    topology: Topology,
}

impl Reduce {
    /// The new shard (`out`, or `acc` added into), and the state as the codec left it.
    fn run(
        &self,
        lane: &mut dyn Lane,
        grad: &Tensor,
        acc: Option<&Tensor>,
        out: Option<Tensor>,
        mut state: GradState,
    ) -> Result<Reduced> {
        let place = lane.place().clone();
        // Profile spans time the compute stream: they record only where the job runs there.
        let span = |family| place.scope(grad.device(), family);
        let input = ReduceInput {
            grad,
            coef: self.coef,
            padded: self.padded,
            topology: self.topology,
            out,
        };
        let sum = if self.topology.world() == 1 {
            // Nothing to reduce: the scaled, padded gradient is the shard.
            let t = input.target(lane)?;
            let _span = span(Family::ShardPasses);
            shard_passes::scale_pad_into(&place, grad, self.coef, &t)?;
            t
        } else {
            self.how.codec().reduce(lane, &input, &mut state)?
        };
        let shard = match acc {
            None => sum,
            Some(acc) => {
                let _span = span(Family::ShardPasses);
                shard_passes::add_into(&place, acc, &sum)?;
                acc.clone()
            }
        };
        Ok(Reduced { shard, state })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReduceDtype;

    const BLOCK: usize = 16;
    const SHARD: usize = 4 * BLOCK;

    /// Rank r's gradient: W x SHARD values of mixed sign and magnitude.
    fn gradient(r: usize, w: usize) -> Vec<f32> {
        (0..w * SHARD)
            .map(|i| (((i * 37 + r * 101) % 97) as f32 - 48.0) * 0.01 * (1.0 + (i % 5) as f32))
            .collect()
    }

    /// Each rank's reduced slice of the world mean by qgZ, and by the plain reduce-scatter.
    fn reduce_both(
        topology: Topology,
        grad: impl Fn(usize) -> Vec<f32> + Sync,
    ) -> Vec<(Vec<f32>, Vec<f32>)> {
        let q = GradReduction::Qgz {
            block: BLOCK,
            error_feedback: false,
        };
        let w = topology.world();
        let partition = Partition::new(w * SHARD, w, BLOCK);
        let coef = 1.0 / w as f32;
        comm::run_local(topology, |c| -> crate::Result<_> {
            let g = grad(c.rank());
            let g = Tensor::from_vec(g.clone(), g.len(), &candle_core::Device::Cpu)?;
            let quantised = finish(submit(
                &c,
                0,
                &partition,
                &g,
                None,
                coef,
                q,
                GradState::default(),
            ))?
            .1
            .shard;
            let plain = finish(submit(
                &c,
                0,
                &partition,
                &g,
                None,
                coef,
                GradReduction::ReduceScatter {
                    dtype: ReduceDtype::Fp32,
                },
                GradState::default(),
            ))?
            .1
            .shard;
            Ok((quantised.to_vec1::<f32>()?, plain.to_vec1::<f32>()?))
        })
        .unwrap()
    }

    #[test]
    fn two_hop_mean_is_within_the_int4_bound_of_the_exact_mean() {
        for (w, d) in [(8, 4), (6, 2), (4, 1)] {
            let topology = Topology::new(w, d).unwrap();
            let nodes = topology.nodes;
            let out = reduce_both(topology, |r| gradient(r, w));
            // Hop 1: each rank's value is off by at most half its block's step (absmax / 7 / 2);
            // the node sums are then requantised with steps at most (node absmax + hop-1 error) / 7.
            // The values are pre-scaled by 1/W (exact: W's here are not all powers of two, so
            // the bound is taken on the scaled values).
            let a = (0..w)
                .flat_map(|r| gradient(r, w))
                .fold(0.0f32, |m, v| m.max(v.abs()))
                / w as f32;
            let hop1 = a / 14.0;
            let hop2 = (d as f32 * (a + hop1)) / 14.0;
            let bound = (w as f32 * hop1 + nodes as f32 * hop2) * 1.0001;
            for (rank, (q, exact)) in out.iter().enumerate() {
                let expected: Vec<f32> = (0..SHARD)
                    .map(|i| {
                        (0..w)
                            .map(|r| gradient(r, w)[rank * SHARD + i])
                            .sum::<f32>()
                            / w as f32
                    })
                    .collect();
                for i in 0..SHARD {
                    assert!((exact[i] - expected[i]).abs() < 1e-5);
                    assert!(
                        (q[i] - expected[i]).abs() <= bound,
                        "W={w} rank {rank} element {i}: {} vs {}",
                        q[i],
                        expected[i]
                    );
                }
            }
        }
    }

    #[test]
    fn a_constant_gradient_reduces_exactly_to_the_reduce_scatter_scale() {
        // 0.875 = 7/8 and W = 8: every value and partial sum is exact in INT4.
        let out = reduce_both(Topology::new(8, 4).unwrap(), |_| vec![0.875; 8 * SHARD]);
        for (q, plain) in out {
            assert!(
                q.iter().all(|&v| v == 0.875),
                "a mean over nodes only would give 3.5: {q:?}"
            );
            assert_eq!(q, plain);
        }
    }

    /// One rank's last reduced slice, its slices summed over the steps, and its error-feedback
    /// buffers (the first hop's, and the second's where it has one).
    type RankRounds = (Vec<f32>, Vec<f32>, Option<(Vec<f32>, Option<Vec<f32>>)>);

    /// Every rank's reduced slice and error-feedback buffers after `steps` reductions of the same
    /// gradients with qgZ (error feedback `feedback`), and the slices summed over the steps.
    fn qgz_rounds(topology: Topology, steps: usize, feedback: bool) -> Vec<RankRounds> {
        let q = GradReduction::Qgz {
            block: BLOCK,
            error_feedback: feedback,
        };
        let w = topology.world();
        let partition = Partition::new(w * SHARD, w, BLOCK);
        let coef = 1.0 / w as f32;
        comm::run_local(topology, |c| -> crate::Result<_> {
            let g = gradient(c.rank(), w);
            let g = Tensor::from_vec(g.clone(), g.len(), &candle_core::Device::Cpu)?;
            let mut state = q.codec().new_state(partition.padded, topology);
            let (mut last, mut total) = (vec![], vec![0.0f32; SHARD]);
            for _ in 0..steps {
                let r = submit(&c, 0, &partition, &g, None, coef, q, state);
                let (_, Reduced { shard, state: s }) = finish(r)?;
                last = shard.to_vec1::<f32>()?;
                total.iter_mut().zip(&last).for_each(|(t, v)| *t += v);
                state = s;
            }
            let [hop1, hop2] = crate::QGZ_ERROR_STATES;
            let read = |name| state.get(name).map(|t| t.to_vec1::<f32>()).transpose();
            let error = read(hop1)?
                .map(|h1| read(hop2).map(|h2| (h1, h2)))
                .transpose()?;
            Ok((last, total, error))
        })
        .unwrap()
    }

    /// The world mean of slice `p` of every rank's gradient, element by element.
    fn exact_mean(w: usize, p: usize) -> Vec<f32> {
        (0..SHARD)
            .map(|i| {
                (0..w)
                    .map(|r| gradient(r, w)[p * SHARD + i] / w as f32)
                    .sum()
            })
            .collect()
    }

    /// Error feedback loses nothing: what each rank's two quantisers dropped, added back to the
    /// reduced slice, gives the exact mean (up to f32 rounding): slice p = n0 x D + d0 was
    /// quantised by every rank at its swizzled position (p % D) x N + p / D, and requantised
    /// inside each node n by local rank d0, as the node sum's slice n0.
    #[test]
    fn the_errors_kept_are_what_the_quantisers_dropped() {
        let (w, d) = (8, 2);
        let topology = Topology::new(w, d).unwrap();
        let n = topology.nodes;
        let out = qgz_rounds(topology, 1, true);
        for (p, (reduced, _, _)) in out.iter().enumerate() {
            let (n0, d0) = (p / d, p % d);
            let pos = (p % d) * n + p / d;
            let exact = exact_mean(w, p);
            for i in 0..SHARD {
                let mut restored = reduced[i];
                for (hop1, _) in out.iter().filter_map(|o| o.2.as_ref()) {
                    restored += hop1[pos * SHARD + i];
                }
                for node in 0..n {
                    let hop2 = out[node * d + d0].2.as_ref().unwrap().1.as_ref().unwrap();
                    restored += hop2[n0 * SHARD + i];
                }
                assert!(
                    (restored - exact[i]).abs() <= 1e-5 * (1.0 + exact[i].abs()),
                    "slice {p} element {i}: {restored} vs {}",
                    exact[i]
                );
                assert_ne!(
                    reduced[i], exact[i],
                    "the INT4 reduction is exact here: no test"
                );
            }
        }
        // No error yet: the first hop's codes are those of the fused swizzle, so the reduced
        // slices equal qgZ's without feedback wherever one rank a node requantises nothing.
        let one = Topology::new(4, 1).unwrap();
        let (with, without) = (qgz_rounds(one, 1, true), qgz_rounds(one, 1, false));
        for (a, b) in with.iter().zip(&without) {
            assert_eq!(a.0, b.0);
            assert!(a.2.as_ref().is_some_and(|e| e.1.is_none()) && b.2.is_none());
        }
    }

    /// The mean of many reductions of the same gradients: with error feedback it converges to the
    /// exact mean (the errors telescope, so it is off by at most one round's error over the
    /// rounds); without, qgZ's rounding stays as a bias.
    #[test]
    fn with_feedback_the_average_reduction_converges_where_a_bias_stays() {
        let (w, steps) = (8, 64);
        let topology = Topology::new(w, 2).unwrap();
        let (with, without) = (
            qgz_rounds(topology, steps, true),
            qgz_rounds(topology, steps, false),
        );
        let (mut worst_with, mut worst_without) = (0.0f32, 0.0f32);
        for p in 0..w {
            let exact = exact_mean(w, p);
            for (i, &e) in exact.iter().enumerate().take(SHARD) {
                worst_with = worst_with.max((with[p].1[i] / steps as f32 - e).abs());
                worst_without = worst_without.max((without[p].1[i] / steps as f32 - e).abs());
            }
        }
        assert!(
            worst_without > 1e-3,
            "qgZ without feedback has a bias: {worst_without}"
        );
        assert!(
            worst_with < worst_without / 20.0,
            "with feedback {worst_with}, without {worst_without}"
        );
    }

    #[test]
    fn a_second_micro_batch_adds_into_the_shard() {
        let topology = Topology::new(4, 2).unwrap();
        let partition = Partition::new(4 * SHARD, 4, BLOCK);
        let out = comm::run_local(topology, |c| -> crate::Result<_> {
            let g = gradient(c.rank(), 4);
            let g = Tensor::from_vec(g.clone(), g.len(), &candle_core::Device::Cpu)?;
            let plain = GradReduction::ReduceScatter {
                dtype: ReduceDtype::Fp32,
            };
            let first = finish(submit(
                &c,
                0,
                &partition,
                &g,
                None,
                0.125,
                plain,
                GradState::default(),
            ))?
            .1
            .shard;
            let once = first.to_vec1::<f32>()?;
            let twice = finish(submit(
                &c,
                0,
                &partition,
                &g,
                Some(first),
                0.125,
                plain,
                GradState::default(),
            ))?
            .1
            .shard;
            Ok((once, twice.to_vec1::<f32>()?))
        })
        .unwrap();
        for (once, twice) in out {
            for (a, b) in once.iter().zip(&twice) {
                assert_eq!(a + a, *b);
            }
        }
    }
}
