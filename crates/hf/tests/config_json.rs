//! What a config.json says that does not fit is one line naming it: for every family, an
//! export's config.json with one key changed is read by `model::from_hf_config` (the shape a
//! run takes from `model.init_from` alone) and checked by `init_from::read` against a run.

use std::path::Path;

/// Every family's small shape, exported with its initial weights into `dir`.
fn export(dir: &Path, cfg: &model::ModelConfig) -> serde_json::Value {
    let model = model::Model::new(cfg.clone()).unwrap();
    let units: hf::export::UnitParameters = model
        .units()
        .iter()
        .map(|u| {
            let mut v = vec![0f32; u.numel];
            model::init_unit_range(cfg, u, 3, 0, &mut v);
            (u.clone(), v)
        })
        .collect();
    hf::export::write_hf(cfg, &units, &dir.join("model.safetensors"), Some(0)).unwrap();
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn shapes() -> Vec<(String, model::ModelConfig)> {
    model::every_family(&model::Sizes {
        n_layer: 2,
        n_embd: 16,
        n_head: 4,
        seq_len: 8,
        vocab_size: 37,
        n_kv_head: Some(2),
        head_dim: None,
        ffn_hidden: Some(24),
        tie_embeddings: None,
    })
}

/// `j` as `dir`'s config.json; what `init_from::read` says of it for `cfg`, in one line.
fn refusal(dir: &Path, j: &serde_json::Value, cfg: &model::ModelConfig) -> String {
    std::fs::write(dir.join("config.json"), j.to_string()).unwrap();
    let e = format!("{:#}", hf::init_from::read(dir, cfg).unwrap_err());
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

/// An export's config.json gives back the shape it was written from (seq_len: its context,
/// as it is below 2048), and `init_from` reads the weights of that shape.
#[test]
fn every_export_gives_back_its_shape() {
    for (name, cfg) in shapes() {
        let dir = tempfile::tempdir().unwrap();
        let j = export(dir.path(), &cfg);
        let back = model::from_hf_config(&j).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, cfg, "{name}");
        hf::init_from::read(dir.path(), &back).unwrap();
    }
}

#[test]
fn a_setting_that_does_not_fit_is_named() {
    let llama_style = |name: &str| !name.starts_with("gpt2");
    for (name, cfg) in shapes().into_iter().filter(|(n, _)| llama_style(n)) {
        let dir = tempfile::tempdir().unwrap();
        let j = export(dir.path(), &cfg);
        let with = |key: &str, v: serde_json::Value| {
            let mut j = j.clone();
            j[key] = v;
            j
        };
        // Settings the block does not have.
        let settings: [(&str, serde_json::Value, &str); 3] = [
            ("hidden_act", "gelu".into(), "hidden_act = \"gelu\""),
            ("mlp_bias", true.into(), "mlp_bias = true"),
            ("attention_bias", true.into(), "attention_bias = true"),
        ];
        for (key, v, says) in settings {
            let e = refusal(dir.path(), &with(key, v.clone()), &cfg);
            assert!(e.contains(says) && e.contains("config.json"), "{name}: {e}");
            let e = model::from_hf_config(&with(key, v)).unwrap_err();
            assert!(e.contains(key), "{name}: {e}");
        }
        // A head width the run does not have.
        let e = refusal(dir.path(), &with("head_dim", 8.into()), &cfg);
        assert!(
            e.contains("has head_dim = 8, this run model.head_dim = 4"),
            "{name}: {e}"
        );
        // Another family's config.json.
        let e = refusal(dir.path(), &with("model_type", "gemma".into()), &cfg);
        assert!(e.contains("\"gemma\" model"), "{name}: {e}");
        let e = model::from_hf_config(&with("model_type", "gemma".into())).unwrap_err();
        assert!(e.contains("model_type = \"gemma\", not one of"), "{e}");
        let e = model::from_hf_config(&with("num_hidden_layers", serde_json::Value::Null));
        assert!(
            e.unwrap_err().contains("has no num_hidden_layers"),
            "{name}"
        );
    }
}

/// GPT-2's settings are fixed: a config.json with another LayerNorm epsilon, activation or an
/// untied head is refused by key, not trained as another model.
#[test]
fn a_gpt2_with_other_settings_is_refused_by_key() {
    let cfg = model::ModelConfig::gpt2(2, 16, 4, 8, 37);
    let dir = tempfile::tempdir().unwrap();
    let j = export(dir.path(), &cfg);
    let settings: [(&str, serde_json::Value); 3] = [
        ("layer_norm_epsilon", 1e-6.into()),
        ("activation_function", "relu".into()),
        ("tie_word_embeddings", false.into()),
    ];
    for (key, v) in settings {
        let mut bad = j.clone();
        bad[key] = v;
        let e = refusal(dir.path(), &bad, &cfg);
        assert!(e.contains(&format!("has {key} = ")), "{e}");
    }
}

/// Qwen's sliding window, on in no released checkpoint, is refused when on; Mistral's is kept
/// when it covers `seq_len` and refused, naming it, when it does not.
#[test]
fn sliding_windows_are_kept_or_refused_by_name() {
    let qwen = model::qwen2::QWEN2.shape(2, 16, 4, 2, 4, 24, 8, 37, true);
    let dir = tempfile::tempdir().unwrap();
    let mut j = export(dir.path(), &qwen);
    j["use_sliding_window"] = true.into();
    j["sliding_window"] = 4.into();
    let e = refusal(dir.path(), &j, &qwen);
    assert!(
        e.contains("sets use_sliding_window (sliding_window = 4)"),
        "{e}"
    );

    let mistral = model::mistral::MISTRAL.shape(2, 16, 4, 2, 4, 24, 8, 37, false);
    let mut j = export(dir.path(), &mistral);
    assert_eq!(j["sliding_window"], serde_json::Value::Null);
    j["sliding_window"] = 8.into();
    let kept = model::from_hf_config(&j).unwrap();
    assert_eq!(kept.sliding_window, Some(8));
    kept.validate().unwrap();
    std::fs::write(dir.path().join("config.json"), j.to_string()).unwrap();
    hf::init_from::read(dir.path(), &kept).unwrap();
    let e = refusal(dir.path(), &j, &mistral);
    assert!(
        e.contains("has sliding_window = 8, this run model.sliding_window = null"),
        "{e}"
    );
    // Absent, transformers' MistralConfig default of 4096 applies.
    j.as_object_mut().unwrap().remove("sliding_window");
    assert_eq!(
        model::from_hf_config(&j).unwrap().sliding_window,
        Some(4096)
    );
    let short = model::ModelConfig {
        sliding_window: Some(4),
        ..mistral
    };
    let e = short.validate().unwrap_err().to_string();
    assert!(
        e.contains("model.sliding_window: 4 is shorter than seq_len = 8"),
        "{e}"
    );
}
