use super::*;

fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn sets(specs: &[&str]) -> Overrides {
    let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
    Overrides::parse(&specs).unwrap()
}

const BASE: &str =
    "[model]\npreset = \"tiny\"\n[data]\ntrain = [\"x.jsonl\"]\nvalid_fraction = 0.1\n";

#[test]
fn overrides_take_precedence_and_parse_as_toml() {
    let (_d, path) = write(BASE);
    let c = RunConfig::load(&path, &sets(&["train.steps=40", "log.dir=\"runs/a\""])).unwrap();
    assert_eq!(c.train.steps, 40);
    assert_eq!(c.log.dir, PathBuf::from("runs/a"));
    assert_eq!(c.train.micro_batch, 8);
}

#[test]
fn unknown_key_is_named_with_the_file() {
    let (_d, path) = write(&format!("{BASE}[train]\nstepz = 3\n"));
    let e = RunConfig::load(&path, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("run.toml") && e.contains("train.stepz"), "{e}");
    let e = RunConfig::load(&write(BASE).1, &sets(&["train.nope=1"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("train.nope"), "{e}");
}

#[test]
fn an_error_from_the_command_line_names_the_set_argument() {
    let (_d, path) = write(BASE);
    for (set, want) in [
        (
            "train.steps=0",
            "--set train.steps=0: train.steps must be positive",
        ),
        (
            "train.steps=\"many\"",
            "--set train.steps=\"many\": train.steps: invalid type",
        ),
    ] {
        let e = format!("{:#}", RunConfig::load(&path, &sets(&[set])).unwrap_err());
        assert!(e.starts_with(want) && !e.contains("run.toml"), "{e}");
    }
    // The same mistake in the file names the file.
    let (_d, path) = write(&format!("{BASE}[train]\nsteps = 0\n"));
    let e = format!(
        "{:#}",
        RunConfig::load(&path, &Overrides::default()).unwrap_err()
    );
    assert!(e.contains("run.toml: train.steps must be positive"), "{e}");
}

#[test]
fn wrong_type_is_named() {
    let (_d, path) = write(&format!("{BASE}[train]\nsteps = \"many\"\n"));
    let e = RunConfig::load(&path, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("train.steps") && !e.contains('\n'), "{e}");
}

#[test]
fn indivisible_global_batch_is_refused() {
    let (_d, path) = write(&format!(
        "{BASE}[train]\nmicro_batch = 3\nglobal_batch = 8\n"
    ));
    let e = format!(
        "{:#}",
        RunConfig::load(&path, &Overrides::default()).unwrap_err()
    );
    assert!(e.contains("not divisible"), "{e}");
}

#[test]
fn emulated_link_needs_nccl_and_a_positive_rate() {
    let (_d, path) = write(BASE);
    for (set, want) in [
        ("dist.emulated_link_gbps=100.0", "\"nccl\" only"),
        ("dist.emulated_link_gbps=0.0", "must be positive"),
        ("dist.emulated_link_gbps=-5.0", "must be positive"),
    ] {
        let e = format!("{:#}", RunConfig::load(&path, &sets(&[set])).unwrap_err());
        assert!(
            e.contains("dist.emulated_link_gbps") && e.contains(want),
            "{e}"
        );
    }
}

#[test]
fn retention_defaults_and_milestones_on_checkpoints() {
    let (_d, path) = write(BASE);
    let c = RunConfig::load(&path, &Overrides::default()).unwrap();
    assert_eq!((c.checkpoint.keep_last, c.checkpoint.keep_every), (3, 0));
    let ok = sets(&["checkpoint.interval=2", "checkpoint.keep_every=4"]);
    assert!(RunConfig::load(&path, &ok).is_ok());
    let bad = sets(&["checkpoint.interval=4", "checkpoint.keep_every=6"]);
    let e = format!("{:#}", RunConfig::load(&path, &bad).unwrap_err());
    assert!(e.contains("checkpoint.keep_every = 6"), "{e}");
}

#[test]
fn preset_sizes_can_be_overridden() {
    let (_d, path) = write(&BASE.replace("[data]", "n_embd = 32\n[data]"));
    let c = RunConfig::load(&path, &Overrides::default())
        .unwrap()
        .model
        .resolve(None)
        .unwrap();
    assert_eq!((c.n_layer, c.n_embd), (2, 32));
    let (_d, path) = write(&BASE.replace("[data]", "n_embd = 30\n[data]"));
    assert!(
        RunConfig::load(&path, &Overrides::default()).is_err(),
        "30 is not a multiple of 4 heads"
    );
}

#[test]
fn only_trajectory_keys_other_than_the_model_may_change() {
    assert!(may_change("train.lr") && may_change("zero.qgz_until"));
    assert!(!may_change("model.n_embd") && !may_change("train.lrr"));
    assert!(
        !may_change("dist.world_size"),
        "not a trajectory key: needs no allowing"
    );
}

/// `trainer plot` names a run by its `[zero]` section, reading absent keys as the defaults:
/// report's copy of them (it does not depend on zero) must be zero's.
#[test]
fn plot_labels_read_absent_zero_keys_as_the_defaults() {
    let ours = report::plot::ZeroSettings::default();
    let z = zero::ZeroConfig::default();
    assert_eq!(
        (
            ours.qwz,
            ours.hpz_partition_size,
            ours.qgz,
            ours.qgz_until,
            ours.error_feedback
        ),
        (
            z.quantized_weights,
            z.hpz_partition_size,
            z.quantized_gradients,
            z.qgz_until,
            z.qgz_error_feedback
        )
    );
}

/// Llama 3.1 and 3.2 presets carry their rope scaling; `[model] rope_scaling` sets or clears
/// it in config.json's own terms, and a GPT-2 refuses one in a line naming the key.
#[test]
fn rope_scaling_comes_from_the_preset_or_the_section() {
    let llama = BASE.replace("\"tiny\"", "\"llama3.2-1b\"");
    let (_d, path) = write(&llama);
    let c = RunConfig::load(&path, &Overrides::default()).unwrap();
    let m = c.model.resolve(None).unwrap();
    assert_eq!(m.rope_scaling, model::LLAMA3_2_SCALING);
    let none = sets(&["model.rope_scaling={ rope_type = \"default\" }"]);
    let m = RunConfig::load(&path, &none).unwrap().model.resolve(None);
    assert_eq!(m.unwrap().rope_scaling, model::RopeScaling::Default);
    let set = format!("model.rope_scaling={}", model::LLAMA3_1_SCALING);
    let m = RunConfig::load(&path, &sets(&[&set]))
        .unwrap()
        .model
        .resolve(None);
    assert_eq!(m.unwrap().rope_scaling, model::LLAMA3_1_SCALING);
    let bad = sets(&["model.rope_scaling={ rope_type = \"yarn\", factor = 4.0 }"]);
    let e = format!("{:#}", RunConfig::load(&path, &bad).unwrap_err());
    assert!(
        e.contains("model.rope_scaling") && e.contains("yarn"),
        "{e}"
    );
    let gpt = sets(&[&set]);
    let e = format!("{:#}", RunConfig::load(&write(BASE).1, &gpt).unwrap_err());
    assert!(e.contains("rope_scaling") && e.contains("learned"), "{e}");
}

/// `model.init_from` without a preset: config.json gives the family and the shape (Qwen3's own
/// head width, its context up to 2048 as seq_len, its vocabulary over the tokenizer's); a key
/// set in `[model]` overrides it; another arch, or a folder without config.json, is one line.
#[test]
fn init_from_alone_gives_the_family_and_the_shape() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    let config = serde_json::json!({
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 192, "vocab_size": 1000, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true
    });
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    let text = format!(
        "[model]\ninit_from = {:?}\n[data]\ntrain = [\"x.jsonl\"]\nvalid_fraction = 0.1\n",
        hf.display().to_string()
    );
    let (_d, path) = write(&text);
    let c = RunConfig::load(&path, &Overrides::default()).unwrap();
    let m = c.model.resolve(Some(50257)).unwrap();
    assert_eq!(
        (m.arch.name(), m.n_layer, m.n_embd, m.head_dim, m.qk_norm),
        ("qwen3", 2, 64, 32, true)
    );
    assert_eq!((m.seq_len, m.vocab_size, m.n_kv_head), (2048, 1000, 2));
    assert_eq!(
        (m.norm_eps, m.rope_theta, m.tie_embeddings),
        (1e-6, 1e6, true)
    );
    let m = RunConfig::load(&path, &sets(&["model.seq_len=512"]))
        .unwrap()
        .model
        .resolve(None)
        .unwrap();
    assert_eq!(m.seq_len, 512);
    let e = format!(
        "{:#}",
        RunConfig::load(&path, &sets(&["model.arch=\"llama\""])).unwrap_err()
    );
    assert!(
        e.contains("model.arch = \"llama\" contradicts model.init_from") && e.contains("qwen3"),
        "{e}"
    );
    std::fs::remove_file(hf.join("config.json")).unwrap();
    let e = format!(
        "{:#}",
        RunConfig::load(&path, &Overrides::default()).unwrap_err()
    );
    assert!(
        e.contains("model.init_from: cannot read") && e.contains("config.json"),
        "{e}"
    );
}

/// `model.recompute` takes a bool or a mode's name; "attention" is for Llama-family blocks,
/// and GPT-2's refuse it in one line, as an unknown name is.
#[test]
fn recompute_takes_a_bool_or_a_mode() {
    let (_d, path) = write(BASE);
    let llama = "model.preset=\"llama-tiny\"";
    for (set, want) in [
        ("model.recompute=true", model::Recompute::Full),
        ("model.recompute=false", model::Recompute::Off),
        ("model.recompute=\"attention\"", model::Recompute::Attention),
    ] {
        let c = RunConfig::load(&path, &sets(&[llama, set])).unwrap();
        assert_eq!(c.model.recompute, want, "{set}");
    }
    for (set, want) in [
        (
            "model.recompute=\"attention\"",
            "a gpt2 block takes true or false",
        ),
        ("model.recompute=\"mlp\"", "model.recompute"),
    ] {
        let e = format!("{:#}", RunConfig::load(&path, &sets(&[set])).unwrap_err());
        assert!(
            e.contains(want) && e.contains("attention") && !e.contains('\n'),
            "{e}"
        );
    }
}
