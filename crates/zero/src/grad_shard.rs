//! A unit's gradient shard as the norm and the optimizer read it: `scale` x `values`, zero past
//! the end of `values`.
//!
//! Where the world reduces a gradient, the shard is the reduction's f32 result, padded to the
//! shard's length, with scale 1. At W = 1 there is nothing to reduce: the first micro-batch's
//! shard is the unit's gradient exactly as the backward wrote it (bf16 in a bf16 run, unpadded)
//! with the micro-batch's weight as its scale, so no pass casts, scales and pads it into an f32
//! buffer; the norm and AdamW read 2 bytes an element instead of 4 after a 6-byte pass. A second
//! micro-batch makes it the padded f32 shard first ([`GradShard::to_f32`]) and accumulates there.
//! Either way the values the optimizer sees are the same bits: `f32(values) * scale`, one f32
//! multiply, the one the cast-scale-pad pass makes.

use candle_core::{DType, Tensor};
use kernels::place::Place;

use crate::{shard_passes, Result};

/// `scale` x `values` (1-D, contiguous, f32 or bf16), then zeros up to the shard's length.
#[derive(Clone, Debug)]
pub struct GradShard {
    values: Tensor,
    scale: f32,
}

impl GradShard {
    /// The f32 shard itself (scale 1).
    pub fn f32(values: Tensor) -> Self {
        GradShard { values, scale: 1.0 }
    }

    /// `scale` x `values`, read where it is.
    pub fn scaled(values: Tensor, scale: f32) -> Self {
        GradShard { values, scale }
    }

    /// The stored values (f32 or bf16, possibly shorter than the shard).
    pub fn values(&self) -> &Tensor {
        &self.values
    }

    /// What the values are multiplied by (in f32) before use.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Whether this is already the f32 shard of `len` elements.
    fn is_f32_shard(&self, len: usize) -> bool {
        self.scale == 1.0 && self.values.dtype() == DType::F32 && self.values.elem_count() == len
    }

    /// The f32 shard of `len` elements: these values, or a new buffer of `scale` x `values` and
    /// zeros (written on `place`).
    pub fn to_f32(&self, place: &Place, len: usize) -> Result<Tensor> {
        if self.is_f32_shard(len) {
            return Ok(self.values.clone());
        }
        let out = Tensor::zeros(len, DType::F32, self.values.device())?;
        shard_passes::scale_pad_into(place, &self.values, self.scale, &out)?;
        Ok(out)
    }

    /// The shard's `len` values on the host.
    pub fn to_vec(&self, len: usize) -> Result<Vec<f32>> {
        let mut v = self.values.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        if self.scale != 1.0 {
            v.iter_mut().for_each(|x| *x *= self.scale);
        }
        v.resize(len, 0.0);
        Ok(v)
    }
}
