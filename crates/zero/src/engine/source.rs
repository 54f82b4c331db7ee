//! The engine as the model's [`UnitSource`]: each request for a unit's parameters is the next
//! gather of the walk's order (kept up to the prefetch depth ahead), each gradient handed back
//! is submitted for reduction (at most [`REDUCTIONS_IN_FLIGHT`] left in flight), all as the
//! step's [`StepPlan`] says.

use std::collections::VecDeque;

use candle_core::Tensor;
use comm::Communicator;
use kernels::place::Place;
use kernels::profile::{scope, Family};
use model::{UnitParams, UnitSource};

use super::{EngineOptions, UnitShard, REDUCTIONS_IN_FLIGHT};
use crate::gather::{self, GatherQueue};
use crate::reduce::{self, Reduced};
use crate::{GatherSlot, GradShard, Result, SecondaryPartition, StepPlan, ZeroError, ZeroPlan};

/// The engine's parts a walk borrows besides its shards.
pub(super) struct Parts<'a> {
    pub comm: &'a dyn Communicator,
    pub opts: &'a EngineOptions,
    pub plan: &'a ZeroPlan,
    /// The weights version secondary partitions are stamped with and served for.
    pub weights: u64,
    /// The walk is the first training walk on these weights (hpZ's rule:
    /// [`crate::GatherSlot`]).
    pub first_walk: bool,
}

/// The shards a walk reads (evaluation) or also writes (training: gradients, the gradient
/// codecs' state, hpZ's secondary partitions).
pub(super) enum Shards<'a> {
    Read(&'a [UnitShard]),
    Train {
        units: &'a mut [UnitShard],
        reductions: VecDeque<reduce::InFlight>,
        /// The micro-batch's weight in the step's gradient.
        grad_scale: f32,
    },
}

impl Shards<'_> {
    fn unit(&self, u: usize) -> &UnitShard {
        match self {
            Shards::Read(units) => &units[u],
            Shards::Train { units, .. } => &units[u],
        }
    }
}

/// One walk's gathers and reductions.
pub(super) struct Source<'a> {
    parts: Parts<'a>,
    step: StepPlan,
    shards: Shards<'a>,
    gathers: GatherQueue,
}

impl<'a> Source<'a> {
    /// A walk of `step` gathering `order` (its first `forward` gathers are the forward pass's)
    /// with `depth` gathers in flight ahead.
    pub(super) fn new(
        parts: Parts<'a>,
        step: StepPlan,
        shards: Shards<'a>,
        order: Vec<usize>,
        depth: usize,
        forward: usize,
    ) -> Self {
        Source {
            parts,
            step,
            shards,
            gathers: GatherQueue::new(order, depth, forward),
        }
    }

    /// Issues the next gather of the order: from my node's secondary partition where the step
    /// keeps them and one of these weights is at hand, else from the world.
    fn issue_gather(&mut self) {
        let Some(issue) = self.gathers.next_to_issue() else {
            return;
        };
        let (u, label) = (issue.unit, issue.label);
        let Parts {
            comm,
            opts,
            plan,
            weights,
            first_walk,
        } = self.parts;
        let unit = self.shards.unit(u);
        let topology = plan.topology;
        let rank = comm.rank();
        let node = self.step.secondary == SecondaryPartition::Node;
        let depth = self.gathers.depth();
        let slot = GatherSlot::at(issue.position, issue.forward_position, depth, first_walk);
        let source = match self.step.secondary.serves(slot) {
            // A walk on these weights that failed part-way left some units none: those gather
            // from the world, as a secondary partition of other weights makes them do.
            true => unit.secondary.as_ref().and_then(|s| s.serve(weights)),
            false => None,
        };
        let spec = gather::Spec {
            unit: u,
            partition: unit.partition.clone(),
            gather: self.step.gather,
            dtype: opts.compute_dtype,
            device: opts.device.clone(),
            rank,
            local: topology.local_rank(rank),
            ranks_per_node: topology.ranks_per_node,
            keep: node.then_some(weights),
            label,
            linears: unit.linears.clone(),
        };
        let working = unit.working.as_ref().and_then(|w| w.serve(weights));
        let flight = gather::submit(comm, spec, &unit.master, working, source);
        self.gathers.push(flight);
    }

    /// The gathered unit `expected` (the next in the order); then tops the gathers in flight up
    /// to the queue's depth.
    pub(super) fn next_gather(&mut self, expected: usize) -> Result<UnitParams> {
        if self.gathers.in_flight() == 0 {
            self.issue_gather();
        }
        let flight = self.gathers.pop().expect("a gather was just issued");
        assert_eq!(
            flight.unit, expected,
            "units must be taken in the gather order"
        );
        let gathered = {
            let _span = scope(&self.parts.opts.device, Family::Communication);
            gather::finish(flight)?
        };
        if let (Some(s), Shards::Train { units, .. }) = (gathered.secondary, &mut self.shards) {
            units[expected].secondary = Some(s);
        }
        while self.gathers.in_flight() < self.gathers.depth() {
            let before = self.gathers.in_flight();
            self.issue_gather();
            if self.gathers.in_flight() == before {
                break;
            }
        }
        Ok(gathered.full)
    }

    /// Submits the reduction of unit `u`'s full gradient, weighted by the micro-batch's scale
    /// over W into its shard; then finishes the oldest reductions beyond
    /// [`REDUCTIONS_IN_FLIGHT`].
    fn start_reduce(&mut self, u: usize, grad: &Tensor) -> Result<()> {
        let how = self.step.reduction.ok_or(ZeroError::NotTraining)?;
        let Shards::Train {
            units,
            reductions,
            grad_scale,
        } = &mut self.shards
        else {
            return Err(ZeroError::NotTraining);
        };
        let unit = &mut units[u];
        let coef = *grad_scale / unit.partition.world as f32;
        let world = unit.partition.world;
        if world == 1 && unit.grad.is_none() && grad.rank() == 1 && grad.is_contiguous() {
            // Nothing to reduce, nothing to add to: the gradient as the backward wrote it, and
            // its weight, are the shard (read where it is by the norm and AdamW).
            unit.grad = Some(GradShard::scaled(grad.clone(), coef));
            return Ok(());
        }
        // A shard kept as the backward wrote it becomes the padded f32 shard to add into.
        let shard = unit.partition.shard_len();
        let acc = match unit.grad.take() {
            Some(g) => Some(g.to_f32(&Place::Own, shard)?),
            None => None,
        };
        let state = std::mem::take(&mut unit.grad_state);
        reductions.push_back(reduce::submit(
            self.parts.comm,
            u,
            &unit.partition,
            grad,
            acc,
            coef,
            how,
            state,
        ));
        while reductions.len() > REDUCTIONS_IN_FLIGHT {
            let oldest = reductions
                .pop_front()
                .expect("more than the bound are pending");
            finish_reduce(&self.parts.opts.device, units, oldest)?;
        }
        Ok(())
    }

    /// Waits for every reduction still in flight.
    pub(super) fn finish_reductions(self) -> Result<()> {
        if let Shards::Train {
            units, reductions, ..
        } = self.shards
        {
            for r in reductions {
                finish_reduce(&self.parts.opts.device, units, r)?;
            }
        }
        Ok(())
    }
}

/// Waits for a reduction and keeps its new gradient shard and the codec state it handed back.
fn finish_reduce(
    device: &candle_core::Device,
    units: &mut [UnitShard],
    r: reduce::InFlight,
) -> Result<()> {
    let (u, Reduced { shard, state }) = {
        let _span = scope(device, Family::Communication);
        reduce::finish(r)?
    };
    let unit = &mut units[u];
    unit.grad = Some(GradShard::f32(shard));
    unit.grad_state = state;
    Ok(())
}

impl UnitSource for Source<'_> {
    type Error = ZeroError;
    fn params(&mut self, u: usize) -> Result<UnitParams> {
        self.next_gather(u)
    }
    fn grad(&mut self, u: usize, grad: Tensor) -> Result<()> {
        self.start_reduce(u, &grad)
    }
}
