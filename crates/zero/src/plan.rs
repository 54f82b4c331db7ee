//! The ZeRO++ options resolved once, against the topology and the run length, into a typed plan.
//! The engine, the volume formulas and `trainer plan` all read this; nothing else decides modes.

use comm::Topology;

use crate::{Partition, Result, ZeroConfig, ZeroError};

/// qwZ: weights gathered as block-wise INT8 with one f32 scale per `block` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qwz {
    pub block: usize,
}

/// qgZ: gradients reduced by the 2-hop INT4 all-to-all, for optimizer steps `1..=until_step`,
/// with error feedback if `error_feedback`.
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
}

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
        });
        let qgz = cfg.quantized_gradients.then(|| Qgz {
            block: cfg.grad_quant_block,
            until_step: (cfg.qgz_until * total_steps as f64).round() as u64,
            error_feedback: cfg.qgz_error_feedback,
        });
        let align = lcm(MIN_ALIGN, blocks_lcm(qwz, qgz));
        Ok(ZeroPlan {
            topology,
            qwz,
            hpz,
            qgz,
            align,
            prefetch_depth: cfg.prefetch_depth,
        })
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

    /// Whether optimizer step `step` (1-based) reduces its gradients with qgZ.
    pub fn qgz_active(&self, step: u64) -> bool {
        self.qgz.is_some_and(|q| step <= q.until_step)
    }

    /// The techniques of optimizer step `step`.
    pub fn techniques(&self, step: u64) -> Techniques {
        Techniques {
            qwz: self.qwz.is_some(),
            hpz: self.hpz,
            qgz: self.qgz_active(step),
        }
    }
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
