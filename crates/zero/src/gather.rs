//! Parameter gathers, each one job on the communication side ([`comm::Job`]): plain (the shard
//! cast into its slot of the gathered buffer, the rest gathered in place), qwZ (the shard
//! quantised into its slot of an INT8 buffer and its scales', both gathered in place, then
//! dequantised into the buffer the layer reads) and hpZ (the secondary partitions, over the ranks
//! of my node only). The compute stream only waits for the finished buffer.
//!
//! hpZ: the first world gather of a unit in a training step leaves each rank holding its
//! node-local slice of the gathered unit (its *secondary partition*: elements
//! `[l x P/D, (l+1) x P/D)` of the padded buffer for local rank l), a buffer of the
//! communication side. Every later gather of that unit in the step is an intra-node all-gather
//! of the secondary partitions, which rebuilds exactly the buffer of the world gather (with qwZ,
//! the same INT8 codes and scales), so hpZ changes no number. The optimizer step and a
//! checkpoint load invalidate every secondary partition: it is a copy of weights that are about
//! to change. A backward gather issued before its unit's forward gather was waited (a prefetch
//! deeper than the distance between them) finds no secondary partition and gathers from the
//! world: the same numbers, more bytes.

use std::collections::VecDeque;

use candle_core::{DType, Device, Tensor};
use comm::{CommError, Communicator, Group, Job, Lane, Pending};
use kernels::profile::Family;

use crate::{copies, Partition, Qwz, Result, ZeroError};

/// What a gather job is reported as ([`comm::JobTime`]).
pub const FORWARD_GATHER: &str = "forward gather";
pub const BACKWARD_GATHER: &str = "backward gather";

/// A rank's slice of a unit's gathered weights, kept between the forward and the backward, in
/// its own buffer of the communication side.
#[derive(Clone, Debug)]
pub(crate) enum Secondary {
    /// The gathered values themselves, in the compute dtype (hpZ without qwZ).
    Plain(Tensor),
    /// The INT8 codes (`u8`) and f32 scales as gathered (hpZ with qwZ).
    Quantized { codes: Tensor, scales: Tensor },
}

/// Everything a gather of one unit needs to know besides its buffers.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub unit: usize,
    pub partition: Partition,
    pub qwz: Option<Qwz>,
    pub dtype: DType,
    pub device: Device,
    /// My world rank and local rank, and the ranks per node.
    pub rank: usize,
    pub local: usize,
    pub ranks_per_node: usize,
    /// hpZ in training: keep my secondary partition of a world gather.
    pub keep: bool,
    pub label: &'static str,
}

/// A gather in flight.
pub(crate) struct InFlight {
    pub unit: usize,
    from_world: bool,
    keep: bool,
    pending: Pending<Vec<Tensor>>,
}

/// Submits the gather of `spec.unit`: from my node's secondary partitions if `secondary` is
/// given, else from every rank's primary shard `master` (f32).
pub(crate) fn submit(
    comm: &dyn Communicator,
    spec: Spec,
    master: &Tensor,
    secondary: Option<&Secondary>,
) -> InFlight {
    let (unit, keep, label, device) = (spec.unit, spec.keep, spec.label, spec.device.clone());
    let outputs = vec![(spec.dtype, spec.partition.padded)];
    let (inputs, from_world) = match secondary {
        None => (vec![master.clone()], true),
        Some(Secondary::Plain(v)) => (vec![v.clone()], false),
        Some(Secondary::Quantized { codes, scales }) => {
            (vec![codes.clone(), scales.clone()], false)
        }
    };
    let run: comm::job::JobFn = Box::new(move |lane, inputs, outputs| {
        let out = outputs.into_iter().next().expect("one output");
        match from_world {
            true => from_world_job(lane, &spec, &inputs[0], out),
            false => from_node_job(lane, &spec, inputs, out),
        }
        .map_err(|e| CommError::in_job(label, e))
    });
    let job = Job {
        label,
        device,
        inputs,
        outputs,
        run,
    };
    InFlight {
        unit,
        from_world,
        keep,
        pending: comm.submit(job),
    }
}

/// A world gather: my shard into my slot of `out` (with qwZ, of an INT8 buffer), the rest
/// gathered in place; with `keep`, my node-local slice as well.
fn from_world_job(
    lane: &mut dyn Lane,
    spec: &Spec,
    master: &Tensor,
    out: Tensor,
) -> Result<Vec<Tensor>> {
    let place = lane.place().clone();
    let (padded, shard) = (spec.partition.padded, spec.partition.shard_len());
    let at = spec.rank * shard;
    let slice = padded / spec.ranks_per_node;
    let from = spec.local * slice;
    // Profile spans time the compute stream: they record only where the job runs there (one rank).
    let span = |family| place.scope(&spec.device, family);
    match spec.qwz {
        None => {
            {
                let _span = span(Family::ZeroCopies);
                copies::cast_into(&place, master, &out, at)?;
            }
            let full = lane.all_gather_in_place(Group::World, &out)?;
            let mut results = vec![full];
            if spec.keep {
                let mine = lane.alloc(spec.dtype, slice)?;
                copies::copy_into(&place, &results[0], from, slice, &mine, 0)?;
                results.push(mine);
            }
            Ok(results)
        }
        Some(q) => {
            let codes = lane.alloc(DType::U8, padded)?;
            let scales = lane.alloc(DType::F32, padded / q.block)?;
            {
                let _span = span(Family::Quantisation);
                quant::tensor::quantize_int8_into(master, q.block, &codes, &scales, at, &place)?;
            }
            let codes = lane.all_gather_in_place(Group::World, &codes)?;
            let scales = lane.all_gather_in_place(Group::World, &scales)?;
            let _span = span(Family::Quantisation);
            let full = quant::tensor::dequantize_int8_into(&codes, &scales, q.block, &out, &place)?;
            let mut results = vec![full];
            if spec.keep {
                let blocks = slice / q.block;
                let my_codes = lane.alloc(DType::U8, slice)?;
                copies::copy_into(&place, &codes, from, slice, &my_codes, 0)?;
                let my_scales = lane.alloc(DType::F32, blocks)?;
                copies::copy_into(&place, &scales, from / q.block, blocks, &my_scales, 0)?;
                results.push(my_codes);
                results.push(my_scales);
            }
            Ok(results)
        }
    }
}

/// An hpZ gather: my secondary partition into my node slot of `out` (with qwZ, of the INT8
/// buffers), the rest gathered in place over my node.
fn from_node_job(
    lane: &mut dyn Lane,
    spec: &Spec,
    inputs: &[Tensor],
    out: Tensor,
) -> Result<Vec<Tensor>> {
    let place = lane.place().clone();
    let padded = spec.partition.padded;
    let slice = padded / spec.ranks_per_node;
    let at = spec.local * slice;
    let full = match (spec.qwz, inputs) {
        (None, [values]) => {
            copies::copy_into(&place, values, 0, slice, &out, at)?;
            lane.all_gather_in_place(Group::IntraNode, &out)?
        }
        (Some(q), [codes, scales]) => {
            let blocks = slice / q.block;
            let all_codes = lane.alloc(DType::U8, padded)?;
            copies::copy_into(&place, codes, 0, slice, &all_codes, at)?;
            let all_scales = lane.alloc(DType::F32, padded / q.block)?;
            copies::copy_into(&place, scales, 0, blocks, &all_scales, at / q.block)?;
            let all_codes = lane.all_gather_in_place(Group::IntraNode, &all_codes)?;
            let all_scales = lane.all_gather_in_place(Group::IntraNode, &all_scales)?;
            quant::tensor::dequantize_int8_into(&all_codes, &all_scales, q.block, &out, &place)?
        }
        _ => {
            return Err(ZeroError::BadState {
                name: format!("secondary partition of unit {}", spec.unit),
                reason: "its kind does not match the qwZ plan".into(),
            })
        }
    };
    Ok(vec![full])
}

/// Waits for a gather: the unit's full padded buffer in the compute dtype and, for a world
/// gather that keeps it (hpZ in training), my secondary partition.
pub(crate) fn finish(flight: InFlight, padded: usize) -> Result<(Tensor, Option<Secondary>)> {
    let mut results = flight.pending.wait()?.into_iter();
    let full = results.next().ok_or_else(|| ZeroError::BadState {
        name: format!("gathered unit {}", flight.unit),
        reason: "the gather returned nothing".into(),
    })?;
    if full.elem_count() != padded {
        return Err(ZeroError::BadState {
            name: format!("gathered unit {}", flight.unit),
            reason: format!("{} elements, expected {padded}", full.elem_count()),
        });
    }
    let kept: Vec<Tensor> = results.collect();
    let secondary = match (flight.from_world && flight.keep, kept.as_slice()) {
        (false, _) | (true, []) => None,
        (true, [values]) => Some(Secondary::Plain(values.clone())),
        (true, [codes, scales]) => Some(Secondary::Quantized {
            codes: codes.clone(),
            scales: scales.clone(),
        }),
        (true, _) => {
            return Err(ZeroError::BadState {
                name: format!("secondary partition of unit {}", flight.unit),
                reason: format!("{} buffers", kept.len()),
            })
        }
    };
    Ok((full, secondary))
}

/// Gathers units in a fixed order, keeping up to `depth` gathers in flight ahead of the unit
/// being computed, as ZeRO-3's prefetch does (`zero.prefetch_depth`; 0: each gather is issued
/// when its unit is needed). The engine drives it (`Engine::next_gather`).
pub(crate) struct GatherQueue {
    order: Vec<usize>,
    /// The first `forward` gathers of `order` are the forward pass's; the rest the backward's.
    forward: usize,
    issued: usize,
    in_flight: VecDeque<InFlight>,
    depth: usize,
}

impl GatherQueue {
    pub(crate) fn new(order: Vec<usize>, depth: usize, forward: usize) -> Self {
        GatherQueue {
            order,
            forward,
            issued: 0,
            in_flight: VecDeque::new(),
            depth,
        }
    }

    /// The next unit to issue and its job label, if any, marking it issued.
    pub(crate) fn next_to_issue(&mut self) -> Option<(usize, &'static str)> {
        let u = self.order.get(self.issued).copied()?;
        let label = match self.issued < self.forward {
            true => FORWARD_GATHER,
            false => BACKWARD_GATHER,
        };
        self.issued += 1;
        Some((u, label))
    }

    pub(crate) fn push(&mut self, flight: InFlight) {
        self.in_flight.push_back(flight);
    }

    pub(crate) fn pop(&mut self) -> Option<InFlight> {
        self.in_flight.pop_front()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub(crate) fn depth(&self) -> usize {
        self.depth
    }
}
