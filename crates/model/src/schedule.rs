//! The model as the ZeRO engine sees it: a schedule of units.
//!
//! A [`Model`] is its ordered units (each a flat parameter buffer of [`UnitLayout`], with a
//! forward `(params, input) -> (output, saved)` and a backward `(params, saved, dout) ->
//! (dinput, dparams)`), and the head-and-loss step, which reads the parameters of one of those
//! units ([`Model::head_unit`]: the token embedding when the head is tied). The first unit's
//! input is the `(B, T)` tokens, every other unit's the previous unit's output.
//!
//! One walk of the schedule serves every caller: [`Model::train_walk`] runs forward, the head
//! and backward, asking a [`UnitSource`] for each unit's parameters in [`Model::gather_order`]
//! and handing it each unit's gradient; [`Model::eval_walk`] runs forward and the head. The
//! ZeRO engine's source gathers and reduces; [`Model::loss_and_grads`] (the unsharded
//! reference) reads a slice of buffers. The engine and the reference are the same walk, so
//! they cannot drift apart, and the engine names no layer.
//!
//! Training gather order: every unit in forward order; then the head's unit, unless it is the
//! last unit, whose forward gather is kept for the head; then the units in reverse, skipping the
//! head's (kept from the head) and any whose backward reads no parameters (an embedding: its
//! gradient is a scatter of `dout`). GPT-2 (tied): `[0, 1, .., n-1, 0, n-1, .., 1]`. Llama
//! untied: `[0, 1, .., n-1, n-2, .., 1]`. A model whose backward keeps the forward's parameters
//! ([`BackwardParams::Kept`]) gathers each unit once, in forward order.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use model::*;
//! let model = Model::new(ModelConfig::gpt2(1, 8, 2, 4, 10)).unwrap();
//! let params: Vec<Tensor> = model.units().iter().map(|u| {
//!     let mut buf = vec![0f32; u.numel];
//!     init_unit_range(model.config(), u, 0, 0, &mut buf);
//!     Tensor::from_vec(buf, u.numel, &Device::Cpu).unwrap()
//! }).collect();
//! let tokens = Tensor::new(&[[1u32, 2, 3, 4], [5, 6, 7, 8]], &Device::Cpu).unwrap();
//! let targets = Tensor::new(&[[2u32, 3, 4, 5], [6, 7, 8, 9]], &Device::Cpu).unwrap();
//! let off = model::Recompute::Off;
//! let (loss, grads) = model.loss_and_grads(&params, &tokens, &targets, off).unwrap();
//! assert!((loss - 10f64.ln()).abs() < 0.05); // near-uniform predictions at init
//! assert_eq!(grads[1].dims1().unwrap(), model.units()[1].numel);
//! assert_eq!(model.gather_order(Pass::Train), vec![0, 1, 2, 0, 2, 1]);
//! ```

use std::any::Any;

use candle_core::Tensor;
use kernels::profile::Phase;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::family::HfTensor;
use crate::layers::Fp8Weight;
use crate::layers::{Loss, TokenIndex};
use crate::layout::{ModelLayout, ParamSpec, UnitKind, UnitLayout};
use crate::linears::{LinearFormat, LinearWeight};
use crate::recompute::Recompute;

/// Which walk of the schedule: training (forward, head, backward) or evaluation (forward, head).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    Train,
    Eval,
}

/// Where a training walk's backward takes each unit's parameters: gathered again (ZeRO-3,
/// where a unit's full parameters exist only while it computes), or kept from the unit's
/// forward, where the rank holds every unit whole anyway (one rank: the "gather" is the
/// buffer itself) and a second gather would only repeat the first's work. Under FP8 compute a
/// kept unit's linear weights are quantised once for both passes
/// ([`UnitParams::for_both_passes`]): the forward reads `w^T`'s codes, the backward `w`'s, made
/// in one read of the bf16 weight instead of one a pass. The engine resolves it from the world
/// (`zero::ZeroPlan::backward_params`); [`Model::gather_order`] follows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackwardParams {
    #[default]
    Regathered,
    Kept,
}

/// What a unit's forward keeps for its backward: a value of the family's own type (an
/// embedding's: its [`TokenIndex`]), which only the unit's backward reads.
pub struct Saved(Box<dyn Any + Send + Sync>);

impl Saved {
    /// Keeps `state` for the backward.
    pub fn new<S: Any + Send + Sync>(state: S) -> Self {
        Saved(Box::new(state))
    }

    /// The kept state as the `S` its forward kept; [`ModelError::SavedMismatch`] (naming
    /// `family`) when another forward kept it, which is a bug in the caller's walk.
    pub fn get<S: Any>(&self, family: &'static str) -> Result<&S> {
        self.0
            .downcast_ref()
            .ok_or_else(|| ModelError::SavedMismatch {
                unit: std::any::type_name::<S>().to_string(),
                arch: family,
            })
    }
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Saved")
    }
}

/// A unit's parameters as a walk hands them to the unit: its flat buffer (at least its numel
/// elements, in the compute dtype) and, where the gather delivered them in FP8 (FP8 qwZ), its
/// linear layers' weights as codes and tile scales, keyed by their offset in the unit. A layer
/// reads such a weight through [`UnitParams::linear`] in place of the buffer's view; the buffer
/// then holds everything else (norms, biases) and zeros where those weights lie.
#[derive(Clone, Debug)]
pub struct UnitParams {
    flat: Tensor,
    fp8: Vec<(usize, Fp8Weight)>,
}

impl UnitParams {
    /// Every parameter in the flat buffer.
    pub fn dense(flat: Tensor) -> UnitParams {
        UnitParams {
            flat,
            fp8: Vec::new(),
        }
    }

    /// The flat buffer with the weights at these offsets given in FP8.
    pub fn with_fp8(flat: Tensor, fp8: Vec<(usize, Fp8Weight)>) -> UnitParams {
        UnitParams { flat, fp8 }
    }

    /// The flat buffer.
    pub fn flat(&self) -> &Tensor {
        &self.flat
    }

    /// The FP8 weights, by offset.
    pub fn fp8(&self) -> &[(usize, Fp8Weight)] {
        &self.fp8
    }

    /// Linear weight `p`: its FP8 codes where the gather gave them, else its view of the
    /// buffer.
    pub fn linear(&self, p: &ParamSpec) -> Result<LinearWeight> {
        match self.fp8.iter().find(|(at, _)| *at == p.offset) {
            Some((_, w)) => Ok(LinearWeight::Fp8(w.clone())),
            None => Ok(LinearWeight::Dense(p.view(&self.flat)?)),
        }
    }
}

impl UnitParams {
    /// These parameters with each of `unit`'s linear weights not already in FP8 quantised for
    /// both passes ([`crate::layers::Fp8Weight::transposed`] beside its codes): what a walk
    /// keeps from a unit's forward for its backward under FP8 compute. Each weight's numbers
    /// are those its layers would quantise in each pass, bit for bit. On the GPU weights the
    /// quantisers do not take (sides not multiples of 16) stay dense, as the layers then
    /// multiply them.
    pub fn for_both_passes(self, unit: &UnitLayout) -> Result<UnitParams> {
        let dense: Vec<&ParamSpec> = unit
            .linear_weights()
            .filter(|p| self.fp8.iter().all(|(at, _)| *at != p.offset))
            .collect();
        let views = dense
            .iter()
            .map(|p| p.view(&self.flat))
            .collect::<Result<Vec<_>>>()?;
        let quantised = crate::layers::fp8_linear::for_both_passes(&views)?;
        let mut fp8 = self.fp8;
        for (p, w) in dense.iter().zip(quantised) {
            if let Some(w) = w {
                fp8.push((p.offset, w));
            }
        }
        Ok(UnitParams {
            flat: self.flat,
            fp8,
        })
    }

    /// These parameters without the forward's orientation of their FP8 weights: what a
    /// backward that runs none of the unit's linear layers forward again reads.
    pub fn without_forward_codes(self) -> UnitParams {
        UnitParams {
            flat: self.flat,
            fp8: self
                .fp8
                .into_iter()
                .map(|(at, w)| (at, w.without_transposed()))
                .collect(),
        }
    }
}

impl From<Tensor> for UnitParams {
    fn from(flat: Tensor) -> UnitParams {
        UnitParams::dense(flat)
    }
}

/// Where a walk of the schedule takes each unit's parameters and puts each unit's gradient: the
/// ZeRO engine (gathers and reductions) or a slice of full buffers (the reference).
pub trait UnitSource {
    type Error: From<ModelError>;
    /// Unit `u`'s full parameters: a 1-D buffer of at least its numel elements, and any linear
    /// weights gathered in FP8 ([`UnitParams`]). A walk asks in exactly the order of
    /// [`Model::gather_order`] of its pass.
    fn params(&mut self, u: usize) -> std::result::Result<UnitParams, Self::Error>;
    /// Unit `u`'s flat gradient (its numel elements), once per unit in a training walk, in
    /// backward order. Returned, not accumulated: accumulating is the source's business.
    fn grad(&mut self, u: usize, grad: Tensor) -> std::result::Result<(), Self::Error>;
}

/// A decoder-only model as a schedule of units (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    cfg: ModelConfig,
    layout: ModelLayout,
    /// What the blocks' linear layers multiply in.
    linears: LinearFormat,
    /// Where a training walk's backward takes each unit's parameters.
    backward_params: BackwardParams,
}

impl Model {
    /// The schedule of `cfg`, after [`ModelConfig::validate`].
    pub fn new(cfg: ModelConfig) -> Result<Self> {
        cfg.validate()?;
        let layout = ModelLayout::new(&cfg);
        Ok(Model {
            cfg,
            layout,
            linears: LinearFormat::Dense,
            backward_params: BackwardParams::Regathered,
        })
    }

    /// This schedule with the blocks' linear layers multiplying in `linears` (FP8 compute).
    pub fn with_linears(self, linears: LinearFormat) -> Self {
        Model { linears, ..self }
    }

    /// What the blocks' linear layers multiply in.
    pub fn linears(&self) -> LinearFormat {
        self.linears
    }

    /// This schedule with a training walk's backward taking each unit's parameters as
    /// `backward_params` says.
    pub fn with_backward_params(self, backward_params: BackwardParams) -> Self {
        Model {
            backward_params,
            ..self
        }
    }

    /// Where a training walk's backward takes each unit's parameters.
    pub fn backward_params(&self) -> BackwardParams {
        self.backward_params
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// The units in forward order.
    pub fn units(&self) -> &[UnitLayout] {
        &self.layout.units
    }

    /// The unit whose parameters the head reads: the embedding when tied, else the last unit
    /// (the final norm, which then holds `lm_head.weight`).
    pub fn head_unit(&self) -> usize {
        match self.cfg.tie_embeddings {
            true => 0,
            false => self.layout.units.len() - 1,
        }
    }

    /// Whether unit `u`'s backward reads its parameters (an embedding's does not).
    fn backward_reads_params(&self, u: usize) -> bool {
        self.layout.units[u].kind != UnitKind::Embedding
    }

    /// The units a walk of `pass` asks its source for, in order (see the module doc).
    pub fn gather_order(&self, pass: Pass) -> Vec<usize> {
        let n = self.layout.units.len();
        let head = self.head_unit();
        let mut order: Vec<usize> = (0..n).collect();
        if pass == Pass::Eval || self.backward_params == BackwardParams::Kept {
            return order;
        }
        if head != n - 1 {
            order.push(head);
        }
        order.extend(
            (0..n)
                .rev()
                .filter(|&u| u != head && self.backward_reads_params(u)),
        );
        order
    }

    /// Unit `u`'s forward: `input` is the `(B, T)` u32 tokens for the first unit, else the
    /// previous unit's `(B, T, C)` output. A block keeps what `recompute` says and its backward
    /// recomputes the rest (the same gradients, bitwise).
    pub fn forward(
        &self,
        u: usize,
        params: &UnitParams,
        input: &Tensor,
        recompute: Recompute,
    ) -> Result<(Tensor, Saved)> {
        let cfg = &self.cfg;
        let family = cfg.family();
        match self.layout.units[u].kind {
            UnitKind::Embedding => {
                // The index first: its read of the ids waits for less queued before it.
                let index = TokenIndex::new(input, cfg.vocab_size)?;
                let out = family.embedding_forward(cfg, params.flat(), input)?;
                Ok((out, Saved::new(index)))
            }
            UnitKind::Block(_) => family.block_forward(cfg, self.linears, params, input, recompute),
            UnitKind::FinalNorm => family.final_norm_forward(cfg, params.flat(), input),
        }
    }

    /// Unit `u`'s backward: `(dinput, flat dparams)`, `dinput` `None` for the first unit (its
    /// input is the tokens). `params` may be `None` for a unit whose backward reads none (an
    /// embedding), which [`Model::gather_order`] does not gather again.
    pub fn backward(
        &self,
        u: usize,
        params: Option<&UnitParams>,
        saved: &Saved,
        dout: &Tensor,
    ) -> Result<(Option<Tensor>, Tensor)> {
        self.backward_onto(u, params, saved, dout, None)
    }

    /// [`Model::backward`] with the unit's flat gradient added onto `onto` where given (the
    /// head's gradient of the same unit): the embedding's backward adds its token rows into it
    /// in place on the GPU (no zeroed table, no pass adding two); any other unit's gradient is
    /// added to it.
    pub fn backward_onto(
        &self,
        u: usize,
        params: Option<&UnitParams>,
        saved: &Saved,
        dout: &Tensor,
        onto: Option<Tensor>,
    ) -> Result<(Option<Tensor>, Tensor)> {
        let cfg = &self.cfg;
        let params = || {
            params.ok_or(ModelError::NoParams {
                unit: self.layout.units[u].name.clone(),
            })
        };
        let family = cfg.family();
        let (dx, g) = match self.layout.units[u].kind {
            UnitKind::Embedding => {
                let tokens = saved.get::<TokenIndex>(family.name())?;
                return Ok((None, family.embedding_backward(cfg, tokens, dout, onto)?));
            }
            UnitKind::Block(_) => {
                let (dx, g) = family.block_backward(cfg, self.linears, params()?, saved, dout)?;
                (Some(dx), g)
            }
            UnitKind::FinalNorm => {
                let (dx, g) = family.final_norm_backward(cfg, params()?.flat(), saved, dout)?;
                (Some(dx), g)
            }
        };
        match onto {
            Some(o) => Ok((dx, (o + g).map_err(ModelError::from)?)),
            None => Ok((dx, g)),
        }
    }

    /// The head and mean cross-entropy over all `B*T` positions of `x (B, T, C)` (the last unit's
    /// output) against `targets (B, T)`, reading `head_params` (the buffer of
    /// [`Model::head_unit`]); with `grad`, also `dx` and the head unit's flat gradient (only the
    /// head's matrix nonzero).
    pub fn head(
        &self,
        head_params: &Tensor,
        x: &Tensor,
        targets: &Tensor,
        grad: bool,
    ) -> Result<(Loss, Option<(Tensor, Tensor)>)> {
        self.cfg
            .family()
            .head_loss(&self.cfg, head_params, x, targets, grad)
    }

    /// Forward, head and backward of one micro-batch: the loss. Parameters come from `source` in
    /// [`Model::gather_order`]`(Pass::Train)`, gradients go back to it.
    pub fn train_walk<S: UnitSource>(
        &self,
        source: &mut S,
        tokens: &Tensor,
        targets: &Tensor,
        recompute: Recompute,
    ) -> std::result::Result<f64, S::Error> {
        let n = self.layout.units.len();
        let head = self.head_unit();
        let mut saved = Vec::with_capacity(n);
        let mut x = tokens.clone();
        let mut last = None;
        let device = tokens.device().clone();
        let phase = |p| kernels::profile::phase(&device, p);
        let keep = self.backward_params == BackwardParams::Kept;
        let mut kept: Vec<Option<UnitParams>> = vec![None; n];
        for (u, kept_u) in kept.iter_mut().enumerate() {
            let mut params = source.params(u)?;
            let span = phase(Phase::Forward(u));
            if keep && self.linears == LinearFormat::Fp8 {
                params = params.for_both_passes(&self.layout.units[u])?;
            }
            let (y, s) = self.forward(u, &params, &x, recompute)?;
            drop(span);
            saved.push(s);
            x = y;
            if u == n - 1 && head == n - 1 {
                last = Some(params.clone());
            }
            if keep {
                // w's codes alone, a byte a weight: a recomputed forward transposes them again
                // (fp8_transpose_tiles, as for FP8 qwZ's codes), which moves 2 bytes a weight of
                // the layers it reruns and holds nothing more between the passes.
                *kept_u = Some(params.without_forward_codes());
            }
        }
        let head_params = match (last, keep) {
            (Some(p), _) => p,
            (None, true) => kept[head].clone().expect("every unit's forward ran"),
            (None, false) => source.params(head)?,
        };
        let span = phase(Phase::Head);
        let (loss, grads) = self.head(head_params.flat(), &x, targets, true)?;
        drop((span, x));
        let (mut dx, head_grad) = grads.expect("the head returns gradients when asked");
        let mut head_params = Some(head_params);
        let mut head_grad = Some(head_grad);
        for u in (0..n).rev() {
            let params = match (u == head, self.backward_reads_params(u)) {
                (true, _) => head_params.take(),
                (false, true) if keep => kept[u].take(),
                (false, true) => Some(source.params(u)?),
                (false, false) => None,
            };
            kept[u] = None;
            let s = saved.pop().expect("one saved state per unit");
            let span = phase(Phase::Backward(u));
            // The head's gradient of this unit goes in, and the unit's comes out added to it.
            let onto = head_grad.take_if(|_| u == head);
            let (d, g) = self.backward_onto(u, params.as_ref(), &s, &dx, onto)?;
            drop((span, s, params));
            source.grad(u, g)?;
            if let Some(d) = d {
                dx = d;
            }
        }
        // Read now that the whole backward is queued: the read waits for the GPU, not the
        // GPU for the host.
        Ok(loss.value()?)
    }

    /// Forward and head of one micro-batch, every block recomputing (nothing is kept): the loss.
    /// Parameters come from `source` in [`Model::gather_order`]`(Pass::Eval)`; the head's unit is
    /// kept from its forward for the head.
    pub fn eval_walk<S: UnitSource>(
        &self,
        source: &mut S,
        tokens: &Tensor,
        targets: &Tensor,
    ) -> std::result::Result<f64, S::Error> {
        let head = self.head_unit();
        let mut x = tokens.clone();
        let mut head_params = None;
        for u in 0..self.layout.units.len() {
            let params = source.params(u)?;
            x = self.forward(u, &params, &x, Recompute::Full)?.0;
            if u == head {
                head_params = Some(params);
            }
        }
        let head_params = head_params.expect("the head's unit is one of the units");
        Ok(self
            .head(head_params.flat(), &x, targets, false)?
            .0
            .value()?)
    }

    /// Mean loss of the whole model on one device; `unit_params` are the flat buffers of
    /// [`Model::units`] in order. The evaluation walk over those buffers.
    pub fn loss(&self, unit_params: &[Tensor], tokens: &Tensor, targets: &Tensor) -> Result<f64> {
        self.check_units(unit_params)?;
        self.eval_walk(&mut Buffers::new(unit_params), tokens, targets)
    }

    /// Loss and the flat gradient of every unit (in unit order, each of its numel elements): the
    /// training walk over full buffers on one device, the reference of the ZeRO engine.
    pub fn loss_and_grads(
        &self,
        unit_params: &[Tensor],
        tokens: &Tensor,
        targets: &Tensor,
        recompute: Recompute,
    ) -> Result<(f64, Vec<Tensor>)> {
        self.check_units(unit_params)?;
        let mut source = Buffers::new(unit_params);
        let loss = self.train_walk(&mut source, tokens, targets, recompute)?;
        let grads = source.grads.into_iter();
        Ok((
            loss,
            grads
                .map(|g| g.expect("a training walk reduces every unit"))
                .collect(),
        ))
    }

    fn check_units(&self, unit_params: &[Tensor]) -> Result<()> {
        if unit_params.len() != self.layout.units.len() {
            return Err(ModelError::UnitCount {
                expected: self.layout.units.len(),
                got: unit_params.len(),
            });
        }
        Ok(())
    }

    /// Training FLOPs per token at sequence length `seq_len`: the family's count
    /// ([`crate::Family::flops_per_token`], `6 N + 6 L C T` unless it says otherwise).
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        self.cfg.family().flops_per_token(&self.cfg, seq_len)
    }

    /// Bytes of activations one block keeps for its backward for `batch` sequences of
    /// `seq_len`, at `bytes` per element (2 for bf16): the family's count
    /// ([`crate::Family::block_activation_bytes`]).
    pub fn block_activation_bytes(&self, batch: usize, seq_len: usize, bytes: usize) -> u64 {
        self.cfg
            .family()
            .block_activation_bytes(&self.cfg, batch, seq_len, bytes, self.linears)
    }

    /// Bytes the FP8 quantisers move (bf16 read, codes written; scales left out) in unit `u`'s
    /// forward and backward over `tokens` positions, `(forward, backward)`; `(0, 0)` for a
    /// unit without linear layers or a model whose layers multiply in the compute dtype. Each
    /// input of the block's linear layers ([`crate::Family::block_linear_inputs`]) is cast in
    /// 1 x 128 blocks in the forward (3 bytes an element) and 128 x 1 blocks in the backward
    /// (3), or both ways in the forward (4) where the block keeps its codes, each output
    /// gradient both ways in one read (4), and each weight into its tiles in each pass (3
    /// bytes a parameter), as `layers/fp8_linear.rs` does on the GPU; an input kept as its
    /// columns' absmax ([`crate::Fp8Kept::ColumnAbsmax`]) is cast as one kept as itself, and
    /// its layer's output gradient read once more (2). With `gathered_codes` (FP8 qwZ) the
    /// weights arrive as codes: the forward transposes them (2 bytes a parameter) and the
    /// backward reads them as they are. A model whose backward keeps the forward's parameters
    /// ([`BackwardParams::Kept`]) quantises each dense weight once, both ways in the forward (4
    /// bytes a parameter), and none in the backward.
    pub fn fp8_cast_bytes(&self, u: usize, tokens: usize, gathered_codes: bool) -> (u64, u64) {
        let unit = &self.layout.units[u];
        if self.linears != LinearFormat::Fp8 || unit.linear_weights().next().is_none() {
            return (0, 0);
        }
        let inputs = self.cfg.family().block_linear_inputs(&self.cfg);
        let (mut kept, mut other, mut absmax_douts) = (0u64, 0u64, 0u64);
        for i in &inputs {
            match i.fp8 {
                crate::Fp8Kept::Codes => kept += i.width as u64,
                crate::Fp8Kept::Input => other += i.width as u64,
                crate::Fp8Kept::ColumnAbsmax { dout_width } => {
                    other += i.width as u64;
                    absmax_douts += dout_width as u64;
                }
            }
        }
        let outputs: usize = unit.linear_weights().map(|p| p.shape[1]).sum();
        let weights: usize = unit.linear_weights().map(|p| p.numel).sum();
        let (t, outputs, weights) = (tokens as u64, outputs as u64, weights as u64);
        let once = self.backward_params == BackwardParams::Kept;
        let (forward_weights, backward_weights) = match (gathered_codes, once) {
            (true, _) => (2 * weights, 0),
            (false, true) => (4 * weights, 0),
            (false, false) => (3 * weights, 3 * weights),
        };
        (
            t * (4 * kept + 3 * other) + forward_weights,
            t * (3 * other + 4 * outputs + 2 * absmax_douts) + backward_weights,
        )
    }

    /// Bytes a training walk holds at its head of the blocks' linear weights kept in FP8 from
    /// their forward for their backward ([`BackwardParams::Kept`] under FP8 compute; 0
    /// otherwise): every block's codes, a byte a weight, and their tile scales (f32, one a
    /// 128 x 128 tile, rows padded to 4). A recomputation transposes the codes again rather
    /// than keep `w^T`'s.
    pub fn kept_fp8_weight_bytes(&self) -> u64 {
        if self.backward_params != BackwardParams::Kept || self.linears != LinearFormat::Fp8 {
            return 0;
        }
        self.layout
            .units
            .iter()
            .flat_map(|u| u.linear_weights())
            .map(|p| {
                let (r, c) = (p.shape[0], p.shape[1]);
                (r * c + 4 * r.div_ceil(128) * c.div_ceil(128).next_multiple_of(4)) as u64
            })
            .sum()
    }

    /// The names, orientation and columns of parameter `p` in the Hugging Face checkpoint of
    /// this model's family ([`crate::Family::hf_tensors`]).
    pub fn hf_tensors(&self, p: &ParamSpec) -> Vec<HfTensor> {
        self.cfg.family().hf_tensors(&self.cfg, p)
    }
}

/// A [`UnitSource`] over full buffers on one device, collecting the gradients.
struct Buffers<'a> {
    params: &'a [Tensor],
    grads: Vec<Option<Tensor>>,
}

impl<'a> Buffers<'a> {
    fn new(params: &'a [Tensor]) -> Self {
        Buffers {
            params,
            grads: vec![None; params.len()],
        }
    }
}

impl UnitSource for Buffers<'_> {
    type Error = ModelError;
    fn params(&mut self, u: usize) -> Result<UnitParams> {
        Ok(UnitParams::dense(self.params[u].clone()))
    }
    fn grad(&mut self, u: usize, grad: Tensor) -> Result<()> {
        self.grads[u] = Some(grad);
        Ok(())
    }
}
