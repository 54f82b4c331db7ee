//! The ZeRO++ options resolved once, against the topology and the run length, into a typed plan
//! ([`ZeroPlan`]), and for each step and pass into what that pass does ([`StepPlan`]): which
//! weight gather, which secondary partition, which gradient reduction. The engine, the volume
//! formulas and `trainer plan` all read these; nothing else decides modes.

use comm::Topology;
use model::{BackwardParams, Pass};

use crate::codec::LinearLayout;
use crate::{Partition, ReduceDtype, Result, ZeroConfig, ZeroError};

/// qwZ: weights gathered as block-wise INT8 with one f32 scale per `block` elements; with
/// `fp8` (FP8 compute, [`ZeroPlan::with_linears`]), the blocks' linear weights as FP8 E4M3
/// codes in 128 x 128 tiles instead, which their FP8 layers multiply as they arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qwz {
    pub block: usize,
    pub fp8: bool,
}

/// qgZ: gradients reduced by the 2-hop INT4 all-to-all, for optimizer steps `1..=until_step`,
/// with error feedback if `error_feedback` (resolved: off with one rank, where nothing is
/// quantised).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qgz {
    pub block: usize,
    pub until_step: u64,
    pub error_feedback: bool,
}

/// Which ZeRO++ techniques a step uses, as logged in metrics.jsonl.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Techniques {
    pub qwz: bool,
    pub hpz: bool,
    pub qgz: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ZeroPlan {
    pub topology: Topology,
    pub qwz: Option<Qwz>,
    /// hpZ: a secondary partition over the ranks of each node (its size is ranks per node).
    pub hpz: bool,
    pub qgz: Option<Qgz>,
    /// Every shard is a whole number of this many elements: the quantisation blocks in use and
    /// [`MIN_ALIGN`].
    pub align: usize,
    /// Gathers kept in flight ahead of the unit computing (`zero.prefetch_depth`).
    pub prefetch_depth: usize,
    /// The dtype of the plain reduce-scatter (`zero.reduce_dtype`): the steps without qgZ.
    pub reduce_dtype: ReduceDtype,
    /// FP8 qwZ: where each unit's linear weights lie, in unit order ([`ZeroPlan::with_linears`];
    /// empty otherwise).
    fp8_units: Vec<LinearLayout>,
}

/// A unit with no linear weight to encode.
static NO_LINEARS: LinearLayout = LinearLayout::none();

/// Every shard is a multiple of this many elements, so that every rank's slot of a gathered
/// buffer starts 16-byte aligned in any dtype (the vector loads of the GPU kernels that write
/// it) and on a 256-byte boundary in f32.
pub const MIN_ALIGN: usize = 64;

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

/// The least common multiple of the quantisation blocks in use (1 with none).
fn blocks_lcm(qwz: Option<Qwz>, qgz: Option<Qgz>) -> usize {
    [qwz.map(|q| q.block), qgz.map(|q| q.block)]
        .into_iter()
        .flatten()
        .fold(1, lcm)
}

impl ZeroPlan {
    /// This plan for the units of `layout`, whose blocks' linear layers multiply in `linears`:
    /// with FP8 compute, qwZ gathers those weights as FP8 tiles ([`WeightGather::Fp8Tiles`]),
    /// and the plan keeps where they lie for the codec's sizes.
    pub fn with_linears(
        mut self,
        linears: model::LinearFormat,
        layout: &model::ModelLayout,
    ) -> Self {
        let fp8 = linears == model::LinearFormat::Fp8;
        if let Some(q) = &mut self.qwz {
            q.fp8 = fp8;
            if fp8 {
                self.fp8_units = layout.units.iter().map(LinearLayout::of).collect();
            }
        }
        self
    }

    /// Where unit `u`'s linear weights lie, for FP8 qwZ (none without it).
    pub fn linears(&self, u: usize) -> &LinearLayout {
        self.fp8_units.get(u).unwrap_or(&NO_LINEARS)
    }

    /// Resolves `cfg` for `topology` and a run of `total_steps` optimizer steps.
    ///
    /// hpZ's group is a node: `hpz_partition_size` must be 1 (off) or the ranks per node, as
    /// DeepSpeed users set it. qgZ on a single node runs its intra-node hop only (the
    /// inter-node hop has one member); that is allowed and documented, not an error.
    pub fn resolve(cfg: &ZeroConfig, topology: Topology, total_steps: u64) -> Result<Self> {
        cfg.validate()?;
        let d = topology.ranks_per_node;
        let hpz = match cfg.hpz_partition_size {
            1 => false,
            h if h == d => true,
            h => {
                return Err(ZeroError::Config {
                    key: "hpz_partition_size",
                    reason: format!("{h} is neither 1 (off) nor the {d} ranks per node"),
                })
            }
        };
        if cfg.quantized_gradients && !cfg.grad_quant_block.is_multiple_of(2) {
            return Err(ZeroError::Config {
                key: "grad_quant_block",
                reason: "INT4 packs two values a byte: use an even block".into(),
            });
        }
        let qwz = cfg.quantized_weights.then_some(Qwz {
            block: cfg.weight_quant_block,
            fp8: false,
        });
        let qgz = cfg.quantized_gradients.then(|| Qgz {
            block: cfg.grad_quant_block,
            until_step: (cfg.qgz_until * total_steps as f64).round() as u64,
            error_feedback: cfg.qgz_error_feedback && topology.world() > 1,
        });
        let align = lcm(MIN_ALIGN, blocks_lcm(qwz, qgz));
        Ok(ZeroPlan {
            topology,
            qwz,
            hpz,
            qgz,
            align,
            prefetch_depth: cfg.prefetch_depth,
            reduce_dtype: cfg.reduce_dtype,
            fp8_units: Vec::new(),
        })
    }

    /// Where a training walk's backward takes each unit's parameters: kept from the unit's
    /// forward at W = 1 with exact gathers or FP8 qwZ, gathered again otherwise. At W = 1 the
    /// exact gather hands the unit's working copy itself (nothing is held that is not held
    /// anyway; the engine keeps the copy current), and FP8 qwZ's codes are what the kept FP8
    /// weights cost anyway (a byte a weight); under FP8 compute the blocks' weights are then
    /// quantised once a walk, not once a pass ([`model::UnitParams::for_both_passes`]). A world
    /// of several ranks gathers again (ZeRO-3: a unit's full parameters exist only while it
    /// computes), and so does INT8 qwZ at W = 1, whose dequantised copy is 2 bytes a parameter.
    pub fn backward_params(&self) -> BackwardParams {
        let gather = self.step_plan(1, Pass::Train).gather;
        match (self.topology.world(), gather) {
            (1, WeightGather::Exact | WeightGather::Fp8Tiles { .. }) => BackwardParams::Kept,
            _ => BackwardParams::Regathered,
        }
    }

    /// The alignment trainers before [`MIN_ALIGN`] padded with (the quantisation blocks alone):
    /// how a checkpoint that does not record its alignment was partitioned.
    pub fn legacy_align(&self) -> usize {
        blocks_lcm(self.qwz, self.qgz)
    }

    /// How a unit of `numel` elements is padded and split over the world.
    pub fn partition(&self, numel: usize) -> Partition {
        Partition::new(numel, self.topology.world(), self.align)
    }

    /// The steps whose gradients the plain reduce-scatter reduces, in the plan's
    /// `reduce_dtype`: every step without qgZ (`None`: qgZ reduces every step of the run's
    /// `total_steps`, as resolved; `Some(s)`: steps `s..`).
    pub fn reduce_scatter_from(&self, total_steps: u64) -> Option<u64> {
        match self.qgz {
            Some(q) if q.until_step >= total_steps => None,
            Some(q) => Some(q.until_step + 1),
            None => Some(1),
        }
    }

    /// Every gradient reduction the run's training steps may use, the compressed one first:
    /// qgZ's where it is on, then the plain reduce-scatter (what [`crate::memory`] sizes for,
    /// and `trainer plan --throughput` predicts a qgZ step by).
    pub fn grad_reductions(&self) -> Vec<GradReduction> {
        let qgz = self.qgz.map(|q| GradReduction::Qgz {
            block: q.block,
            error_feedback: q.error_feedback,
        });
        let plain = GradReduction::ReduceScatter {
            dtype: self.reduce_dtype,
        };
        qgz.into_iter().chain([plain]).collect()
    }

    /// Whether optimizer step `step` (1-based) reduces its gradients with qgZ.
    pub fn qgz_active(&self, step: u64) -> bool {
        self.qgz.is_some_and(|q| step <= q.until_step)
    }

    /// The techniques of optimizer step `step`.
    pub fn techniques(&self, step: u64) -> Techniques {
        let train = self.step_plan(step, Pass::Train);
        Techniques {
            qwz: train.gather != WeightGather::Exact,
            hpz: train.secondary == SecondaryPartition::Node,
            qgz: matches!(train.reduction, Some(GradReduction::Qgz { .. })),
        }
    }

    /// What pass `pass` of optimizer step `step` (1-based) does: the one place that decides.
    ///
    /// Both passes gather weights alike (qwZ's INT8 or exact); only training keeps hpZ's
    /// secondary partition (evaluation gathers each unit once) and reduces gradients.
    pub fn step_plan(&self, step: u64, pass: Pass) -> StepPlan {
        let gather = match self.qwz {
            Some(Qwz { block, fp8: true }) => WeightGather::Fp8Tiles { block },
            Some(Qwz { block, fp8: false }) => WeightGather::Int8 { block },
            None => WeightGather::Exact,
        };
        let train = pass == Pass::Train;
        let secondary = match self.hpz && train {
            true => SecondaryPartition::Node,
            false => SecondaryPartition::None,
        };
        let reduction = train.then_some(match self.qgz {
            Some(q) if step <= q.until_step => GradReduction::Qgz {
                block: q.block,
                error_feedback: q.error_feedback,
            },
            _ => GradReduction::ReduceScatter {
                dtype: self.reduce_dtype,
            },
        });
        StepPlan {
            step,
            pass,
            gather,
            secondary,
            reduction,
        }
    }
}

/// How a unit's weights are gathered for compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightGather {
    /// The master shards cast to the compute dtype, gathered as they are.
    Exact,
    /// qwZ: block-wise INT8 codes and one f32 scale per `block` elements, dequantised after.
    Int8 { block: usize },
    /// qwZ under FP8 compute: a block's linear weights as FP8 E4M3 codes with one scale a
    /// 128 x 128 tile, which the FP8 layers read with no dequantisation; its norms and biases
    /// exact; a unit with no linear weight (embedding, final norm) as `Int8 { block }`
    /// ([`crate::codec::Fp8TileGather`]).
    Fp8Tiles { block: usize },
}

/// Where the gathers of a unit after its first in a step come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecondaryPartition {
    /// Every gather is a world gather.
    None,
    /// hpZ: the first world gather leaves each rank its node-local slice, and later gathers of
    /// the step are intra-node gathers of those slices.
    Node,
}

impl SecondaryPartition {
    /// Whether the gather at `at` comes from my node's secondary partition: hpZ's rule, the one
    /// place that states it. The engine's walk ([`crate::Engine`]), the byte counts of
    /// [`crate::volume`] and the time model of `trainer plan --throughput` all ask it.
    ///
    /// A secondary partition of these weights exists only once a walk on them has waited a
    /// world gather of its unit: in a later micro-batch of the step every gather is served by
    /// it; in the first, only a gather issued after its unit's forward gather was waited.
    pub fn serves(self, at: GatherSlot) -> bool {
        self == SecondaryPartition::Node && (!at.first_walk || (!at.forward && at.forward_waited))
    }
}

/// Where a gather sits in a training walk, as hpZ's rule ([`SecondaryPartition::serves`])
/// reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherSlot {
    /// The walk is the first on these weights (a step's first micro-batch): no secondary
    /// partition of them was kept before it.
    pub first_walk: bool,
    /// The gather is its unit's forward gather, the unit's first of the walk.
    pub forward: bool,
    /// The unit's forward gather of this walk was waited (leaving the secondary partition)
    /// before this gather was issued.
    pub forward_waited: bool,
}

impl GatherSlot {
    /// The gather at `position` of a walk's gather order whose unit's forward gather is at
    /// `forward_position` (the same position for a forward gather), with `depth` gathers
    /// prefetched. The walk issues the gather at position k once the one at k - depth was
    /// taken (those before position `depth` once the first was), so a later gather finds its
    /// unit's forward waited iff `k - depth >= forward_position`: with depth 3, GPT-2's final
    /// norm is gathered for backward (position n + 1) before its forward (n - 1) was waited.
    pub fn at(position: usize, forward_position: usize, depth: usize, first_walk: bool) -> Self {
        GatherSlot {
            first_walk,
            forward: position == forward_position,
            forward_waited: position > forward_position
                && position.saturating_sub(depth) >= forward_position,
        }
    }
}

/// How a unit's gradient is reduced into the owners' shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradReduction {
    /// A reduce-scatter over the world in `dtype` (the gradient cast to it, the reduced slice
    /// widened to f32 into the shard).
    ReduceScatter { dtype: ReduceDtype },
    /// qgZ's 2-hop INT4 all-to-all, carrying each rank's quantisation error to the next step
    /// when `error_feedback`.
    Qgz { block: usize, error_feedback: bool },
}

/// What one pass of one step does ([`ZeroPlan::step_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepPlan {
    /// The optimizer step (1-based) the pass belongs to.
    pub step: u64,
    pub pass: Pass,
    pub gather: WeightGather,
    pub secondary: SecondaryPartition,
    /// `None` in evaluation.
    pub reduction: Option<GradReduction>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> Topology {
        Topology::new(8, 4).unwrap()
    }

    #[test]
    fn hpz_must_be_off_or_a_node() {
        let cfg = |h| ZeroConfig {
            hpz_partition_size: h,
            ..Default::default()
        };
        assert!(!ZeroPlan::resolve(&cfg(1), topo(), 10).unwrap().hpz);
        assert!(ZeroPlan::resolve(&cfg(4), topo(), 10).unwrap().hpz);
        let e = ZeroPlan::resolve(&cfg(3), topo(), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hpz_partition_size"), "{e}");
    }

    #[test]
    fn qgz_schedule_covers_the_first_fraction_of_steps() {
        let cfg = ZeroConfig {
            quantized_gradients: true,
            qgz_until: 0.5,
            ..Default::default()
        };
        let plan = ZeroPlan::resolve(&cfg, topo(), 100).unwrap();
        assert!(plan.qgz_active(1) && plan.qgz_active(50));
        assert!(!plan.qgz_active(51));
        let qgz = GradReduction::Qgz {
            block: 512,
            error_feedback: false,
        };
        assert_eq!(plan.step_plan(50, Pass::Train).reduction, Some(qgz));
        assert_eq!(
            plan.step_plan(51, Pass::Train).reduction,
            Some(GradReduction::ReduceScatter {
                dtype: ReduceDtype::Fp32
            })
        );
        assert_eq!(plan.reduce_scatter_from(100), Some(51));
        let always = ZeroPlan::resolve(
            &ZeroConfig {
                qgz_until: 1.0,
                reduce_dtype: ReduceDtype::Bf16,
                ..cfg
            },
            topo(),
            100,
        )
        .unwrap();
        assert_eq!(always.reduce_scatter_from(100), None);
        assert_eq!(
            always.step_plan(101, Pass::Train).reduction,
            Some(GradReduction::ReduceScatter {
                dtype: ReduceDtype::Bf16
            })
        );
        assert_eq!(plan.step_plan(50, Pass::Eval).reduction, None);
    }

    #[test]
    fn error_feedback_is_resolved_off_at_one_rank() {
        let cfg = ZeroConfig {
            quantized_gradients: true,
            qgz_error_feedback: true,
            ..Default::default()
        };
        let one = ZeroPlan::resolve(&cfg, Topology::new(1, 1).unwrap(), 10).unwrap();
        assert!(!one.qgz.unwrap().error_feedback);
        let many = ZeroPlan::resolve(&cfg, topo(), 10).unwrap();
        assert!(many.qgz.unwrap().error_feedback);
    }

    #[test]
    fn only_training_keeps_a_secondary_partition() {
        let cfg = ZeroConfig {
            hpz_partition_size: 4,
            quantized_weights: true,
            ..Default::default()
        };
        let plan = ZeroPlan::resolve(&cfg, topo(), 10).unwrap();
        let (train, eval) = (
            plan.step_plan(1, Pass::Train),
            plan.step_plan(1, Pass::Eval),
        );
        assert_eq!(train.secondary, SecondaryPartition::Node);
        assert_eq!(eval.secondary, SecondaryPartition::None);
        assert_eq!(train.gather, WeightGather::Int8 { block: 2048 });
        assert_eq!(eval.gather, train.gather);
    }

    #[test]
    fn hpz_serves_what_a_waited_world_gather_left() {
        let node = SecondaryPartition::Node;
        // GPT-2 with 4 units: [0, 1, 2, 3, 0, 3, 2, 1]; the final norm's backward gather is at 5.
        for depth in 0..=2 {
            assert!(node.serves(GatherSlot::at(5, 3, depth, true)), "{depth}");
        }
        assert!(!node.serves(GatherSlot::at(5, 3, 3, true)));
        assert!(node.serves(GatherSlot::at(5, 3, 3, false)));
        // A forward gather: from the node only in a later micro-batch.
        assert!(!node.serves(GatherSlot::at(2, 2, 0, true)));
        assert!(node.serves(GatherSlot::at(2, 2, 0, false)));
        let none = SecondaryPartition::None;
        assert!(!none.serves(GatherSlot::at(5, 3, 0, false)));
    }

    #[test]
    fn shards_align_to_every_block_in_use() {
        let cfg = ZeroConfig {
            quantized_weights: true,
            weight_quant_block: 96,
            quantized_gradients: true,
            grad_quant_block: 64,
            ..Default::default()
        };
        let plan = ZeroPlan::resolve(&cfg, topo(), 1).unwrap();
        assert_eq!(plan.align, 192);
        assert_eq!(plan.partition(1000).shard_len() % 192, 0);
        // Without quantisation, slots still start 16-byte aligned in every dtype.
        let plain = ZeroPlan::resolve(&ZeroConfig::default(), topo(), 1).unwrap();
        assert_eq!((plain.align, plain.legacy_align()), (MIN_ALIGN, 1));
        assert_eq!(plain.partition(1000).shard_len() % MIN_ALIGN, 0);
    }
}
