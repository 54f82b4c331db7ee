use std::ops::Range;

use candle_core::{DType, Device, Tensor};

use crate::GradShard;

/// AdamW with decoupled weight decay (Loshchilov & Hutter; PyTorch's `AdamW`), applied to one
/// flat fp32 shard at a time. Moments are fp32 whatever the compute precision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamW {
    /// GPT training's usual setting: betas (0.9, 0.95), eps 1e-8, weight decay 0.1.
    fn default() -> Self {
        AdamW {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

/// The sub-ranges of a shard whose elements take weight decay (matrices and embeddings, not
/// biases or norm weights), relative to the shard's start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecayRanges(pub Vec<Range<usize>>);

impl DecayRanges {
    /// Intersects the unit-level `decayed` ranges with the shard `shard` and rebases them.
    pub fn for_shard(decayed: &[Range<usize>], shard: &Range<usize>) -> Self {
        let mut out = Vec::new();
        for r in decayed {
            let (lo, hi) = (r.start.max(shard.start), r.end.min(shard.end));
            if lo < hi {
                out.push(lo - shard.start..hi - shard.start);
            }
        }
        DecayRanges(out)
    }
}

/// The update's scalars, computed once a step in f64 from the optimizer's settings, the
/// learning rate and the step, each rounded once to f32 (the arithmetic of an element is f32,
/// as PyTorch's fused AdamW's is). The CUDA kernel takes them as they are (`struct Scalars` of
/// `adamw.cu`), so both devices compute with the same values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Scalars {
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub eps: f32,
    /// `1 - lr * weight_decay`: decayed elements are multiplied by it first.
    pub decay_factor: f32,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f32,
    /// `1 / sqrt(1 - beta2^t)`.
    pub inv_sqrt_bc2: f32,
    /// The gradient clipping coefficient (1 when the norm is within the clip).
    pub clip: f32,
}

impl AdamW {
    /// The scalars of step `t` (1-based) at learning rate `lr` with clipping coefficient `clip`.
    pub(crate) fn scalars(&self, clip: f64, lr: f64, t: u64) -> Scalars {
        let bc1 = 1.0 - self.beta1.powi(t as i32);
        let bc2 = 1.0 - self.beta2.powi(t as i32);
        Scalars {
            beta1: self.beta1 as f32,
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            eps: self.eps as f32,
            decay_factor: (1.0 - lr * self.weight_decay) as f32,
            step_size: (lr / bc1) as f32,
            inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
            clip: clip as f32,
        }
    }

    /// One update of `param` from `grad` x `grad_coef` at optimizer step `t` (1-based):
    /// [`AdamW::update_scaled`] with scale 1.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &self,
        param: &mut [f32],
        grad: &[f32],
        exp_avg: &mut [f32],
        exp_avg_sq: &mut [f32],
        decay: &DecayRanges,
        grad_coef: f64,
        lr: f64,
        t: u64,
    ) {
        self.update_scaled(
            param, grad, 1.0, exp_avg, exp_avg_sq, decay, grad_coef, lr, t,
        );
    }

    /// One update of `param` from the gradient `(grad x scale) x clip` (zero past the end of
    /// `grad`, which may be shorter than `param`) at optimizer step `t` (1-based), in f32:
    ///
    /// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g g`, then
    /// `param = param (1 - lr wd) - (lr / bc1) m / (sqrt(v) (1 / sqrt(bc2)) + eps)`, the decay
    /// factor on decayed elements only. Reads `grad`, does not clear it.
    #[allow(clippy::too_many_arguments)]
    pub fn update_scaled(
        &self,
        param: &mut [f32],
        grad: &[f32],
        scale: f32,
        exp_avg: &mut [f32],
        exp_avg_sq: &mut [f32],
        decay: &DecayRanges,
        clip: f64,
        lr: f64,
        t: u64,
    ) {
        let s = self.scalars(clip, lr, t);
        let mut decayed = decay.0.iter().peekable();
        for i in 0..param.len() {
            while decayed.peek().is_some_and(|r| r.end <= i) {
                decayed.next();
            }
            let raw = grad.get(i).copied().unwrap_or(0.0);
            let g = raw * scale * s.clip;
            let m = s.beta1 * exp_avg[i] + s.one_minus_beta1 * g;
            let v = s.beta2 * exp_avg_sq[i] + s.one_minus_beta2 * g * g;
            exp_avg[i] = m;
            exp_avg_sq[i] = v;
            let denom = v.sqrt() * s.inv_sqrt_bc2 + s.eps;
            let p = match decayed.peek() {
                Some(r) if r.contains(&i) => param[i] * s.decay_factor,
                _ => param[i],
            };
            param[i] = p - s.step_size * m / denom;
        }
    }

    /// [`AdamW::update`] on tensors, on whichever device they live: returns the new
    /// (param, exp_avg, exp_avg_sq). All four inputs are 1-D contiguous F32 of one length, on
    /// one device. CPU tensors go through `update`; CUDA tensors (feature `cuda`) through one
    /// kernel that gives the same bits (`optimizer_cuda.rs`), with no host synchronisation.
    /// `decay`'s ranges must be sorted and disjoint (as `update` assumes too).
    #[allow(clippy::too_many_arguments)]
    pub fn update_tensors(
        &self,
        param: &Tensor,
        grad: &Tensor,
        exp_avg: &Tensor,
        exp_avg_sq: &Tensor,
        decay: &DecayRanges,
        grad_coef: f64,
        lr: f64,
        t: u64,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let grad = GradShard::f32(grad.clone());
        let (p, m, v, _) = self.update_tensors_with_copy(
            param, &grad, exp_avg, exp_avg_sq, decay, grad_coef, lr, t, None,
        )?;
        Ok((p, m, v))
    }

    /// [`AdamW::update_tensors`], and with `copy = Some(dtype)` also the new parameters in
    /// `dtype` (the engine's working copy in the compute dtype, which its gathers read instead
    /// of casting the master again): on the GPU written by the update's own kernel (2 bytes an
    /// element more for bf16, no pass of its own), elsewhere cast. Equal, bit for bit, to
    /// casting the returned parameters. The gradient is a [`GradShard`]: an f32 shard, or a
    /// unit's bf16 gradient with its scale (read as it is, 2 bytes an element).
    #[allow(clippy::too_many_arguments)]
    pub fn update_tensors_with_copy(
        &self,
        param: &Tensor,
        grad: &GradShard,
        exp_avg: &Tensor,
        exp_avg_sq: &Tensor,
        decay: &DecayRanges,
        grad_coef: f64,
        lr: f64,
        t: u64,
        copy: Option<DType>,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor, Option<Tensor>)> {
        let n = param.elem_count();
        let values = grad.values();
        if values.rank() != 1
            || !values.is_contiguous()
            || !matches!(values.dtype(), DType::F32 | DType::BF16)
            || values.elem_count() > n
            || !values.device().same_device(param.device())
        {
            candle_core::bail!(
                "AdamW: grad must be 1-D contiguous F32 or BF16 of at most {n} elements on the \
                 device of param, got {:?} {:?}",
                values.dims(),
                values.dtype()
            );
        }
        for (what, x) in [
            ("param", param),
            ("exp_avg", exp_avg),
            ("exp_avg_sq", exp_avg_sq),
        ] {
            if x.rank() != 1 || !x.is_contiguous() || x.dtype() != DType::F32 {
                candle_core::bail!(
                    "AdamW: {what} must be 1-D contiguous F32, got {:?} {:?}",
                    x.dims(),
                    x.dtype()
                );
            }
            if x.elem_count() != n {
                candle_core::bail!("AdamW: {what} has {} elements, param {n}", x.elem_count());
            }
            if !x.device().same_device(param.device()) {
                candle_core::bail!("AdamW: {what} is not on the device of param");
            }
        }
        match param.device() {
            Device::Cpu => {
                let mut p = param.to_vec1::<f32>()?;
                let mut m = exp_avg.to_vec1::<f32>()?;
                let mut v = exp_avg_sq.to_vec1::<f32>()?;
                let g = values.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                let scale = grad.scale();
                self.update_scaled(&mut p, &g, scale, &mut m, &mut v, decay, grad_coef, lr, t);
                let dev = &Device::Cpu;
                let p = Tensor::from_vec(p, n, dev)?;
                let copy = copy.map(|d| p.to_dtype(d)).transpose()?;
                Ok((
                    p,
                    Tensor::from_vec(m, n, dev)?,
                    Tensor::from_vec(v, n, dev)?,
                    copy,
                ))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => {
                let (p, m, v, bf16) = crate::optimizer_cuda::update(
                    dev,
                    param,
                    grad,
                    exp_avg,
                    exp_avg_sq,
                    &decay.0,
                    &self.scalars(grad_coef, lr, t),
                    copy == Some(DType::BF16),
                )?;
                let copy = match (copy, bf16) {
                    (_, Some(b)) => Some(b),
                    (Some(d), None) => Some(p.to_dtype(d)?),
                    (None, None) => None,
                };
                Ok((p, m, v, copy))
            }
            #[allow(unreachable_patterns)]
            d => candle_core::bail!("AdamW: no kernel for device {:?}", d.location()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    fn opt() -> AdamW {
        AdamW {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }

    #[test]
    fn first_step_moves_each_element_by_lr_times_sign() {
        // At t = 1, m_hat = g and v_hat = g^2, so the step is lr * sign(g) (+ decay).
        let mut p = vec![1.0f32, 1.0, 1.0];
        let (mut m, mut v) = (vec![0.0; 3], vec![0.0; 3]);
        let decay = DecayRanges([0..1].to_vec());
        opt().update(
            &mut p,
            &[0.5, -2.0, 0.0],
            &mut m,
            &mut v,
            &decay,
            1.0,
            0.01,
            1,
        );
        assert!((p[0] - (1.0 - 0.01 * (1.0 + 0.1))).abs() < 1e-6);
        assert!((p[1] - 1.01).abs() < 1e-6);
        assert_eq!(p[2], 1.0);
    }

    #[test]
    fn matches_a_plain_reference_over_several_steps() {
        let o = opt();
        let grads = [[0.3f32, -0.1], [0.2, 0.4], [-0.5, 0.05]];
        let (mut p, mut m, mut v) = (vec![0.5f32, -0.25], vec![0.0; 2], vec![0.0; 2]);
        let (mut rp, mut rm, mut rv) = ([0.5f64, -0.25], [0.0f64; 2], [0.0f64; 2]);
        for (t, g) in grads.iter().enumerate() {
            let t = t as u64 + 1;
            o.update(
                &mut p,
                g,
                &mut m,
                &mut v,
                &DecayRanges([0..2].to_vec()),
                0.5,
                0.1,
                t,
            );
            for i in 0..2 {
                let gi = g[i] as f64 * 0.5;
                rm[i] = 0.9 * rm[i] + 0.1 * gi;
                rv[i] = 0.95 * rv[i] + 0.05 * gi * gi;
                rp[i] *= 1.0 - 0.1 * 0.1;
                let mh = rm[i] / (1.0 - 0.9f64.powi(t as i32));
                let vh = rv[i] / (1.0 - 0.95f64.powi(t as i32));
                rp[i] -= 0.1 * mh / (vh.sqrt() + 1e-8);
            }
        }
        for i in 0..2 {
            assert!((p[i] as f64 - rp[i]).abs() < 1e-6, "{} vs {}", p[i], rp[i]);
        }
    }

    #[test]
    fn update_tensors_on_cpu_equals_update() {
        let o = opt();
        let n = 300;
        let decay = DecayRanges(vec![10..100, 150..151, 200..290]);
        let mut p: Vec<f32> = (0..n)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.03)
            .collect();
        let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
        let dev = &Device::Cpu;
        let mut tp = Tensor::from_vec(p.clone(), n, dev).unwrap();
        let mut tm = Tensor::zeros(n, DType::F32, dev).unwrap();
        let mut tv = Tensor::zeros(n, DType::F32, dev).unwrap();
        for t in 1..=3u64 {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 13 + t as usize * 5) % 31) as f32 * 0.01 - 0.15)
                .collect();
            o.update(&mut p, &g, &mut m, &mut v, &decay, 0.25, 0.01, t);
            let tg = Tensor::from_vec(g, n, dev).unwrap();
            (tp, tm, tv) = o
                .update_tensors(&tp, &tg, &tm, &tv, &decay, 0.25, 0.01, t)
                .unwrap();
        }
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&tp.to_vec1::<f32>().unwrap()), bits(&p));
        assert_eq!(bits(&tm.to_vec1::<f32>().unwrap()), bits(&m));
        assert_eq!(bits(&tv.to_vec1::<f32>().unwrap()), bits(&v));
        let long = Tensor::zeros(n + 1, DType::F32, dev).unwrap();
        assert!(o
            .update_tensors(&tp, &long, &tm, &tv, &decay, 1.0, 0.01, 1)
            .is_err());
        // A shorter gradient is zero past its end, in bf16 with a scale as in f32.
        let g: Vec<f32> = (0..n - 7).map(|i| (i % 11) as f32 * 0.25 - 1.0).collect();
        let mut padded: Vec<f32> = g.iter().map(|x| x * 0.5).collect();
        padded.resize(n, 0.0);
        let full = Tensor::from_vec(padded, n, dev).unwrap();
        let short = Tensor::from_vec(g, n - 7, dev)
            .unwrap()
            .to_dtype(DType::BF16);
        let short = GradShard::scaled(short.unwrap(), 0.5);
        let (a, ..) = o
            .update_tensors(&tp, &full, &tm, &tv, &decay, 1.0, 0.01, 4)
            .unwrap();
        let (b, ..) = o
            .update_tensors_with_copy(&tp, &short, &tm, &tv, &decay, 1.0, 0.01, 4, None)
            .unwrap();
        assert_eq!(
            bits(&a.to_vec1::<f32>().unwrap()),
            bits(&b.to_vec1::<f32>().unwrap())
        );
    }

    #[test]
    fn decay_ranges_are_rebased_to_the_shard() {
        let d = DecayRanges::for_shard(&[0..10, 20..30], &(5..25));
        assert_eq!(d.0, vec![0..5, 15..20]);
    }
}
