//! Model FLOPs utilisation: the share of the GPU's peak that the model's FLOPs a second are
//! (the metrics' and `trainer bench`'s `mfu`).

/// Dense bf16 peak of one H200 (and H100 SXM), TFLOP/s: MFU's denominator.
pub const PEAK_TFLOPS: f64 = 989.0;
