//! Activation checkpointing: what a block's forward keeps for its backward, and so what the
//! backward computes again (`model.recompute`).
//!
//! Recomputing trades compute for memory. Rerunning the whole block keeps the least (its input)
//! and pays the most (every projection's forward but the last, again). Llama's block spends most
//! of its forward in the MLP's GEMMs (gate|up is two thirds of its weights), so keeping the MLP's
//! activations and rerunning the attention half alone saves most of that work for `2 (C + F)`
//! more elements a token: torchtitan's "selective" checkpointing makes the same trade per op,
//! and Megatron's "selective" recomputation keeps the GEMMs' outputs for the same reason.
//! Gradients are bitwise the same in every mode: a recomputation runs the forward's own kernels
//! on the same inputs.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// What a block keeps for its backward (`model.recompute`: `false`, `true`, `"attention"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recompute {
    /// Every activation the backward reads: nothing is recomputed (`false`).
    #[default]
    Off,
    /// The block's input alone: the backward reruns the block's forward, all of it but the last
    /// projection, whose output it never reads (`true`).
    Full,
    /// The input, the residual after attention and the MLP's packed gate|up output: the
    /// backward reruns the attention half (the first norm, q|k|v's projection, the rotation and
    /// the attention) and the MLP's element-wise passes (the second norm, SwiGLU), none of the
    /// MLP's GEMMs nor o_proj's (`"attention"`). Llama-family blocks; GPT-2's refuse it.
    Attention,
}

impl Recompute {
    /// Whether the backward recomputes anything.
    pub fn any(self) -> bool {
        self != Recompute::Off
    }

    /// The name `model.recompute` gives it.
    pub fn key(self) -> &'static str {
        match self {
            Recompute::Off => "false",
            Recompute::Full => "true",
            Recompute::Attention => "\"attention\"",
        }
    }
}

impl std::fmt::Display for Recompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Recompute::Off => "off",
            Recompute::Full => "full",
            Recompute::Attention => "attention",
        })
    }
}

/// `false` and `true` as before this setting had a third value, `"attention"` as a string.
impl Serialize for Recompute {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Recompute::Off => s.serialize_bool(false),
            Recompute::Full => s.serialize_bool(true),
            Recompute::Attention => s.serialize_str("attention"),
        }
    }
}

/// A bool, or one of `"off"`, `"full"`, `"attention"`.
impl<'de> Deserialize<'de> for Recompute {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Setting;
        impl Visitor<'_> for Setting {
            type Value = Recompute;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#"true, false, "full", "attention" or "off""#)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Recompute, E> {
                Ok(if v { Recompute::Full } else { Recompute::Off })
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Recompute, E> {
                match v {
                    "off" => Ok(Recompute::Off),
                    "full" => Ok(Recompute::Full),
                    "attention" => Ok(Recompute::Attention),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(Setting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Section {
        recompute: Recompute,
    }

    #[test]
    fn a_bool_or_a_name_reads_and_writes_back() {
        for (text, mode) in [
            ("recompute = false", Recompute::Off),
            ("recompute = true", Recompute::Full),
            ("recompute = \"attention\"", Recompute::Attention),
        ] {
            let s: Section = toml::from_str(text).unwrap();
            assert_eq!(s.recompute, mode, "{text}");
            assert_eq!(toml::to_string(&s).unwrap().trim(), text);
            assert_eq!(format!("recompute = {}", mode.key()), text);
        }
        for (text, mode) in [("\"off\"", Recompute::Off), ("\"full\"", Recompute::Full)] {
            let s: Section = toml::from_str(&format!("recompute = {text}")).unwrap();
            assert_eq!(s.recompute, mode);
        }
        let e = toml::from_str::<Section>("recompute = \"selective\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("selective") && e.contains("attention"), "{e}");
    }
}
