//! What the GPU test files share: the device, seeded inputs, the error measure.

use candle_core::{DType, Device, Tensor};

/// GPU 0.
pub fn gpu() -> Device {
    Device::new_cuda(0).expect("a CUDA device")
}

/// `n` deterministic values uniform in `[-scale, scale)` (xorshift from `seed`).
pub fn uniform(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// max |gpu - cpu| / max |cpu|, both read as f32 on the CPU; infinite when `gpu` holds a
/// non-finite value.
pub fn rel_err(gpu: &Tensor, cpu: &Tensor) -> f32 {
    assert_eq!(gpu.dims(), cpu.dims(), "shapes");
    let flat = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    let (g, c) = (flat(gpu), flat(cpu));
    if g.iter().any(|x| !x.is_finite()) {
        return f32::INFINITY;
    }
    let scale = c.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    let diff = g
        .iter()
        .zip(&c)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

/// Seconds a call of `f` takes on `dev`: one warm-up call, then the mean of 20, timed on the host
/// between two synchronisations (the calls queue back to back).
pub fn seconds_per_call(dev: &Device, f: &dyn Fn()) -> f64 {
    const RUNS: usize = 20;
    f();
    dev.synchronize().expect("sync");
    let start = std::time::Instant::now();
    for _ in 0..RUNS {
        f();
    }
    dev.synchronize().expect("sync");
    start.elapsed().as_secs_f64() / RUNS as f64
}

/// A bf16 tensor of `shape` on `dev`, normal with standard deviation `scale`.
pub fn randn_bf16(dev: &Device, shape: &[usize], scale: f32) -> Tensor {
    Tensor::randn(0f32, scale, shape, dev)
        .and_then(|t| t.to_dtype(DType::BF16))
        .expect("random bf16 tensor")
}

/// Asserts max|gpu - reference| / max|reference| below `tol` (NaN counts as infinite), naming
/// the worst element by row and column of the last dimension on failure. Both read as f32.
pub fn assert_close(what: &str, gpu: &Tensor, reference: &Tensor, tol: f32) {
    assert_eq!(gpu.dims(), reference.dims(), "{what}: shape");
    let cols = *reference.dims().last().unwrap_or(&1);
    let (g, c) = (f32_values(gpu), f32_values(reference));
    let scale = c.iter().fold(0f32, |m, x| m.max(x.abs()));
    let (mut worst, mut at) = (0f32, 0usize);
    for (i, (a, b)) in g.iter().zip(&c).enumerate() {
        let d = (a - b).abs();
        if d > worst || d.is_nan() {
            (worst, at) = (if d.is_nan() { f32::INFINITY } else { d }, i);
        }
    }
    let rel = worst / scale.max(f32::MIN_POSITIVE);
    assert!(
        rel < tol,
        "{what}: max|gpu - ref| / max|ref| = {rel:.3e} (tol {tol:e}) at row {} col {}: gpu {} ref {}",
        at / cols,
        at % cols,
        g[at],
        c[at]
    );
}

/// Every value of `t`, widened to f32 (exactly, from bf16), flattened, on the host.
pub fn f32_values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .expect("readable tensor")
}

/// The bit patterns of [`f32_values`]: equal for tensors equal bit for bit (bf16 or f32).
pub fn f32_bits(t: &Tensor) -> Vec<u32> {
    f32_values(t).iter().map(|v| v.to_bits()).collect()
}
