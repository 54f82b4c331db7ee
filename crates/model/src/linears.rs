//! The number format of the blocks' linear layers, and each projection of a block run in it.
//!
//! A run resolves it once from `train.precision` ([`crate::Model::with_linears`]); the
//! families' blocks call their projections through it, so that a block's code is written once
//! for every format. [`LinearFormat::Dense`] multiplies in the compute dtype through the layers
//! of `linear.rs` and `projection.rs` (cuBLASLt on the GPU, with its epilogues);
//! [`LinearFormat::Fp8`] multiplies in FP8 E4M3 with block scales (`layers/fp8_linear.rs`).
//! Everything else (embedding, norms, attention, the head and its loss) is the compute dtype's
//! in both. Only the blocks' linear layers change: a format is a compute recipe, not a shape,
//! so a checkpoint and its export are the same for every format.

use candle_core::Tensor;

use crate::error::{ModelError, Result};
use crate::layers::fp8_linear::{
    backward_saved_with_bias_of, cols_backward_of, cols_backward_saved_of, cols_forward_of,
    cols_forward_saving_of, gelu_linear_backward_of, layernorm_linear_forward_saving_of,
    layernorm_mlp_forward_of, linear_forward_of, linear_forward_saving_of,
    linear_gelu_forward_saving_of, rmsnorm_cols_forward_saving_of, saved_input_of,
    swiglu_down_forward_of, swiglu_mlp_backward_of, Fp8Input,
};
use crate::layers::{
    add_rmsnorm_forward, bias_grad, fp8_round, gelu_backward_bias_grad, layernorm_forward,
    matmul_backward_into, matmul_cols_backward, matmul_cols_bias_forward, matmul_forward,
    matmul_gelu_backward_into, matmul_gelu_forward, residual_matmul_forward, rmsnorm_forward,
    swiglu_packed_backward, swiglu_packed_forward, Fp8Weight, LnSaved, RmsSaved, WEIGHT_TILE,
};

/// What the blocks' linear layers multiply in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinearFormat {
    /// The compute dtype (f32 on the CPU, bf16 on the GPU).
    #[default]
    Dense,
    /// FP8 E4M3 with block scales: `128 x 128` for weights, `1 x 128` or `128 x 1` along the
    /// contraction for activations and gradients (`layers/fp8_linear.rs`).
    Fp8,
}

/// What a linear layer's backward reads of its input `x (N, IN)`, as its forward kept it: `x`
/// itself, or under FP8 `x` in the weight gradient's 128 x 1 blocks, made in the forward's read
/// of `x` ([`Fp8Input`]: 1 byte an element on the GPU, and no pass over `x` in the backward). A
/// block keeps the second where the weight gradient is all it reads `x` for.
#[derive(Clone, Debug)]
pub enum SavedInput {
    Dense(Tensor),
    Fp8(Fp8Input),
}

/// What [`LinearFormat::rmsnorm_cols_forward_saving`] makes: the norm's input `h` (after the
/// residual add), its statistics, the projections' output `y`, and what their backward keeps
/// of the normalised rows `n`.
#[derive(Clone, Debug)]
pub struct NormedProjection {
    pub h: Tensor,
    pub rms: RmsSaved,
    pub y: Tensor,
    pub n: SavedInput,
}

/// What [`LinearFormat::layernorm_mlp_forward`] makes: the norm's statistics, c_fc's output
/// after its bias `h` (GELU's backward reads it), c_fc's and c_proj's kept inputs (the
/// normalised rows `n`, `gelu(h)` as `g`) and the block's output where it was asked for.
#[derive(Clone, Debug)]
pub struct MlpForward {
    pub ln: LnSaved,
    pub h: Tensor,
    pub n: SavedInput,
    pub out: Option<Tensor>,
    pub g: SavedInput,
}

/// A linear layer's weight `(IN, OUT)` as a block hands it to its layer: a view of the unit's
/// dense buffer, or the FP8 codes and tile scales that FP8 qwZ gathered
/// ([`crate::UnitParams::linear`]), which only [`LinearFormat::Fp8`] reads.
#[derive(Clone, Debug)]
pub enum LinearWeight {
    Dense(Tensor),
    Fp8(Fp8Weight),
}

impl LinearWeight {
    /// The dense weight; a gathered FP8 weight is refused (a plan that gathers FP8 weights for
    /// dense layers is a bug in the caller).
    pub fn dense(&self) -> Result<&Tensor> {
        match self {
            LinearWeight::Dense(w) => Ok(w),
            LinearWeight::Fp8(_) => Err(ModelError::Candle(candle_core::Error::Msg(
                "an FP8-gathered weight reached a layer multiplying in the compute dtype".into(),
            ))),
        }
    }

    /// The values an FP8 GEMM multiplies, as f32 (the CPU's reference): the dense weight
    /// rounded in 128 x 128 tiles, or the gathered codes times their scales (the same numbers,
    /// bit for bit).
    pub(crate) fn fp8_values(&self) -> Result<Tensor> {
        match self {
            LinearWeight::Dense(w) => fp8_round(w, WEIGHT_TILE),
            LinearWeight::Fp8(q) => q.dequantize(),
        }
    }
}

fn dense_all(ws: &[LinearWeight]) -> Result<Vec<Tensor>> {
    ws.iter().map(|w| w.dense().cloned()).collect()
}

impl LinearFormat {
    /// Its key in files that record it (`trainer bench --json`'s calibration): `dense`, `fp8`.
    pub fn key(self) -> &'static str {
        match self {
            LinearFormat::Dense => "dense",
            LinearFormat::Fp8 => "fp8",
        }
    }

    /// Its name in messages and `trainer plan`.
    pub fn name(self) -> &'static str {
        match self {
            LinearFormat::Dense => "the compute dtype",
            LinearFormat::Fp8 => "FP8 E4M3 (128-element block scales)",
        }
    }

    // ---- packed projections (the Llama block), as projection.rs ----

    /// `[x @ w_0 | x @ w_1 | ...] (+ bias) (+ residual)`: [`matmul_cols_bias_forward`].
    pub fn cols_forward(
        self,
        x: &Tensor,
        ws: &[LinearWeight],
        bias: Option<&Tensor>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        match self {
            LinearFormat::Dense => matmul_cols_bias_forward(x, &dense_all(ws)?, bias, residual),
            LinearFormat::Fp8 => cols_forward_of(x, ws, bias, residual),
        }
    }

    /// [`LinearFormat::cols_forward`], also returning what its backward reads of `x` where
    /// that is all the caller keeps `x` for: `x` itself in the compute dtype, its FP8 column
    /// blocks under FP8 ([`SavedInput`]).
    pub fn cols_forward_saving(
        self,
        x: &Tensor,
        ws: &[LinearWeight],
        bias: Option<&Tensor>,
        residual: Option<&Tensor>,
    ) -> Result<(Tensor, SavedInput)> {
        match self {
            LinearFormat::Dense => Ok((
                self.cols_forward(x, ws, bias, residual)?,
                SavedInput::Dense(x.clone()),
            )),
            LinearFormat::Fp8 => {
                let (y, saved) = cols_forward_saving_of(x, ws, bias, residual)?;
                Ok((y, SavedInput::Fp8(saved)))
            }
        }
    }

    /// What [`LinearFormat::cols_forward_saving`] keeps of `x`, without the product (a
    /// recomputation that never reads the layer's output).
    pub fn saved_input(self, x: &Tensor) -> Result<SavedInput> {
        Ok(match self {
            LinearFormat::Dense => SavedInput::Dense(x.clone()),
            LinearFormat::Fp8 => SavedInput::Fp8(saved_input_of(x)?),
        })
    }

    /// Gradients of [`LinearFormat::cols_forward`] without the bias's: `(dx, [dw_i])`, each
    /// `dw_i` in `into[i]` where the dense GPU GEMM writes it there
    /// ([`matmul_cols_backward`]), from the input as the forward kept it.
    pub fn cols_backward(
        self,
        dout: &Tensor,
        x: &SavedInput,
        ws: &[LinearWeight],
        into: &[Option<Tensor>],
    ) -> Result<(Tensor, Vec<Tensor>)> {
        match (self, x) {
            (LinearFormat::Dense, SavedInput::Dense(x)) => {
                matmul_cols_backward(dout, x, &dense_all(ws)?, into)
            }
            (LinearFormat::Fp8, SavedInput::Dense(x)) => cols_backward_of(dout, x, ws, into),
            (LinearFormat::Fp8, SavedInput::Fp8(x)) => cols_backward_saved_of(dout, x, ws, into),
            (LinearFormat::Dense, SavedInput::Fp8(_)) => {
                Err(ModelError::Candle(candle_core::Error::Msg(
                    "an FP8-saved input reached a layer multiplying in the compute dtype".into(),
                )))
            }
        }
    }

    /// RMSNorm into packed projections (a Llama block's two norms): `n = rmsnorm(h)` with `h
    /// = x + delta` where `delta` is given (the residual add fused into the norm, as
    /// [`add_rmsnorm_forward`]) or `x` itself, then `[n @ w_0 | ...] (+ bias)`. Under FP8 on
    /// the GPU n exists only as FP8 codes, made from h and the norm's statistics in one pass
    /// (`rmsnorm_cols_forward_saving_of`); otherwise the norm, then
    /// [`LinearFormat::cols_forward_saving`].
    pub fn rmsnorm_cols_forward_saving(
        self,
        x: &Tensor,
        delta: Option<&Tensor>,
        norm_w: &Tensor,
        eps: f64,
        ws: &[LinearWeight],
        bias: Option<&Tensor>,
    ) -> Result<NormedProjection> {
        let (h, rms, y, n) = match self {
            LinearFormat::Dense => {
                let (h, n, rms) = match delta {
                    Some(d) => add_rmsnorm_forward(x, d, norm_w, eps)?,
                    None => {
                        let (n, rms) = rmsnorm_forward(x, norm_w, eps)?;
                        (x.clone(), n, rms)
                    }
                };
                let (y, n) = self.cols_forward_saving(&n, ws, bias, None)?;
                (h, rms, y, n)
            }
            LinearFormat::Fp8 => {
                let (h, rms, y, n) =
                    rmsnorm_cols_forward_saving_of(x, delta, norm_w, eps, ws, bias)?;
                (h, rms, y, SavedInput::Fp8(n))
            }
        };
        Ok(NormedProjection { h, rms, y, n })
    }

    /// RMSNorm of `h` as the projections after it keep it, without the projections: the
    /// norm's statistics and what [`LinearFormat::cols_forward_saving`] keeps of `rmsnorm(h)`
    /// (a recomputation that has the projections' output already). The same numbers as
    /// [`LinearFormat::rmsnorm_cols_forward_saving`] keeps: that norm rounds `h` before it
    /// normalises, and FP8's fused quantiser writes the codes [`LinearFormat::saved_input`] does.
    pub fn rmsnorm_saving(
        self,
        h: &Tensor,
        norm_w: &Tensor,
        eps: f64,
    ) -> Result<(RmsSaved, SavedInput)> {
        let (n, rms) = rmsnorm_forward(h, norm_w, eps)?;
        Ok((rms, self.saved_input(&n)?))
    }

    /// SwiGLU of the packed `gu (N, 2F)` and the down projection after it: `(residual + act @
    /// w_down when want_out, what down's backward keeps of act)`, `act = silu(gate) * up`. Under
    /// FP8 on the GPU act exists only as FP8 codes, made from `gu` in one pass
    /// (`swiglu_down_forward_of`); otherwise [`swiglu_packed_forward`] then
    /// [`LinearFormat::cols_forward_saving`].
    pub fn swiglu_down_forward(
        self,
        gu: &Tensor,
        w_down: &LinearWeight,
        residual: Option<&Tensor>,
        want_out: bool,
    ) -> Result<(Option<Tensor>, SavedInput)> {
        let ws = std::slice::from_ref(w_down);
        match self {
            LinearFormat::Dense => {
                let act = swiglu_packed_forward(gu)?;
                match want_out {
                    true => {
                        let (y, kept) = self.cols_forward_saving(&act, ws, None, residual)?;
                        Ok((Some(y), kept))
                    }
                    false => Ok((None, self.saved_input(&act)?)),
                }
            }
            LinearFormat::Fp8 => {
                let (y, kept) = swiglu_down_forward_of(gu, ws, residual, want_out)?;
                Ok((y, SavedInput::Fp8(kept)))
            }
        }
    }

    /// Gradients of a Llama MLP, [`LinearFormat::swiglu_down_forward`] after gate|up (`gu = n2
    /// @ gate_up`), from the residual gradient `dout (N, C)`: `(dn2, dw_down, [dw_gate_up])`,
    /// each weight gradient in its slot where the GPU's GEMM writes it there. Under FP8 down's
    /// weight gradient scales its operands a whole column at a time, and on the GPU neither
    /// dgu nor act is made in bf16 (`swiglu_mlp_backward_of`); otherwise down's
    /// [`LinearFormat::cols_backward`], [`swiglu_packed_backward`], then gate|up's.
    pub fn swiglu_mlp_backward(
        self,
        dout: &Tensor,
        gu: &Tensor,
        (act, n2): (&SavedInput, &SavedInput),
        (w_down, gate_up): (&LinearWeight, &[LinearWeight]),
        (down_into, gate_up_into): (Option<&Tensor>, &[Option<Tensor>]),
    ) -> Result<(Tensor, Tensor, Vec<Tensor>)> {
        if let (LinearFormat::Fp8, SavedInput::Fp8(act), SavedInput::Fp8(n2)) = (self, act, n2) {
            return swiglu_mlp_backward_of(
                dout,
                gu,
                (act, n2),
                (w_down, gate_up),
                (down_into.cloned(), gate_up_into),
            );
        }
        let down = std::slice::from_ref(w_down);
        let (dact, mut dw) = self.cols_backward(dout, act, down, &[down_into.cloned()])?;
        let dgu = swiglu_packed_backward(&dact, gu)?;
        let (dn2, dws) = self.cols_backward(&dgu, n2, gate_up, gate_up_into)?;
        Ok((dn2, dw.pop().expect("one weight"), dws))
    }

    // ---- one projection with a bias (the GPT-2 block), as linear.rs ----

    /// `x @ w + b` ([`matmul_forward`]), and what its backward reads of `x` ([`SavedInput`]:
    /// under FP8 its column blocks, made in the forward's read).
    pub fn forward(self, x: &Tensor, w: &LinearWeight, b: &Tensor) -> Result<(Tensor, SavedInput)> {
        match self {
            LinearFormat::Dense => Ok((
                matmul_forward(x, w.dense()?, b)?,
                SavedInput::Dense(x.clone()),
            )),
            LinearFormat::Fp8 => {
                let (y, kept) = linear_forward_saving_of(x, w, b, None)?;
                Ok((y, SavedInput::Fp8(kept)))
            }
        }
    }

    /// LayerNorm into a linear layer with a bias: `(the norm's statistics, layernorm(x) @ w +
    /// b, what the layer's backward keeps of the normalised rows)`. Under FP8 on the GPU the
    /// normalised rows exist only as FP8 codes, made from `x` and the norm's statistics in one
    /// pass (`layernorm_linear_forward_saving_of`); otherwise [`layernorm_forward`], then
    /// [`LinearFormat::forward`].
    pub fn layernorm_linear_forward(
        self,
        x: &Tensor,
        ln: (&Tensor, &Tensor),
        w: &LinearWeight,
        b: &Tensor,
    ) -> Result<(LnSaved, Tensor, SavedInput)> {
        let (saved, y, _, kept) = self.layernorm_linear(x, ln, w, b, false)?;
        Ok((saved, y, kept))
    }

    /// [`LinearFormat::layernorm_linear_forward`] with GELU after the layer: `(the norm's
    /// statistics, h, gelu(h), what the layer's backward keeps)`, as
    /// [`LinearFormat::gelu_forward`] after the norm.
    pub fn layernorm_gelu_forward(
        self,
        x: &Tensor,
        ln: (&Tensor, &Tensor),
        w: &LinearWeight,
        b: &Tensor,
    ) -> Result<(LnSaved, Tensor, Tensor, SavedInput)> {
        let (saved, h, g, kept) = self.layernorm_linear(x, ln, w, b, true)?;
        Ok((saved, h, g.expect("asked for gelu(h)"), kept))
    }

    fn layernorm_linear(
        self,
        x: &Tensor,
        (ln_w, ln_b): (&Tensor, &Tensor),
        w: &LinearWeight,
        b: &Tensor,
        gelu: bool,
    ) -> Result<(LnSaved, Tensor, Option<Tensor>, SavedInput)> {
        match self {
            LinearFormat::Dense => {
                let (n, ln) = layernorm_forward(x, ln_w, ln_b)?;
                Ok(match gelu {
                    true => {
                        let (h, g, kept) = self.gelu_forward(&n, w, b)?;
                        (ln, h, Some(g), kept)
                    }
                    false => {
                        let (y, kept) = self.forward(&n, w, b)?;
                        (ln, y, None, kept)
                    }
                })
            }
            LinearFormat::Fp8 => {
                let (ln, h, g, kept) =
                    layernorm_linear_forward_saving_of(x, (ln_w, ln_b), w, b, gelu)?;
                Ok((ln, h, g, SavedInput::Fp8(kept)))
            }
        }
    }

    /// GPT-2's MLP after its norm: `ln_2(x)` into c_fc and GELU, then into c_proj with the
    /// residual `x` where `want_out` (a recomputation never reads the block's output). Under FP8
    /// on the GPU neither the normalised rows nor `gelu(h)` exists in bf16
    /// (`layernorm_mlp_forward_of`); otherwise [`LinearFormat::layernorm_gelu_forward`], then
    /// [`LinearFormat::residual_forward_saving`] (or [`LinearFormat::saved_input`]).
    pub fn layernorm_mlp_forward(
        self,
        x: &Tensor,
        ln: (&Tensor, &Tensor),
        fc: (&LinearWeight, &Tensor),
        proj: (&LinearWeight, &Tensor),
        want_out: bool,
    ) -> Result<MlpForward> {
        match self {
            LinearFormat::Dense => {
                let (ln, h, g, n) = self.layernorm_gelu_forward(x, ln, fc.0, fc.1)?;
                let (out, g) = match want_out {
                    true => {
                        let (out, g) = self.residual_forward_saving(x, &g, proj.0, proj.1)?;
                        (Some(out), g)
                    }
                    false => (None, self.saved_input(&g)?),
                };
                Ok(MlpForward { ln, h, n, out, g })
            }
            LinearFormat::Fp8 => layernorm_mlp_forward_of(x, ln, fc, proj, want_out),
        }
    }

    /// `residual + x @ w + b`: [`residual_matmul_forward`], for an `x` the block keeps anyway
    /// (attention's output).
    pub fn residual_forward(
        self,
        residual: &Tensor,
        x: &Tensor,
        w: &LinearWeight,
        b: &Tensor,
    ) -> Result<Tensor> {
        match self {
            LinearFormat::Dense => residual_matmul_forward(residual, x, w.dense()?, b),
            LinearFormat::Fp8 => linear_forward_of(x, w, Some(b), Some(residual)),
        }
    }

    /// [`LinearFormat::residual_forward`], also returning what its backward reads of `x`.
    pub fn residual_forward_saving(
        self,
        residual: &Tensor,
        x: &Tensor,
        w: &LinearWeight,
        b: &Tensor,
    ) -> Result<(Tensor, SavedInput)> {
        match self {
            LinearFormat::Dense => Ok((
                residual_matmul_forward(residual, x, w.dense()?, b)?,
                SavedInput::Dense(x.clone()),
            )),
            LinearFormat::Fp8 => {
                let (y, kept) = linear_forward_saving_of(x, w, b, Some(residual))?;
                Ok((y, SavedInput::Fp8(kept)))
            }
        }
    }

    /// `h = x @ w + b`, `gelu(h)` ([`matmul_gelu_forward`]) and what the backward reads of `x`.
    pub fn gelu_forward(
        self,
        x: &Tensor,
        w: &LinearWeight,
        b: &Tensor,
    ) -> Result<(Tensor, Tensor, SavedInput)> {
        match self {
            LinearFormat::Dense => {
                let (h, g) = matmul_gelu_forward(x, w.dense()?, b)?;
                Ok((h, g, SavedInput::Dense(x.clone())))
            }
            LinearFormat::Fp8 => {
                let (h, g, kept) = linear_gelu_forward_saving_of(x, w, b)?;
                Ok((h, g, SavedInput::Fp8(kept)))
            }
        }
    }

    /// Gradients of [`LinearFormat::forward`] from what it kept of `x`: `(dx, dw, db when
    /// want_db)`, `dw` written into `dw_into` where the GPU's GEMM can
    /// ([`matmul_backward_into`]).
    pub fn backward_into(
        self,
        dout: &Tensor,
        x: &SavedInput,
        w: &LinearWeight,
        dw_into: Option<&Tensor>,
        want_db: bool,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        match (self, x) {
            (LinearFormat::Dense, SavedInput::Dense(x)) => {
                matmul_backward_into(dout, x, w.dense()?, dw_into, want_db)
            }
            (LinearFormat::Fp8, SavedInput::Fp8(x)) if want_db => {
                let (dx, dw, db) = backward_saved_with_bias_of(dout, x, w, dw_into.cloned())?;
                Ok((dx, dw, Some(db)))
            }
            _ => {
                let ws = std::slice::from_ref(w);
                let (dx, mut dws) = self.cols_backward(dout, x, ws, &[dw_into.cloned()])?;
                let db = want_db.then(|| bias_grad(dout)).transpose()?;
                Ok((dx, dws.pop().expect("one weight"), db))
            }
        }
    }

    /// Gradients of GPT-2's MLP after its norm, `out = gelu(h) @ w_proj + b_proj` with
    /// `h = n @ w_fc + b_fc`, from what the forward kept of `g = gelu(h)` and of `n`:
    /// `(dn, [dw_proj, db_proj, dw_fc, db_fc])`, each weight gradient in its slot where the GPU
    /// GEMM writes it there.
    /// Dense: [`matmul_gelu_backward_into`] (GELU's backward and c_fc's bias gradient in
    /// c_proj's GEMM epilogue), then c_fc's backward. FP8: c_proj's backward, then GELU's with
    /// c_fc's ([`gelu_linear_backward_of`]: on the GPU GELU's gradient goes into FP8 in the
    /// kernel that makes it).
    pub fn mlp_backward_into(
        self,
        dout: &Tensor,
        (g, h): (&SavedInput, &Tensor),
        n: &SavedInput,
        (w_proj, w_fc): (&LinearWeight, &LinearWeight),
        (proj_into, fc_into): (Option<&Tensor>, Option<&Tensor>),
    ) -> Result<(Tensor, [Tensor; 4])> {
        let (dh, dw_proj, db_proj, db_fc) = match (self, g) {
            (LinearFormat::Dense, SavedInput::Dense(g)) => {
                matmul_gelu_backward_into(dout, g, w_proj.dense()?, h, proj_into)?
            }
            _ => {
                let (dg, dw, db) = self.backward_into(dout, g, w_proj, proj_into, true)?;
                let db = db.expect("asked for db");
                if let (LinearFormat::Fp8, SavedInput::Fp8(n)) = (self, n) {
                    let (dn, dw_fc, db_fc) =
                        gelu_linear_backward_of(&dg, h, n, w_fc, fc_into.cloned())?;
                    return Ok((dn, [dw, db, dw_fc, db_fc]));
                }
                let (dh, db_fc) = gelu_backward_bias_grad(&dg, h)?;
                (dh, dw, db, db_fc)
            }
        };
        let (dn, dw_fc, _) = self.backward_into(&dh, n, w_fc, fc_into, false)?;
        Ok((dn, [dw_proj, db_proj, dw_fc, db_fc]))
    }
}
