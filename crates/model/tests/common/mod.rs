//! What the model's CPU tests share: seeded test data, finite differences and a closeness check
//! that names the worst coordinate.
#![allow(dead_code)] // each test binary uses its own part

use candle_core::{Device, Tensor};
use model::{ParamInit, UnitLayout};

/// Deterministic pseudo-random numbers for test data (splitmix64).
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unif(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| scale * self.unif()).collect()
    }
    /// `n` token ids below `v`.
    pub fn ids(&mut self, n: usize, v: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next_u64() % v as u64) as u32)
            .collect()
    }
    /// A `(b, t)` batch of token ids below `v`.
    pub fn tokens(&mut self, (b, t): (usize, usize), v: usize) -> Tensor {
        Tensor::from_vec(self.ids(b * t, v), (b, t), &Device::Cpu).unwrap()
    }
}

/// Random flat parameters for `unit` (norm weights near 1, everything else, biases included,
/// nonzero at scale 0.5), plus 3 elements of padding at the end.
pub fn rand_params(unit: &UnitLayout, rng: &mut Rng) -> Vec<f64> {
    let mut v = vec![0.0; unit.numel + 3];
    for p in &unit.params {
        let base = if matches!(p.init, ParamInit::Ones) {
            1.0
        } else {
            0.0
        };
        for x in &mut v[p.offset..p.offset + p.numel] {
            *x = base + 0.5 * rng.unif();
        }
    }
    v
}

/// A 1-D f64 CPU tensor of `v`.
pub fn t1(v: &[f64]) -> Tensor {
    Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap()
}
/// Every element of `x`, flattened.
pub fn vec1(x: &Tensor) -> Vec<f64> {
    x.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}
/// `sum(a * b)`: with `b` a fixed `dout`, the scalar whose gradient with respect to `a` is `dout`.
pub fn dot(a: &Tensor, b: &Tensor) -> f64 {
    (a * b)
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// Central finite difference of `f` at every coordinate of `x`.
pub fn finite_diff(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-5;
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let x0 = x[i];
            x[i] = x0 + h;
            let fp = f(&x);
            x[i] = x0 - h;
            let fm = f(&x);
            x[i] = x0;
            (fp - fm) / (2.0 * h)
        })
        .collect()
}

/// Elementwise `|a - b| <= rtol * (|a| + |b|) + atol`; reports the worst coordinate.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = (0, 0.0f64);
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let excess = (a - b).abs() / (rtol * (a.abs() + b.abs()) + atol);
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let i = worst.0;
    assert!(
        worst.1 <= 1.0,
        "{what}: coordinate {i}: got {} want {} (|diff| {:e})",
        got[i],
        want[i],
        (got[i] - want[i]).abs()
    );
    assert!(
        want.iter().any(|w| w.abs() > 1e-3),
        "{what}: trivially zero"
    );
}

/// Tolerances of a finite-difference check in f64 (step 1e-5, so an error of about 1e-10).
pub const FD_RTOL: f64 = 1e-6;
pub const FD_ATOL: f64 = 1e-9;

/// Asserts that `hidden` (tokens `(B, T)` to hidden states `(B, T, C)`, B >= 2) is causal and
/// keeps the sequences apart: changing token `t` of sequence 1 changes that sequence's states
/// at positions `t..` and nothing else.
pub fn assert_causal(tokens: &Tensor, vocab_size: usize, hidden: impl Fn(&Tensor) -> Tensor) {
    let base = hidden(tokens);
    let (_, t_len) = tokens.dims2().unwrap();
    for t in 0..t_len {
        let mut toks = tokens.to_vec2::<u32>().unwrap();
        toks[1][t] = (toks[1][t] + 1) % vocab_size as u32;
        let changed = hidden(&Tensor::new(toks, &Device::Cpu).unwrap());
        let diff = (&changed - &base)
            .unwrap()
            .abs()
            .unwrap()
            .sum(2)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        for (b, row) in diff.iter().enumerate() {
            for (s, &d) in row.iter().enumerate() {
                if b == 1 && s >= t {
                    assert!(d > 0.0, "position {s} must see token {t}");
                } else {
                    assert_eq!(d, 0.0, "batch {b} position {s} changed with token {t}");
                }
            }
        }
    }
}
