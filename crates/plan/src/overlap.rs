//! The overlap rule of `trainer plan --throughput`: one walk of the schedule on a compute stream
//! and one communication stream, as the engine issues it (crates/zero/src/engine/source.rs).
//!
//! A walk is a list of [`Slot`]s in the engine's order: each may wait for a gather, computes,
//! and may submit a reduction. The communication stream runs its jobs one after the other in
//! submission order (gathers and reductions share it: docs/zeropp.md, "jobs, streams and
//! overlap"). The rules, each the engine's:
//!
//! - The first gather is issued when the first slot asks for it (nothing is in flight). Each
//!   time a slot takes its gather, the gathers of the next `depth` slots that gather are issued
//!   (topped up to `depth` in flight), at the moment the compute stream has waited for the one
//!   taken: a job starts after an event recorded on the compute stream. With `depth` = 0 each
//!   gather is issued when its slot needs it.
//! - A reduction is submitted when its slot's compute ends; when more than `in_flight` are
//!   pending, the compute stream waits for the oldest ([`zero::REDUCTIONS_IN_FLIGHT`] = 2).
//! - The walk ends when every reduction has finished.
//!
//! Exposed communication is the walk's time minus its compute: the first gather, gathers that
//! outlast the compute they hide behind, reductions that hold the compute stream, and the last
//! reductions.

use std::collections::VecDeque;

/// One position of a walk, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slot {
    /// The gather this slot waits for before computing (`None`: it reads no newly gathered unit,
    /// e.g. an embedding's backward).
    pub gather_s: Option<f64>,
    /// The compute stream's work.
    pub compute_s: f64,
    /// The reduction submitted after the compute (`None`: no gradient is ready).
    pub reduce_s: Option<f64>,
}

/// The times of one walk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeline {
    /// From the first issue to the last reduction's end.
    pub end_s: f64,
    /// The sum of the slots' compute.
    pub compute_s: f64,
    /// The sum of the gathers and reductions (the communication stream's busy time).
    pub comm_s: f64,
}

/// The communication stream: jobs run one after the other, each from its submission on.
struct CommStream {
    free_at: f64,
}

impl CommStream {
    /// Runs a job of `len` seconds submitted at `at`; returns when it ends.
    fn run(&mut self, at: f64, len: f64) -> f64 {
        self.free_at = self.free_at.max(at) + len;
        self.free_at
    }
}

/// The timeline of `slots` with `depth` gathers prefetched and at most `in_flight` reductions
/// pending (see the module doc).
pub fn overlap(slots: &[Slot], depth: usize, in_flight: usize) -> Timeline {
    let gathers: Vec<f64> = slots.iter().filter_map(|s| s.gather_s).collect();
    let mut ends: Vec<f64> = Vec::with_capacity(gathers.len());
    let mut comm = CommStream { free_at: 0.0 };
    let mut reductions: VecDeque<f64> = VecDeque::new();
    let mut t = 0.0f64;
    let mut taken = 0;
    for slot in slots {
        if slot.gather_s.is_some() {
            if ends.len() == taken {
                ends.push(comm.run(t, gathers[taken]));
            }
            t = t.max(ends[taken]);
            taken += 1;
            while ends.len() - taken < depth && ends.len() < gathers.len() {
                ends.push(comm.run(t, gathers[ends.len()]));
            }
        }
        t += slot.compute_s;
        if let Some(r) = slot.reduce_s {
            reductions.push_back(comm.run(t, r));
            while reductions.len() > in_flight {
                let oldest = reductions.pop_front().expect("more than the bound pending");
                t = t.max(oldest);
            }
        }
    }
    for end in reductions {
        t = t.max(end);
    }
    Timeline {
        end_s: t,
        compute_s: slots.iter().map(|s| s.compute_s).sum(),
        comm_s: gathers.iter().sum::<f64>() + slots.iter().filter_map(|s| s.reduce_s).sum::<f64>(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forward(gathers: &[f64], computes: &[f64]) -> Vec<Slot> {
        gathers
            .iter()
            .zip(computes)
            .map(|(&g, &c)| Slot {
                gather_s: Some(g),
                compute_s: c,
                reduce_s: None,
            })
            .collect()
    }

    /// The communication the compute did not hide.
    fn exposed(t: &Timeline) -> f64 {
        t.end_s - t.compute_s
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// Gathers shorter than the compute hide behind it: only the first is exposed.
    #[test]
    fn short_gathers_hide_but_the_first() {
        let t = overlap(&forward(&[0.5; 3], &[1.0; 3]), 1, 2);
        assert!(close(t.end_s, 3.5), "{t:?}");
        assert!(close(exposed(&t), 0.5), "{t:?}");
        assert!(close(t.comm_s, 1.5), "{t:?}");
    }

    /// Without prefetch every gather is exposed.
    #[test]
    fn depth_zero_exposes_every_gather() {
        let t = overlap(&forward(&[1.0; 3], &[1.0; 3]), 0, 2);
        assert!(close(t.end_s, 6.0), "{t:?}");
        assert!(close(exposed(&t), 3.0), "{t:?}");
    }

    /// Gathers longer than the compute: the communication stream is the bottleneck, and the
    /// walk ends one compute after the last gather.
    #[test]
    fn long_gathers_are_exposed_beyond_the_compute() {
        let t = overlap(&forward(&[2.0; 3], &[1.0; 3]), 2, 2);
        // g0 0-2, g1 2-4, g2 4-6; units 2-3, 4-5, 6-7.
        assert!(close(t.end_s, 7.0), "{t:?}");
        assert!(close(exposed(&t), 4.0), "{t:?}");
    }

    /// A large third gather: depth 1 issues it when unit 1 starts (1.5, ends 3.3), depth 2
    /// when unit 0 starts (behind g1, 1.0 to 2.8).
    #[test]
    fn deeper_prefetch_hides_more_of_a_large_gather() {
        let slots = forward(&[0.5, 0.5, 1.8], &[1.0; 3]);
        let one = overlap(&slots, 1, 2);
        let two = overlap(&slots, 2, 2);
        assert!(close(one.end_s, 4.3), "{one:?}");
        assert!(close(two.end_s, 3.8), "{two:?}");
        assert!(close(exposed(&one), 1.3) && close(exposed(&two), 0.8));
    }

    /// Reductions of 2 s after computes of 1 s: the third waits for the first (at 3), and the
    /// walk ends with the last (7).
    #[test]
    fn a_third_reduction_waits_for_the_first() {
        let slots = vec![
            Slot {
                gather_s: None,
                compute_s: 1.0,
                reduce_s: Some(2.0),
            };
            3
        ];
        let t = overlap(&slots, 2, 2);
        assert!(close(t.end_s, 7.0), "{t:?}");
        // None left in flight (each waited at once): r0 1-3, r1 4-6, r2 7-9.
        assert!(close(overlap(&slots, 2, 0).end_s, 9.0));
    }

    /// A reduction queued before a prefetched gather delays it (one stream, in order).
    #[test]
    fn gathers_queue_behind_reductions() {
        let slots = vec![
            Slot {
                gather_s: Some(1.0),
                compute_s: 1.0,
                reduce_s: Some(3.0),
            },
            Slot {
                gather_s: Some(1.0),
                compute_s: 1.0,
                reduce_s: None,
            },
        ];
        // depth 0: g0 0-1, unit 1-2, r0 2-5, g1 issued at 2 runs 5-6, unit 6-7.
        assert!(close(overlap(&slots, 0, 2).end_s, 7.0));
        // depth 1: g1 issued at 1 runs 1-2, so unit 2-3; r0 2-5 ends the walk.
        assert!(close(overlap(&slots, 1, 2).end_s, 5.0));
    }
}
