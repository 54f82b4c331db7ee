//! The rope a Llama `config.json` asks for, read from either spelling transformers writes
//! ([`Rope::of`]): the family's import of a checkpoint compares it with the run's.

use crate::layers::RopeScaling;

/// The rotary embedding a Llama `config.json` asks for, from either spelling transformers
/// writes: 4.x's top-level `rope_theta` and `rope_scaling`, or 5.x's `rope_parameters`
/// (`{"rope_type": ..., "rope_theta": ..., ...}`), which has no top-level key at all. A config
/// read under the wrong spelling would train with another theta without a word.
#[derive(Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    /// Where `theta` was read, for the message that compares it with the run's.
    pub theta_key: &'static str,
    /// The frequencies' rescaling (`rope_type` `default` or `llama3`).
    pub scaling: RopeScaling,
    /// Where `scaling` was read (`rope_scaling`, `rope_parameters`).
    pub scaling_key: &'static str,
}

impl Rope {
    /// transformers' Llama default when no theta is written.
    const DEFAULT_THETA: f64 = 10_000.0;

    /// The rope of `j`, or what it sets that zeropp's Llama does not implement (a rope type
    /// other than `default` and `llama3`: `yarn`, `linear`, `dynamic`, ...), as the rest of a
    /// one-line message.
    pub fn of(j: &serde_json::Value) -> std::result::Result<Rope, String> {
        let params = &j["rope_parameters"];
        if params.is_object() {
            // 5.x; models that mix attention kinds nest one object per layer type.
            if params
                .as_object()
                .is_some_and(|o| o.values().any(|v| v.is_object()))
            {
                return Err(
                    "sets rope_parameters per layer type, which zeropp's Llama does \
                            not implement"
                        .into(),
                );
            }
            let scaling = scaling(params, "rope_parameters")?;
            if let Some(theta) = number(&params["rope_theta"], "rope_parameters.rope_theta")? {
                return Ok(Rope {
                    theta,
                    theta_key: "rope_parameters.rope_theta",
                    scaling,
                    scaling_key: "rope_parameters",
                });
            }
            let theta = number(&j["rope_theta"], "rope_theta")?.unwrap_or(Self::DEFAULT_THETA);
            return Ok(Rope {
                theta,
                theta_key: "rope_theta",
                scaling,
                scaling_key: "rope_parameters",
            });
        } else if !params.is_null() {
            return Err(format!("has rope_parameters = {params}, not an object"));
        }
        let scaling = match &j["rope_scaling"] {
            serde_json::Value::Null => RopeScaling::Default,
            s if s.is_object() => scaling(s, "rope_scaling")?,
            s => return Err(format!("has rope_scaling = {s}, not an object")),
        };
        Ok(Rope {
            theta: number(&j["rope_theta"], "rope_theta")?.unwrap_or(Self::DEFAULT_THETA),
            theta_key: "rope_theta",
            scaling,
            scaling_key: "rope_scaling",
        })
    }
}

/// `v` as a number; `None` when absent.
fn number(v: &serde_json::Value, key: &str) -> std::result::Result<Option<f64>, String> {
    match v {
        serde_json::Value::Null => Ok(None),
        v => v
            .as_f64()
            .map(Some)
            .ok_or(format!("has {key} = {v}, not a number")),
    }
}

/// The rescaling an object of rope settings (`rope_scaling`, `rope_parameters`) names, at `key`.
fn scaling(o: &serde_json::Value, key: &str) -> std::result::Result<RopeScaling, String> {
    // transformers accepts the legacy `type` beside `rope_type`.
    let (t, t_key) = match (&o["rope_type"], &o["type"]) {
        (serde_json::Value::Null, serde_json::Value::Null) => return Ok(RopeScaling::Default),
        (serde_json::Value::Null, t) => (t, "type"),
        (t, _) => (t, "rope_type"),
    };
    let field = |name: &str| {
        number(&o[name], &format!("{key}.{name}"))?
            .ok_or_else(|| format!("sets {key}.{t_key} = \"llama3\" without {key}.{name}"))
    };
    let scaling = match t.as_str() {
        Some("default") => RopeScaling::Default,
        Some("llama3") => {
            let original = field("original_max_position_embeddings")?;
            RopeScaling::Llama3 {
                factor: field("factor")?,
                low_freq_factor: field("low_freq_factor")?,
                high_freq_factor: field("high_freq_factor")?,
                original_max_position_embeddings: match original.fract() == 0.0 && original >= 0.0 {
                    true => original as usize,
                    false => {
                        return Err(format!(
                            "has {key}.original_max_position_embeddings = {original}, not a length"
                        ))
                    }
                },
            }
        }
        Some(other) => {
            return Err(format!(
                "sets {key}.{t_key} = {other:?}, a scaled rope zeropp's Llama does not implement \
                 (only \"default\" and \"llama3\")"
            ))
        }
        None => return Err(format!("has {key}.{t_key} = {t}, not a string")),
    };
    match scaling.problem() {
        Some(p) => Err(format!("has {key} with {p}")),
        None => Ok(scaling),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LLAMA3_1_SCALING;

    /// The spellings no fixture shows: the legacy `type` key, a per-layer-type
    /// `rope_parameters`, no theta at all (transformers' default, 10000), and a theta that is
    /// not a number. (The fixtures transformers wrote are read in the trainer's init_from
    /// tests.)
    #[test]
    fn the_rope_of_older_and_odder_configs() {
        let of = |j: serde_json::Value| Rope::of(&j);
        let rope = |theta, theta_key| {
            Ok(Rope {
                theta,
                theta_key,
                scaling: RopeScaling::Default,
                scaling_key: match theta_key {
                    "rope_parameters.rope_theta" => "rope_parameters",
                    _ => "rope_scaling",
                },
            })
        };
        assert_eq!(of(serde_json::json!({})), rope(10_000.0, "rope_theta"));
        assert_eq!(
            of(serde_json::json!({"rope_theta": 1e6, "rope_scaling": {"type": "default"}})),
            rope(1e6, "rope_theta")
        );
        let e = of(serde_json::json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}}));
        assert!(e.unwrap_err().contains("rope_scaling.type = \"dynamic\""));
        let e = of(serde_json::json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}));
        assert!(
            e.as_ref()
                .unwrap_err()
                .contains("without rope_scaling.original_max_position_embeddings"),
            "{e:?}"
        );
        let nested = serde_json::json!({"rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}});
        assert!(of(nested).unwrap_err().contains("per layer type"));
        // 5.x without a theta inside falls back to a top-level one.
        assert_eq!(
            of(serde_json::json!({"rope_theta": 2e5, "rope_parameters": {"rope_type": "default"}}))
                .map(|r| (r.theta, r.theta_key, r.scaling_key)),
            Ok((2e5, "rope_theta", "rope_parameters"))
        );
        // Llama 3.1's, in either spelling; a bad value named with its key.
        let params = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        for key in ["rope_scaling", "rope_parameters"] {
            let r = of(serde_json::json!({ key: params.clone(), "rope_theta": 5e5 })).unwrap();
            assert_eq!((r.scaling, r.scaling_key), (LLAMA3_1_SCALING, key));
        }
        let mut bad = params.clone();
        bad["factor"] = serde_json::json!(0.5);
        let e = of(serde_json::json!({ "rope_scaling": bad })).unwrap_err();
        assert!(e.contains("rope_scaling with factor = 0.5"), "{e}");
        let e = of(serde_json::json!({"rope_parameters": {"rope_theta": "big"}}));
        assert!(e.unwrap_err().contains("not a number"));
    }
}
