//! The step's GPU time by kernel family (`trainer bench --profile`), timed with CUDA events.
//!
//! A launcher opens a [`scope`] of its family around its launches; the profile is off unless
//! [`enable`]d on this thread, and then costs two event records a scope (the events are
//! reused once their times are read). Scopes nest (the GEMMs inside the cross-entropy, the
//! quantisers inside a gather): a family is charged its *exclusive* time, its own span less
//! the spans of the scopes opened inside it, so the families add up to the time covered by
//! outermost scopes. Everything is per thread (one rank each).
//!
//! Apart from the families, a [`phase`] times one unit's forward or backward, or the loss head,
//! whole (kernels of every family inside it): what `trainer plan --calibrate` scales to a
//! cluster. A scope may also name what it runs ([`scope_cuda_shape`]: a GEMM's shape and
//! FLOPs), and [`take_shapes`] sums those by name: which GEMM of the step runs slowly.

/// What a span of GPU work is, for the profile's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// cuBLAS/cuBLASLt GEMMs (with their epilogues).
    Gemm,
    /// Fused attention, forward and backward.
    Attention,
    /// LayerNorm and RMSNorm, forward and backward.
    Norm,
    /// Bias, GELU, residual and bias-gradient kernels; RoPE and SwiGLU.
    Elementwise,
    /// Embedding lookup and its backward.
    Embedding,
    /// The LM head's soft-max cross-entropy (its GEMMs are charged to `Gemm`).
    CrossEntropy,
    /// Gradient norm, clipping and AdamW.
    Optimizer,
    /// The ZeRO engine's own passes: casts, padding and accumulation of gathered parameters and
    /// reduced gradients.
    ShardPasses,
    /// qwZ / qgZ quantisation kernels.
    Quantisation,
    /// Collectives and the compute stream's waits for them.
    Communication,
}

impl Family {
    pub const ALL: [Family; 10] = [
        Family::Gemm,
        Family::Attention,
        Family::Norm,
        Family::Elementwise,
        Family::Embedding,
        Family::CrossEntropy,
        Family::Optimizer,
        Family::ShardPasses,
        Family::Quantisation,
        Family::Communication,
    ];

    /// Lower-case name, as in `--json`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Gemm => "gemm",
            Family::Attention => "attention",
            Family::Norm => "norm",
            Family::Elementwise => "elementwise",
            Family::Embedding => "embedding",
            Family::CrossEntropy => "cross_entropy",
            Family::Optimizer => "optimizer",
            Family::ShardPasses => "shard_passes",
            Family::Quantisation => "quantisation",
            Family::Communication => "communication",
        }
    }
}

/// A unit's forward or backward by its index in the model, or the loss head: the span of a
/// [`phase`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Forward(usize),
    Head,
    Backward(usize),
}

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
    use candle_core::cuda_backend::cudarc::driver::{CudaEvent, CudaStream};
    use std::cell::RefCell;
    use std::sync::Arc;

    struct Span {
        family: Family,
        /// What the span runs and its FLOPs ([`super::scope_cuda_shape`]).
        shape: Option<(String, f64)>,
        parent: Option<usize>,
        start: CudaEvent,
        end: Option<CudaEvent>,
    }

    #[derive(Default)]
    pub(super) struct State {
        pub(super) enabled: bool,
        spans: Vec<Span>,
        open: Vec<usize>,
        stream: Option<Arc<CudaStream>>,
        /// Phase spans, timed apart from the families: their start, and end once closed.
        phases: Vec<(Phase, CudaEvent, Option<CudaEvent>)>,
        /// Named spans' exclusive seconds, FLOPs and calls since the last `take_shapes`.
        shapes: std::collections::BTreeMap<String, super::ShapeTime>,
        /// Events whose times have been read, recorded again by the next spans: a new event a
        /// span is a driver allocation on the host besides its record, in steps where the
        /// profile's events are measurably in the step's time (results.md, 2026-12-06).
        pool: Vec<CudaEvent>,
    }

    thread_local! {
        pub(super) static STATE: RefCell<State> = RefCell::new(State::default());
    }

    /// An event recorded on `stream`: one of `pool`'s (read and done with) where it has one
    /// of the stream's context, else a new one.
    fn event(pool: &mut Vec<CudaEvent>, stream: &CudaStream) -> Option<CudaEvent> {
        if let Some(e) = pool.pop() {
            if e.record(stream).is_ok() {
                return Some(e);
            }
        }
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .ok()
    }

    pub(super) fn open(
        dev: &candle_core::cuda_backend::CudaDevice,
        family: Family,
        shape: impl FnOnce() -> Option<(String, f64)>,
    ) -> bool {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            if !s.enabled {
                return false;
            }
            let shape = shape();
            let stream = dev.cuda_stream();
            let Some(start) = event(&mut s.pool, &stream) else {
                return false;
            };
            let parent = s.open.last().copied();
            s.spans.push(Span {
                family,
                shape,
                parent,
                start,
                end: None,
            });
            let i = s.spans.len() - 1;
            s.open.push(i);
            s.stream = Some(stream);
            true
        })
    }

    pub(super) fn close() {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let Some(i) = s.open.pop() else { return };
            let s = &mut *s;
            let end = s.stream.as_ref().and_then(|st| event(&mut s.pool, st));
            s.spans[i].end = end;
        })
    }

    pub(super) fn open_phase(dev: &candle_core::cuda_backend::CudaDevice, phase: Phase) -> bool {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            if !s.enabled {
                return false;
            }
            match event(&mut s.pool, &dev.cuda_stream()) {
                Some(start) => {
                    s.phases.push((phase, start, None));
                    true
                }
                None => false,
            }
        })
    }

    /// Closes the last phase opened and not closed.
    pub(super) fn close_phase(dev: &candle_core::cuda_backend::CudaDevice) {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let end = event(&mut s.pool, &dev.cuda_stream());
            if let Some(p) = s.phases.iter_mut().rev().find(|p| p.2.is_none()) {
                p.2 = end;
            }
        })
    }

    pub(super) fn take_phases() -> Vec<(Phase, f64)> {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let phases = std::mem::take(&mut s.phases);
            let mut out = Vec::with_capacity(phases.len());
            for (phase, start, end) in phases {
                if let Some(end) = end {
                    let _ = end.synchronize();
                    if let Ok(ms) = start.elapsed_ms(&end) {
                        out.push((phase, ms as f64 / 1e3));
                    }
                    s.pool.push(end);
                }
                s.pool.push(start);
            }
            out
        })
    }

    pub(super) fn take() -> Vec<(Family, f64)> {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let spans = std::mem::take(&mut s.spans);
            s.open.clear();
            let elapsed: Vec<f64> = spans
                .iter()
                .map(|sp| match &sp.end {
                    Some(end) => {
                        let _ = end.synchronize();
                        sp.start
                            .elapsed_ms(end)
                            .map(|ms| ms as f64 / 1e3)
                            .unwrap_or(0.0)
                    }
                    None => 0.0,
                })
                .collect();
            let mut exclusive = elapsed.clone();
            for (i, sp) in spans.iter().enumerate() {
                if let Some(p) = sp.parent {
                    exclusive[p] -= elapsed[i];
                }
            }
            let mut out: Vec<(Family, f64)> = Family::ALL.iter().map(|f| (*f, 0.0)).collect();
            for (sp, t) in spans.into_iter().zip(exclusive) {
                if let Some(slot) = out.iter_mut().find(|(f, _)| *f == sp.family) {
                    slot.1 += t.max(0.0);
                }
                if let Some((name, flops)) = sp.shape {
                    let e = s.shapes.entry(name).or_default();
                    e.seconds += t.max(0.0);
                    e.flops += flops;
                    e.calls += 1;
                }
                // Read (and the GPU past them): free to record again.
                s.pool.push(sp.start);
                if let Some(end) = sp.end {
                    s.pool.push(end);
                }
            }
            out
        })
    }

    pub(super) fn take_shapes() -> Vec<(String, super::ShapeTime)> {
        STATE.with(|s| {
            std::mem::take(&mut s.borrow_mut().shapes)
                .into_iter()
                .collect()
        })
    }
}

/// Turns the profile on or off for this thread (off by default); turning it on clears it.
pub fn enable(on: bool) {
    #[cfg(feature = "cuda")]
    imp::STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.enabled = on;
    });
    #[cfg(feature = "cuda")]
    if on {
        let _ = imp::take();
        let _ = imp::take_phases();
        let _ = imp::take_shapes();
    }
    #[cfg(not(feature = "cuda"))]
    let _ = on;
}

/// An open span; it closes when dropped.
pub struct Scope {
    #[cfg(feature = "cuda")]
    open: bool,
}

impl Drop for Scope {
    fn drop(&mut self) {
        #[cfg(feature = "cuda")]
        if self.open {
            imp::close();
        }
    }
}

/// An open [`phase`]; it closes when dropped.
pub struct PhaseScope {
    #[cfg(feature = "cuda")]
    open: Option<candle_core::cuda_backend::CudaDevice>,
}

impl Drop for PhaseScope {
    fn drop(&mut self) {
        #[cfg(feature = "cuda")]
        if let Some(dev) = &self.open {
            imp::close_phase(dev);
        }
    }
}

/// Opens a span of `phase` on `device`'s stream (nothing on the CPU or with the profile off).
#[must_use = "the span closes when the scope is dropped"]
pub fn phase(device: &candle_core::Device, phase: Phase) -> PhaseScope {
    #[cfg(feature = "cuda")]
    {
        match device {
            candle_core::Device::Cuda(dev) if imp::open_phase(dev, phase) => PhaseScope {
                open: Some(dev.clone()),
            },
            _ => PhaseScope { open: None },
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (device, phase);
        PhaseScope {}
    }
}

/// Each phase span closed since the last `take_phases` (or `enable`), in the order opened, with
/// its seconds (waiting for the events to complete); empty on the CPU.
pub fn take_phases() -> Vec<(Phase, f64)> {
    #[cfg(feature = "cuda")]
    {
        imp::take_phases()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Vec::new()
    }
}

/// Opens a span of `family` on `device`'s stream (nothing on the CPU or with the profile off).
#[must_use = "the span closes when the scope is dropped"]
pub fn scope(device: &candle_core::Device, family: Family) -> Scope {
    #[cfg(feature = "cuda")]
    {
        match device {
            candle_core::Device::Cuda(dev) => scope_cuda(dev, family),
            _ => Scope { open: false },
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (device, family);
        Scope {}
    }
}

/// [`scope`] on a CUDA device handle.
#[cfg(feature = "cuda")]
#[must_use = "the span closes when the scope is dropped"]
pub fn scope_cuda(dev: &candle_core::cuda_backend::CudaDevice, family: Family) -> Scope {
    Scope {
        open: imp::open(dev, family, || None),
    }
}

/// [`scope_cuda`] of a span that also names what it runs and its FLOPs (`shape`, called only
/// with the profile on), for [`take_shapes`].
#[cfg(feature = "cuda")]
#[must_use = "the span closes when the scope is dropped"]
pub fn scope_cuda_shape(
    dev: &candle_core::cuda_backend::CudaDevice,
    family: Family,
    shape: impl FnOnce() -> (String, f64),
) -> Scope {
    Scope {
        open: imp::open(dev, family, || Some(shape())),
    }
}

/// The named spans' time ([`scope_cuda_shape`]), summed by name over the `take`s since the last
/// call: exclusive seconds, FLOPs and calls.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShapeTime {
    pub seconds: f64,
    pub flops: f64,
    pub calls: usize,
}

/// Each name's [`ShapeTime`] over the `take`s since the last call (or `enable`), by name;
/// empty on the CPU.
pub fn take_shapes() -> Vec<(String, ShapeTime)> {
    #[cfg(feature = "cuda")]
    {
        imp::take_shapes()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Vec::new()
    }
}

/// Each family's exclusive seconds since the last `take` (or `enable`), waiting for the events
/// to complete; every family is listed, in [`Family::ALL`] order.
pub fn take() -> Vec<(Family, f64)> {
    #[cfg(feature = "cuda")]
    {
        imp::take()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Family::ALL.iter().map(|f| (*f, 0.0)).collect()
    }
}
