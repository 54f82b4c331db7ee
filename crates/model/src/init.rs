//! Partition-independent initialisation.
//!
//! Element `i` of parameter `k` (its [`ParamSpec::global_index`]) is a pure function of
//! `(seed, k, i)`: a splitmix64 hash of the three gives two uniforms, and Box-Muller turns them
//! into one standard normal, scaled by the parameter's std. So any rank can fill any slice of
//! any unit's flat buffer, and every world size and shard layout starts from the same model.
//!
//! ```
//! use model::{init_unit_range, preset, ModelLayout};
//! let cfg = preset("tiny").unwrap();
//! let unit = &ModelLayout::new(&cfg).units[1];
//! let mut whole = vec![0f32; unit.numel + 7]; // 7 elements of engine padding
//! init_unit_range(&cfg, unit, 42, 0, &mut whole);
//! let mut part = vec![0f32; 100];
//! init_unit_range(&cfg, unit, 42, 1000, &mut part);
//! assert_eq!(&whole[1000..1100], &part[..]);
//! assert_eq!(whole[0], 1.0); // ln_1.weight
//! assert_eq!(whole[unit.numel], 0.0); // padding
//! ```

use crate::config::ModelConfig;
use crate::layout::{ParamInit, ParamSpec, UnitLayout};

/// Writes into `out` the values of elements `[start, start + out.len())` of `unit`'s flat buffer.
/// Elements `>= unit.numel` (padding added by the ZeRO engine) are 0.0.
///
/// Normal parameters use std 0.02, or `0.02 / sqrt(2 * n_layer)` for the residual output
/// projections (`attn.c_proj.weight`, `mlp.c_proj.weight`); biases are 0, LayerNorm weights 1.
/// The rule per parameter comes from the layout table ([`ParamSpec::init`]); `cfg` is taken for
/// symmetry with the rest of the API.
pub fn init_unit_range(
    _cfg: &ModelConfig,
    unit: &UnitLayout,
    seed: u64,
    start: usize,
    out: &mut [f32],
) {
    let end = start + out.len();
    out.fill(0.0);
    for p in &unit.params {
        let (lo, hi) = (p.offset.max(start), (p.offset + p.numel).min(end));
        if lo >= hi {
            continue;
        }
        let dst = &mut out[lo - start..hi - start];
        fill_param(p, seed, lo - p.offset, dst);
    }
}

/// Fills `dst` with elements `[first, first + dst.len())` of parameter `p`.
fn fill_param(p: &ParamSpec, seed: u64, first: usize, dst: &mut [f32]) {
    match p.init {
        ParamInit::Zeros => dst.fill(0.0),
        ParamInit::Ones => dst.fill(1.0),
        ParamInit::Normal { std } => {
            let key = splitmix64(splitmix64(seed) ^ p.global_index as u64);
            for (j, d) in dst.iter_mut().enumerate() {
                *d = (std * std_normal(key, (first + j) as u64)) as f32;
            }
        }
    }
}

/// The splitmix64 output function applied to `x + golden gamma`: a strong 64-bit mixer.
#[inline]
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One N(0, 1) sample for counter `i` under `key` (which already mixes seed and parameter index).
#[inline]
fn std_normal(key: u64, i: u64) -> f64 {
    let a = splitmix64(key ^ splitmix64(i));
    let b = splitmix64(a ^ 0xD1B5_4A32_D192_ED03);
    const TWO_POW_M53: f64 = 1.0 / (1u64 << 53) as f64;
    let u1 = ((a >> 11) + 1) as f64 * TWO_POW_M53; // (0, 1]: ln is finite
    let u2 = (b >> 11) as f64 * TWO_POW_M53; // [0, 1)
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{preset, ModelLayout};

    #[test]
    fn chunked_fill_equals_whole_fill() {
        let cfg = crate::ModelConfig::gpt2(2, 8, 2, 5, 11);
        let layout = ModelLayout::new(&cfg);
        for unit in &layout.units {
            let padded = unit.numel + 13;
            let mut whole = vec![f32::NAN; padded];
            init_unit_range(&cfg, unit, 7, 0, &mut whole);
            for chunk in [1, 3, 17, 64, padded] {
                let mut got = vec![f32::NAN; padded];
                for (j, c) in got.chunks_mut(chunk).enumerate() {
                    init_unit_range(&cfg, unit, 7, j * chunk, c);
                }
                assert_eq!(
                    whole.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{} chunk {chunk}",
                    unit.name
                );
            }
            assert!(whole[unit.numel..].iter().all(|&x| x == 0.0));
            let mut other = vec![0f32; padded];
            init_unit_range(&cfg, unit, 8, 0, &mut other);
            if unit
                .params
                .iter()
                .any(|p| matches!(p.init, ParamInit::Normal { .. }))
            {
                assert_ne!(whole, other, "seed must matter");
            }
        }
    }

    #[test]
    fn values_follow_the_table() {
        let cfg = preset("tiny").unwrap();
        let layout = ModelLayout::new(&cfg);
        let emb = layout.embedding();
        let mut buf = vec![0f32; emb.numel];
        init_unit_range(&cfg, emb, 1, 0, &mut buf);
        let wte = &buf[..emb.param("wte.weight").numel];
        let n = wte.len() as f64;
        let mean = wte.iter().map(|&x| x as f64).sum::<f64>() / n;
        let std = (wte.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 1e-4, "mean {mean}");
        assert!((std / 0.02 - 1.0).abs() < 0.01, "std {std}");
        // Tail mass: about 4.55% beyond 2 sigma for a normal.
        let tail = wte.iter().filter(|&&x| x.abs() > 0.04).count() as f64 / n;
        assert!((tail - 0.0455).abs() < 0.002, "tail {tail}");

        let blk = layout.block(1);
        let mut buf = vec![0f32; blk.numel];
        init_unit_range(&cfg, blk, 1, 0, &mut buf);
        let view = |name: &str| {
            let p = blk.param(name);
            &buf[p.offset..p.offset + p.numel]
        };
        assert!(view("ln_1.weight").iter().all(|&x| x == 1.0));
        assert!(view("mlp.c_fc.bias").iter().all(|&x| x == 0.0));
        let proj = view("mlp.c_proj.weight");
        let std =
            (proj.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / proj.len() as f64).sqrt();
        assert!((std / (0.02 / 2.0) - 1.0).abs() < 0.03, "std {std}");
    }
}
