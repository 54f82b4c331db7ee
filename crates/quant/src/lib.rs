//! Block-wise symmetric quantisation for ZeRO++'s quantised collectives (ZeRO++, Wang et al.
//! 2023, sections 3.1 and 3.3; docs/design.md section 3). CPU reference.
//!
//! One f32 scale per block of `block` elements: scale = absmax / qmax; q = the integer nearest
//! x * fl(1 / scale), the product exact, ties to even, which lies in [-qmax, qmax] with no
//! clamp and gives ±qmax at ±absmax (blocks whose 1 / scale overflows, subnormal scales, take
//! round(x / scale) clamped, half away from zero); dequantised value q * scale. The arithmetic
//! is defined in one place (`block/`), which the GPU kernels follow bitwise. INT8 (qmax 127)
//! carries weights for qwZ; INT4 (qmax 7, two values a byte) carries gradients for qgZ, with
//! its swizzle and fused kernels. A block holding an inf or NaN is never made finite: its
//! scale is NaN and its codes 0, so it dequantises to NaN (on the CPU and the GPU alike), a
//! NaN gradient survives qgZ's two hops, and the engine skips the step.
//!
//! [`quantize_fp8_e4m3`] is the reference of FP8 E4M3 with one scale a block (issue 40's FP8
//! compute and FP8 qwZ): codes are floats, not integers, so its arithmetic (torchao's dynamic
//! scaling, saturating round to nearest even) is its own, in `fp8.rs`; the absmax and the
//! inf/NaN rule are the ones above.
//!
//! [`tensor`] runs the INT8 and INT4 quantisers on candle tensors, on the CPU through this reference
//! code and, with feature `cuda`, on the GPU through the kernels of `cuda` (bitwise equal to
//! the reference); `bench` (feature `cuda`) measures their bandwidth against a device copy.
//!
//! Exactness of constant blocks: a block of constant c (normal) dequantises to c bitwise
//! whenever c's significand |c| / 2^floor(log2 |c|) is below 1.75 for INT4 (below 127/64 for
//! INT8), because then |qmax * round(c / qmax) - c| < half an ulp of c. Above that it holds for
//! only part of the significands (see tests/props.rs, `constant_block_exactness`).
//!
//! ```
//! let x = [0.5f32, -0.25, 0.125, 0.0];
//! let (q, s) = quant::quantize_int4(&x, 4).unwrap();
//! let y = quant::dequantize_int4(&q, &s, 4);
//! for (a, b) in x.iter().zip(&y) {
//!     assert!((a - b).abs() <= quant::int4_bound(s[0]));
//! }
//! ```

#[cfg(feature = "cuda")]
pub mod bench;
mod block;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod fp8;
mod fused;
mod int4;
mod int8;
mod swizzle;
pub mod tensor;

pub use error::{CandleError, QuantError, SharedKernelError};
pub use fp8::{
    dequantize_fp8_e4m3, dequantize_fp8_e4m3_tiles, e4m3_decode, e4m3_encode, fp8_e4m3_bound,
    fp8_e4m3_scale, quantize_fp8_e4m3, quantize_fp8_e4m3_tiles, Tile, E4M3_MAX,
};
pub use fused::{dequantize_sum_int4, dequantize_sum_requantize_int4, quantize_int4_swizzled};
pub use int4::{dequantize_int4, int4_bound, quantize_int4};
pub use int8::{dequantize_int8, int8_bound, quantize_int8};
pub use swizzle::{swizzle, unswizzle};
