//! What the gradient codecs keep of a unit from one step to the next ([`GradState`]), and what
//! a reduction job hands a codec ([`ReduceInput`]).

use candle_core::{DType, Device, Tensor};
use comm::{Lane, Topology};

use crate::{GradReduction, Result, ZeroError, ZeroPlan};

/// One rank's state of one unit for the gradient codecs of a run: f32 buffers of the
/// communication side, each named by its codec ([`GradCodec::kept`]) and absent until the codec
/// first writes it (qgZ's error feedback starts at zero). The unit's reduction takes it by value
/// into its job and hands it back; the engine saves and restores it by the names the codecs
/// give, and knows nothing of what is in it.
#[derive(Clone, Debug, Default)]
pub struct GradState {
    kept: Vec<Kept>,
}

/// One kept buffer: its name, its length and its data once written.
#[derive(Clone, Debug)]
struct Kept {
    name: &'static str,
    len: usize,
    data: Option<Tensor>,
}

impl GradState {
    /// A state with the buffers `kept` (each a name and a length), none written yet.
    pub fn new(kept: Vec<(&'static str, usize)>) -> GradState {
        let kept = kept.into_iter();
        let kept = kept.map(|(name, len)| Kept {
            name,
            len,
            data: None,
        });
        GradState {
            kept: kept.collect(),
        }
    }

    /// The state of a unit padded to `padded` for every reduction `plan` may run: each codec's
    /// buffers ([`GradCodec::new_state`]) in the order of [`ZeroPlan::grad_reductions`], which
    /// is the checkpoint's.
    pub fn for_run(plan: &ZeroPlan, padded: usize) -> GradState {
        let reductions = plan.grad_reductions().into_iter();
        let states = reductions.map(|r| r.codec().new_state(padded, plan.topology));
        GradState {
            kept: states.flat_map(|s| s.kept).collect(),
        }
    }

    /// The buffer `name` as last written, if it was.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        let kept = self.kept.iter().find(|k| k.name == name);
        kept.and_then(|k| k.data.as_ref())
    }

    /// Takes the buffer `name` out (a job writes its new values in place), leaving it absent
    /// until [`GradState::put`].
    pub fn take(&mut self, name: &str) -> Option<Tensor> {
        let kept = self.kept.iter_mut().find(|k| k.name == name);
        kept.and_then(|k| k.data.take())
    }

    /// Keeps `data` as the buffer `name`; a name the state does not hold is a codec's bug.
    pub fn put(&mut self, name: &str, data: Tensor) {
        let kept = self.kept.iter_mut().find(|k| k.name == name);
        let kept = kept.expect("a codec keeps only the buffers it named");
        debug_assert_eq!(data.elem_count(), kept.len, "{name}");
        kept.data = Some(data);
    }

    /// Drops every buffer's data: the next reduction starts as the first did.
    pub fn clear(&mut self) {
        self.kept.iter_mut().for_each(|k| k.data = None);
    }

    /// The buffers written, each with its name, in checkpoint order: what a checkpoint saves
    /// as `<unit>.<name>`.
    pub fn save(&self) -> impl Iterator<Item = (&'static str, &Tensor)> {
        let written = self.kept.iter();
        written.filter_map(|k| k.data.as_ref().map(|d| (k.name, d)))
    }

    /// Reads every buffer back as `<unit>.<name>` through `lookup`, onto `device`: one the
    /// checkpoint lacks (written with the codec's state off, or before it wrote any) is absent,
    /// so that the codec starts it at zero; one of another length is an error.
    pub fn load(
        &mut self,
        unit: &str,
        lookup: &dyn Fn(&str) -> Option<Vec<f32>>,
        device: &Device,
    ) -> Result<()> {
        for k in &mut self.kept {
            let name = format!("{unit}.{}", k.name);
            k.data = match lookup(&name) {
                None => None,
                Some(v) if v.len() == k.len => Some(Tensor::from_vec(v, k.len, device)?),
                Some(v) => {
                    return Err(ZeroError::StateLength {
                        name,
                        what: "error buffer",
                        got: v.len(),
                        expected: k.len,
                    })
                }
            };
        }
        Ok(())
    }
}

impl GradReduction {
    /// The buffers of `state` the reduction of a unit padded to `padded` reads: the inputs its
    /// job holds besides the gradient.
    pub(crate) fn reads(self, state: &GradState, padded: usize, topology: Topology) -> Vec<Tensor> {
        let kept = self.codec().kept(padded, topology);
        let read = kept.iter().filter_map(|(name, _)| state.get(name));
        read.cloned().collect()
    }
}

/// What a reduction job hands its codec ([`GradCodec::reduce`]): one unit's gradient as the
/// backward wrote it, its weight, and where the reduced slice goes.
pub struct ReduceInput<'a> {
    /// The unit's full gradient, in the compute dtype, unpadded.
    pub grad: &'a Tensor,
    /// The micro-batch's weight over the world size, applied as the gradient is padded.
    pub coef: f32,
    /// The unit's padded length, a multiple of W x [`ZeroPlan::align`].
    pub padded: usize,
    pub topology: Topology,
    /// The job's output, the unit's new f32 shard, for the step's first micro-batch; `None`
    /// where the reduced slice is added into the shard of the earlier ones (by the job, after).
    pub out: Option<Tensor>,
}

impl ReduceInput<'_> {
    /// My slice's length.
    pub fn shard(&self) -> usize {
        self.padded / self.topology.world()
    }

    /// Whether the reduced slice is added into an earlier one: then the codec may return it in
    /// its own dtype, and the add widens it.
    pub fn accumulates(&self) -> bool {
        self.out.is_none()
    }

    /// An f32 buffer for my slice: the job's output, or a new one to add from.
    pub fn target(&self, lane: &mut dyn Lane) -> Result<Tensor> {
        match &self.out {
            Some(o) => Ok(o.clone()),
            None => Ok(lane.alloc(DType::F32, self.shard())?),
        }
    }
}
