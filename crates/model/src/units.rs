//! What every unit's forward and backward check and share: the flat parameter buffer, the
//! `(B, T)` token and `(B, T, C)` activation shapes, the concatenation of named gradients
//! into the unit's flat layout, and what a block keeps for its backward ([`Kept`]: every
//! activation, or its input alone for recomputation).

use candle_core::{DType, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{crossentropy_forward_backward, Loss};
use crate::layout::UnitLayout;
use crate::recompute::Recompute;

/// Checks that `params` is 1-D with at least `unit.numel` elements.
pub(crate) fn check_params(params: &Tensor, unit: &UnitLayout, what: &'static str) -> Result<()> {
    match params.dims() {
        [n] if *n >= unit.numel => Ok(()),
        d => Err(ModelError::ParamsTooShort {
            unit: what,
            expected: unit.numel,
            got: d.to_vec(),
        }),
    }
}

/// Checks a `(B, T)` u32 token/target tensor against `cfg`; returns `(B, T)`.
pub(crate) fn check_tokens(
    cfg: &ModelConfig,
    tokens: &Tensor,
    what: &'static str,
) -> Result<(usize, usize)> {
    if tokens.dtype() != DType::U32 {
        return Err(ModelError::TokenDType {
            what,
            got: tokens.dtype(),
        });
    }
    let (b, t) = match tokens.dims() {
        [b, t] => (*b, *t),
        d => {
            return Err(ModelError::ShapeMismatch {
                what,
                expected: vec![0, cfg.seq_len],
                got: d.to_vec(),
            })
        }
    };
    if t > cfg.seq_len {
        return Err(ModelError::SequenceTooLong {
            got: t,
            max: cfg.seq_len,
        });
    }
    Ok((b, t))
}

/// Checks that `x` is `(B, T, C)` (with `T <= seq_len`); returns `(B, T)`.
pub(crate) fn check_acts(
    cfg: &ModelConfig,
    x: &Tensor,
    what: &'static str,
) -> Result<(usize, usize)> {
    match x.dims() {
        [b, t, c] if *c == cfg.n_embd && *t <= cfg.seq_len => Ok((*b, *t)),
        d => Err(ModelError::ShapeMismatch {
            what,
            expected: vec![d.first().copied().unwrap_or(0), cfg.seq_len, cfg.n_embd],
            got: d.to_vec(),
        }),
    }
}

/// Concatenates named gradients into the unit's flat layout. Order and shapes come from the
/// layout table; every parameter must be present exactly once.
pub(crate) fn flatten_grads(unit: &UnitLayout, grads: Vec<(&str, Tensor)>) -> Result<Tensor> {
    debug_assert_eq!(grads.len(), unit.params.len());
    let mut parts = Vec::with_capacity(unit.params.len());
    for spec in &unit.params {
        let (_, g) = grads
            .iter()
            .find(|(short, _)| unit.param(short).name == spec.name)
            .unwrap_or_else(|| panic!("no gradient for {}", spec.name));
        if g.dims() != spec.shape.as_slice() {
            return Err(ModelError::ShapeMismatch {
                what: "parameter gradient",
                expected: spec.shape.clone(),
                got: g.dims().to_vec(),
            });
        }
        parts.push(g.flatten_all()?);
    }
    Ok(Tensor::cat(&parts, 0)?)
}

/// A unit's flat gradient, filled parameter by parameter: the buffer of length `unit.numel`
/// that a backward returns, with a *slot* for each parameter (a view shaped like it). A GPU
/// kernel handed a slot (the layers' `into` arguments) writes the gradient straight into the
/// buffer; any other gradient is copied in by [`FlatGrad::put`]. So no backward concatenates
/// its gradients on the GPU, and the CPU reference shares the same code.
///
/// Every parameter's gradient goes through [`FlatGrad::put`] (a no-op for one a kernel wrote
/// into its slot), which records it; [`FlatGrad::finish`] zeroes the parameters it never saw.
/// So the buffer starts unwritten on the GPU instead of zeroed: a block's backward writes every
/// element, and a zeroing pass over it (a Llama 3.2 1B block's 122 MB, about 0.7 ms of the
/// step at 16 blocks on an H100) would be wasted. On the CPU it starts as NaN, so that a
/// parameter left out of both would show in every test.
pub(crate) struct FlatGrad<'a> {
    unit: &'a UnitLayout,
    flat: Tensor,
    /// Whether each of `unit.params` went through `put`.
    put: std::cell::RefCell<Vec<bool>>,
}

impl<'a> FlatGrad<'a> {
    /// A buffer of `unit.numel` elements, none of them written yet (module doc).
    pub(crate) fn new(
        unit: &'a UnitLayout,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Result<Self> {
        let flat = match device {
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(dev) => crate::gpu::uninit(unit.numel, dtype, dev)?,
            _ => Tensor::full(f32::NAN, unit.numel, device)?.to_dtype(dtype)?,
        };
        Ok(FlatGrad {
            unit,
            flat,
            put: std::cell::RefCell::new(vec![false; unit.params.len()]),
        })
    }

    /// The slot of parameter `short`: a view of the buffer shaped like the parameter. What a
    /// kernel writes there counts once [`FlatGrad::put`] has seen it.
    pub(crate) fn slot(&self, short: &str) -> Result<Tensor> {
        self.unit.param(short).view(&self.flat)
    }

    /// Stores `g` as the gradient of parameter `short`: nothing to do when a kernel wrote it
    /// into its slot, a copy otherwise.
    pub(crate) fn put(&self, short: &str, g: &Tensor) -> Result<()> {
        let spec = self.unit.param(short);
        if g.dims() != spec.shape.as_slice() {
            return Err(ModelError::ShapeMismatch {
                what: "parameter gradient",
                expected: spec.shape.clone(),
                got: g.dims().to_vec(),
            });
        }
        if let Some(i) = self.unit.params.iter().position(|p| p.name == spec.name) {
            self.put.borrow_mut()[i] = true;
        }
        #[cfg(feature = "cuda")]
        if g.device().is_cuda()
            && g.dtype() == self.flat.dtype()
            && g.is_contiguous()
            && crate::gpu::ptr(g)? == crate::gpu::ptr(&spec.view(&self.flat)?)?
        {
            return Ok(());
        }
        let g = g.to_dtype(self.flat.dtype())?.flatten_all()?.contiguous()?;
        Ok(self.flat.slice_set(&g, 0, spec.offset)?)
    }

    /// The filled buffer, zeros where no gradient was put (the parameters tile the buffer with
    /// no gaps: `layout`'s tests hold the offsets to that).
    pub(crate) fn finish(self) -> Result<Tensor> {
        let put = self.put.into_inner();
        for (spec, _) in self.unit.params.iter().zip(put).filter(|(_, p)| !p) {
            let zeros = Tensor::zeros(spec.numel, self.flat.dtype(), self.flat.device())?;
            self.flat.slice_set(&zeros, 0, spec.offset)?;
        }
        Ok(self.flat)
    }
}

/// The LM head and mean cross-entropy over all `B*T` positions, every family's: logits
/// `(N, V) = x @ W^T` with `W (V, C)` the parameter `head` of `unit` (the embedding's token
/// matrix when tied, the final norm's `lm_head` otherwise), a view of `head_params`, that
/// unit's flat buffer. `x (B, T, C)` is the final norm's output, `targets (B, T)` u32.
///
/// With `grad`, also `(dx (B, T, C), flat gradient of the head's unit)`, nonzero only in `W`'s
/// part. Returned, not accumulated: the caller adds it to that unit's other gradient.
pub(crate) fn head_loss(
    cfg: &ModelConfig,
    (unit, head): (&UnitLayout, &str),
    head_params: &Tensor,
    x: &Tensor,
    targets: &Tensor,
    grad: bool,
) -> Result<(Loss, Option<(Tensor, Tensor)>)> {
    check_params(head_params, unit, "lm head")?;
    let (b, t) = check_acts(cfg, x, "lm head input")?;
    let (tb, tt) = check_tokens(cfg, targets, "targets")?;
    if (tb, tt) != (b, t) {
        return Err(ModelError::ShapeMismatch {
            what: "targets",
            expected: vec![b, t],
            got: vec![tb, tt],
        });
    }
    let c = cfg.n_embd;
    let w = unit.param(head).view(head_params)?;
    let (loss, grads) =
        crossentropy_forward_backward(&x.reshape((b * t, c))?, &w, &targets.flatten_all()?, grad)?;
    let Some((dx, dw)) = grads else {
        return Ok((loss, None));
    };
    let head_name = &unit.param(head).name;
    let mut parts = Vec::with_capacity(unit.params.len());
    for spec in &unit.params {
        if &spec.name == head_name {
            parts.push((head, dw.clone()));
        } else {
            let zeros = Tensor::zeros(spec.shape.as_slice(), dw.dtype(), dw.device())?;
            parts.push((spec.name.as_str(), zeros));
        }
    }
    let flat = flatten_grads(unit, parts)?;
    Ok((loss, Some((dx.reshape((b, t, c))?, flat))))
}

/// The logits `(V)` of `y (1, 1, C)`, the final norm's output at a sequence's last position:
/// `y @ W^T` with `W (V, C)` the parameter `head` of `unit`, a view of `head_params` (see
/// [`head_loss`]). In the parameters' dtype.
pub(crate) fn last_logits(
    cfg: &ModelConfig,
    (unit, head): (&UnitLayout, &str),
    head_params: &Tensor,
    y: &Tensor,
) -> Result<Tensor> {
    check_params(head_params, unit, "lm head")?;
    let w = unit.param(head).view(head_params)?;
    Ok(y.reshape((1, cfg.n_embd))?
        .matmul(&w.t()?)?
        .reshape(cfg.vocab_size)?)
}

/// What a block's forward keeps for its backward ([`Recompute`]): every activation `A` the
/// backward reads; the block's input alone (activation checkpointing), from which the backward
/// recomputes them; or the input and the MLP half's activations `M`, from which it recomputes
/// the attention half's. One wrapper for every family's blocks, so that each writes only its
/// forward, its backward and the attention half's recomputation.
#[derive(Clone, Debug)]
pub(crate) enum Kept<A, M> {
    Full(Box<A>),
    Input(Tensor),
    Mlp(Tensor, M),
}

impl<A, M> Kept<A, M> {
    /// `acts` whole, or what `mode` keeps of them: `keep` takes out the input and the MLP
    /// half's activations (the latter dropped under [`Recompute::Full`]).
    pub(crate) fn new(acts: A, mode: Recompute, keep: impl FnOnce(A) -> (Tensor, M)) -> Self {
        match mode {
            Recompute::Off => Kept::Full(Box::new(acts)),
            Recompute::Full => Kept::Input(keep(acts).0),
            Recompute::Attention => {
                let (x, m) = keep(acts);
                Kept::Mlp(x, m)
            }
        }
    }

    /// What was kept, as the mode that kept it.
    pub(crate) fn mode(&self) -> Recompute {
        match self {
            Kept::Full(_) => Recompute::Off,
            Kept::Input(_) => Recompute::Full,
            Kept::Mlp(..) => Recompute::Attention,
        }
    }

    /// The activations: as kept, recomputed from the kept input by `forward`, or from the
    /// input and the MLP half's activations by `attention_half`.
    pub(crate) fn acts(
        &self,
        forward: impl FnOnce(&Tensor) -> Result<A>,
        attention_half: impl FnOnce(&Tensor, &M) -> Result<A>,
    ) -> Result<Acts<'_, A>> {
        Ok(match self {
            Kept::Full(a) => Acts::Kept(a),
            Kept::Input(x) => Acts::Recomputed(forward(x)?),
            Kept::Mlp(x, m) => Acts::Recomputed(attention_half(x, m)?),
        })
    }
}

/// [`Kept::acts`]: the kept activations, or the ones recomputed for this backward.
pub(crate) enum Acts<'a, A> {
    Kept(&'a A),
    Recomputed(A),
}

impl<A> std::ops::Deref for Acts<'_, A> {
    type Target = A;

    fn deref(&self) -> &A {
        match self {
            Acts::Kept(a) => a,
            Acts::Recomputed(a) => a,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::UnitKind;
    use candle_core::Device;

    /// A gradient put in (copied or, on the GPU, already in its slot) is kept as it is; a
    /// parameter no backward put anything for comes out zero, not the unwritten buffer's
    /// contents (NaN on the CPU).
    #[test]
    fn a_flat_gradient_zeroes_what_was_never_put() {
        let cfg = crate::preset("llama-tiny").unwrap();
        let unit = UnitLayout::new(&cfg, UnitKind::Block(0), 0);
        let grads = FlatGrad::new(&unit, DType::F32, &Device::Cpu).unwrap();
        let first = &unit.params[0];
        let short = first
            .name
            .rsplit_once("layers.0.")
            .map_or(&*first.name, |(_, s)| s);
        let g = Tensor::full(3f32, first.shape.as_slice(), &Device::Cpu).unwrap();
        grads.put(short, &g).unwrap();
        let flat = grads.finish().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat.len(), unit.numel);
        assert!(flat[..first.numel].iter().all(|&v| v == 3.0));
        assert!(flat[first.numel..].iter().all(|&v| v == 0.0));
    }
}
