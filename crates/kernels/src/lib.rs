//! zeropp's CUDA kernels: the CUDA C sources, one kernel family a `.cu` file under `cuda/`
//! (forward and backward together), and the one loader that compiles them with NVRTC and caches
//! a module per (file, defines, flavour) for the process.
//!
//! This is the bottom crate of the GPU path: `model`, `quant`, `zero` and `comm` depend on it,
//! never the other way. A kernel's launcher lives beside the CPU function it replaces, in the
//! crate that owns that function; this crate only knows source text and how to load it.
//!
//! Sizes and constants that Rust and C share are passed as `-D` defines by the launcher
//! ([`Define`]), never written in both languages. NVRTC errors name the real file and line:
//! the loader pastes a header ([`HEADERS`]: `common.cuh`, `swiglu.cuh`, `rope.cuh`,
//! `rmsnorm.cuh`, `layernorm.cuh`, `gelu.cuh`) where a file includes it and marks both with
//! `#line`.
//!
//! ```
//! let text = kernels::LAYERNORM.nvrtc_text(&[("C", 768)]);
//! assert!(text.starts_with("#define C 768\n"));
//! assert!(text.contains("#line 1 \"common.cuh\""));
//! assert!(text.contains("#line 1 \"layernorm.cu\""));
//! ```

mod error;
#[cfg(feature = "cuda")]
pub mod launch;
#[cfg(feature = "cuda")]
pub mod loader;
pub mod place;
mod precision;
pub mod profile;

pub use error::{KernelError, Result};
pub use precision::Precision;

/// One `.cu` file: its name (for `#line` and the module cache) and its text.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    pub file: &'static str,
    pub text: &'static str,
}

/// A `#define NAME VALUE` put in front of a source.
pub type Define = (&'static str, i64);

/// The header every kernel file includes.
pub const COMMON: &str = include_str!("../cuda/common.cuh");

/// The headers a kernel file may include, by the name it includes them with; the loader
/// pastes each in place of its `#include` line. A header other than common.cuh comes after
/// common.cuh and includes nothing itself.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", COMMON),
    // SwiGLU's arithmetic, shared by swiglu.cu and fp8.cu's SwiGLU quantisers, so that the
    // fused kernels compute the very bits of the unfused ones.
    ("swiglu.cuh", include_str!("../cuda/swiglu.cuh")),
    // A rotary pair's rotation, shared by rope.cu and qk_norm.cu's fused rotation.
    ("rope.cuh", include_str!("../cuda/rope.cuh")),
    // The norms' outputs, shared by rmsnorm.cu and layernorm.cu and fp8.cu's norm quantisers.
    ("rmsnorm.cuh", include_str!("../cuda/rmsnorm.cuh")),
    ("layernorm.cuh", include_str!("../cuda/layernorm.cuh")),
    // GELU's forward, shared by elementwise.cu and fp8.cu's bias-and-GELU quantiser.
    ("gelu.cuh", include_str!("../cuda/gelu.cuh")),
];

macro_rules! sources {
    ($($(#[$doc:meta])* $name:ident = $file:literal;)*) => {
        $( $(#[$doc])* pub const $name: Source = Source {
            file: $file,
            text: include_str!(concat!("../cuda/", $file)),
        }; )*
        /// Every kernel file, for tests that compile them all.
        pub const ALL: &[Source] = &[$($name),*];
    };
}

sources! {
    /// LayerNorm with the residual add before it, forward and backward.
    LAYERNORM = "layernorm.cu";
    /// RMSNorm with the residual add before it, forward and backward (the Llama family).
    RMSNORM = "rmsnorm.cu";
    /// Rotary embeddings turned in place on the packed q and k heads, forward and backward.
    ROPE = "rope.cu";
    /// Qwen3's q/k norm in place on the packed q and k heads, forward and backward (with the
    /// deterministic reduction of its two weights' gradients).
    QK_NORM = "qk_norm.cu";
    /// SwiGLU on the packed gate/up projection, forward and backward.
    SWIGLU = "swiglu.cu";
    /// Bias add, GELU (tanh) and their backward, bias gradients (column sums), residual adds.
    ELEMENTWISE = "elementwise.cu";
    /// Causal flash attention on tensor cores, forward and backward, on the QKV GEMM's layout.
    ATTENTION = "attention.cu";
    /// Token + position embedding, forward and deterministic backward.
    EMBEDDING = "embedding.cu";
    /// Fused soft-max cross-entropy of a chunk of logits: loss and dlogits in one pass.
    CROSSENTROPY = "crossentropy.cu";
    /// Sum of squares of an f32 buffer in f64 (the gradient norm), deterministic.
    GRADNORM = "gradnorm.cu";
    /// The ZeRO engine's casts, padding and gradient accumulation over a unit.
    SHARD_PASSES = "shard_passes.cu";
    /// The quantisers of `quant` (INT8, swizzled INT4, fused INT4 piece sums and requantisers),
    /// one module per block size `BLOCK`, bitwise equal to the CPU reference (`Flavour::Exact`).
    QUANT = "quant.cu";
    /// The FP8 E4M3 quantisers of the FP8 linear layers (1 x 128, 128 x 1 and 128 x 128 block
    /// scales), writing codes and scales in the layouts of cuBLASLt's block-scaled FP8 GEMMs.
    FP8 = "fp8.cu";
    /// The AdamW update of `zero`, bitwise equal to the CPU one (`Flavour::Exact`).
    ADAMW = "adamw.cu";
    /// A one-thread kernel that holds a stream for a given time (`comm`'s emulated slow link).
    HOLD = "hold.cu";
    /// The local backend's f32 reduction over the ranks sharing a GPU, on the communication
    /// stream, in group-rank order (`comm`'s jobs; `Flavour::Exact`).
    COLLECTIVES = "collectives.cu";
}

/// The kernel families typed by the model's [`Precision`]: their launchers compile them with
/// [`Precision::define`], and their kernels are written in `common.cuh`'s `act_t`. The others
/// name their element types themselves (f32 masters and moments, bf16 as a gradient format,
/// INT8/INT4 codes).
pub const TYPED: &[Source] = &[
    LAYERNORM,
    RMSNORM,
    ROPE,
    QK_NORM,
    SWIGLU,
    ELEMENTWISE,
    ATTENTION,
    EMBEDDING,
    CROSSENTROPY,
];

impl Source {
    /// The text NVRTC compiles: the defines, then the file with each `#include` of one of
    /// [`HEADERS`] replaced by the header itself, `#line` marks keeping error positions true in
    /// all of them.
    pub fn nvrtc_text(&self, defines: &[Define]) -> String {
        let mut out = String::with_capacity(COMMON.len() + self.text.len() + 256);
        for (name, value) in defines {
            out.push_str(&format!("#define {name} {value}\n"));
        }
        let header = |line: &str| {
            HEADERS
                .iter()
                .find(|(name, _)| line.trim() == format!("#include \"{name}\""))
        };
        for (i, line) in self.text.lines().enumerate() {
            if let Some((name, text)) = header(line) {
                out.push_str(&format!("#line 1 \"{name}\"\n"));
                out.push_str(text);
                out.push_str(&format!("\n#line {} \"{}\"\n", i + 2, self.file));
            } else {
                if i == 0 {
                    out.push_str(&format!("#line 1 \"{}\"\n", self.file));
                }
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// The module's cache key: file, defines and flavour.
    pub fn module_name(&self, defines: &[Define], flavour: Flavour) -> String {
        let mut key = format!("zeropp/{}/{flavour:?}", self.file);
        for (name, value) in defines {
            key.push_str(&format!("/{name}={value}"));
        }
        key
    }
}

/// How a module is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// IEEE division and square root, no FMA contraction, no flush-to-zero: kernels that must
    /// equal their CPU reference bitwise (quantisers, AdamW).
    Exact,
    /// FMA contraction allowed, PTX for sm_90: the model's kernels, checked against the CPU
    /// reference within bf16 tolerance.
    Fast,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_is_replaced_and_lines_stay_true() {
        for src in ALL {
            let text = src.nvrtc_text(&[("X", 3)]);
            assert!(text.starts_with("#define X 3\n"), "{}", src.file);
            // NVRTC has no include path: every include is pasted.
            assert!(
                !text.lines().any(|l| l.trim().starts_with("#include")),
                "{}: an include is left",
                src.file
            );
            // The line after each include is numbered as in the file (or is the next header's).
            let lines: Vec<&str> = src.text.lines().collect();
            for (i, _) in lines
                .iter()
                .enumerate()
                .filter(|(_, l)| l.trim().starts_with("#include"))
            {
                let mark = format!("#line {} \"{}\"", i + 2, src.file);
                let after = text.split(&mark).nth(1).expect("a #line after the header");
                let next = lines.get(i + 1).copied().unwrap_or_default();
                match next.trim().strip_prefix("#include \"") {
                    Some(name) => assert_eq!(
                        after.lines().nth(1),
                        Some(format!("#line 1 \"{}", name).as_str()),
                        "{}",
                        src.file
                    ),
                    None => assert_eq!(after.lines().nth(1), Some(next), "{}", src.file),
                }
            }
        }
    }

    /// A typed family says which precisions it is written for, and is compiled per precision.
    #[test]
    fn typed_families_guard_their_precision() {
        for src in TYPED {
            assert!(
                src.text
                    .contains("static_assert(PRECISION == PRECISION_BF16"),
                "{}: no precision guard",
                src.file
            );
            let text = src.nvrtc_text(&[Precision::Bf16.define()]);
            assert!(text.starts_with("#define PRECISION 1\n"), "{}", src.file);
        }
        assert!(COMMON.contains("#define PRECISION_BF16 1"));
        assert_eq!(Precision::Bf16.per_vector(), 8);
        assert_eq!(
            Precision::of(candle_core::DType::BF16),
            Some(Precision::Bf16)
        );
        assert_eq!(Precision::of(candle_core::DType::F32), None);
    }

    #[test]
    fn module_names_differ_by_defines_and_flavour() {
        let a = LAYERNORM.module_name(&[("C", 64)], Flavour::Fast);
        let b = LAYERNORM.module_name(&[("C", 128)], Flavour::Fast);
        let c = LAYERNORM.module_name(&[("C", 64)], Flavour::Exact);
        assert!(a != b && a != c && b != c);
    }
}

#[cfg(all(test, feature = "cuda"))]
mod nvrtc_tests {
    /// Every source compiles with NVRTC under its default defines. Needs only libnvrtc and the
    /// driver stub, no GPU: `scripts/gpu-build.sh` runs it after the build.
    #[test]
    fn nvrtc_compiles_every_source() {
        for src in crate::ALL {
            crate::loader::ptx(src, &[], crate::Flavour::Fast)
                .unwrap_or_else(|e| panic!("{}: {e}", src.file));
        }
    }

    /// qk_norm.cu compiles for the head widths its launcher passes as HS (a multiple of 8 up
    /// to 256; the fused rotation's partner lanes depend on it), not only the default 128.
    #[test]
    fn nvrtc_compiles_qk_norm_for_every_head_width() {
        for hs in (8..=256).step_by(8) {
            let defines = [crate::Precision::Bf16.define(), ("HS", hs)];
            crate::loader::ptx(&crate::QK_NORM, &defines, crate::Flavour::Fast)
                .unwrap_or_else(|e| panic!("qk_norm.cu at HS = {hs}: {e}"));
        }
    }

    /// Every typed family compiles for every precision, and its PTX there is the PTX of the
    /// file on its own (which defaults to bf16): the define selects, it adds nothing.
    #[test]
    fn nvrtc_compiles_every_typed_family_for_every_precision() {
        for src in crate::TYPED {
            for p in crate::Precision::ALL {
                let typed = crate::loader::ptx(src, &[p.define()], crate::Flavour::Fast)
                    .unwrap_or_else(|e| panic!("{} ({p}): {e}", src.file));
                if *p == crate::Precision::Bf16 {
                    let plain = crate::loader::ptx(src, &[], crate::Flavour::Fast).unwrap();
                    assert_eq!(typed, plain, "{}", src.file);
                }
            }
        }
    }
}
