//! An emulated slow link between nodes: a documented rate limit for benchmarks, so one host's
//! GPUs can show the low-bandwidth regime of the ZeRO++ paper (nodes joined by one 100 Gb/s
//! InfiniBand link, shared by the node's 16 GPUs).
//!
//! The NCCL backend (`NcclComm::set_emulated_link`) holds its communication stream, just before
//! each collective, for the time this rank's cross-node bytes of that collective would take on
//! its share of the node's link: `cross-node bytes / (link rate / ranks per node)`. The data
//! itself still moves on the host's fast path; the hold is added to it, on the same stream, so
//! compute that waits for the collective waits for the emulated transfer too, and the overlap
//! of communication with compute behaves as on a slow network. Bytes are the logical bytes the
//! counters count (docs/design.md section 3), so intra-node traffic (hpZ's gathers, qgZ's hop 1)
//! is not held.

use std::time::Duration;

use crate::{CommError, Result};

/// One rank's share of its node's emulated link to the other nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmulatedLink {
    /// Bytes a second this rank may send across nodes.
    rank_bytes_per_s: f64,
}

impl EmulatedLink {
    /// A node link of `gbit_per_s` gigabits a second shared by the node's `ranks_per_node`
    /// ranks. Errors unless the rate is finite and positive.
    pub fn per_node(gbit_per_s: f64, ranks_per_node: usize) -> Result<EmulatedLink> {
        if !(gbit_per_s.is_finite() && gbit_per_s > 0.0) || ranks_per_node == 0 {
            return Err(CommError::BadLink {
                gbit_per_s,
                ranks_per_node,
            });
        }
        Ok(EmulatedLink {
            rank_bytes_per_s: gbit_per_s * 1e9 / 8.0 / ranks_per_node as f64,
        })
    }

    /// This rank's share, in bytes a second.
    pub fn rank_bytes_per_s(&self) -> f64 {
        self.rank_bytes_per_s
    }

    /// How long `cross_node_bytes` occupy this rank's share of the link.
    pub fn hold(&self, cross_node_bytes: u64) -> Duration {
        Duration::from_secs_f64(cross_node_bytes as f64 / self.rank_bytes_per_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_link_is_shared_by_its_ranks() {
        // 100 Gb/s = 12.5 GB/s a node; 4 ranks a node get 3.125 GB/s each.
        let link = EmulatedLink::per_node(100.0, 4).unwrap();
        assert_eq!(link.rank_bytes_per_s(), 3.125e9);
        assert_eq!(link.hold(3_125_000_000), Duration::from_secs(1));
        assert_eq!(link.hold(0), Duration::ZERO);
    }

    #[test]
    fn bad_rates_are_errors() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = EmulatedLink::per_node(rate, 4).unwrap_err().to_string();
            assert!(e.contains("finite and positive"), "{e}");
        }
        assert!(EmulatedLink::per_node(100.0, 0).is_err());
    }
}
