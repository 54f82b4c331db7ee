//! End-to-end tests of what a cluster does to a run (docs/operations.md): signals, a second
//! launch into a running run's directory, resuming with changed settings or on another world
//! size, and restarts before the first checkpoint.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;
use common::{
    assert_ok, command, copy_dir, losses, metrics_lines, run_with, small_corpus, small_model_run,
    spawn_slow, stderr, wait_for_step,
};

/// A small model on one rank, with its run folder `run`.
fn small_run(run: &Path, train: &Path, steps: u64) -> Vec<String> {
    let mut sets = small_model_run(run, train);
    sets.extend([
        "train.micro_batch=4".into(),
        "train.global_batch=8".into(),
        "dist.world_size=1".into(),
        "dist.gpus_per_node=1".into(),
        format!("train.steps={steps}"),
        "train.lr=1e-3".into(),
        "train.warmup_steps=5".into(),
        "log.eval_interval=10".into(),
        "log.eval_samples=8".into(),
        "checkpoint.resume=true".into(),
    ]);
    sets
}

/// (step, "loss" or "val_loss") of every line: which lines the file holds, in order.
fn kinds(run: &Path) -> Vec<(u64, &'static str)> {
    metrics_lines(run)
        .iter()
        .map(|v| {
            let kind = if v.get("loss").is_some() {
                "loss"
            } else {
                "val_loss"
            };
            (v["step"].as_u64().unwrap(), kind)
        })
        .collect()
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_signal_stops_after_the_step_with_a_checkpoint_and_the_resume_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let straight = dir.path().join("straight");
    assert_ok(&run_with(&small_run(&straight, &corpus, 16), &[]));

    for name in ["TERM", "INT", "USR1"] {
        let run = dir.path().join(format!("stopped-{name}"));
        let sets = small_run(&run, &corpus, 16);
        let mut child = spawn_slow(&sets, &[], 100);
        wait_for_step(&mut child, &run, 3);
        signal(&child, name);
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(75), "{err}");
        let stopped_line = err
            .lines()
            .find(|l| l.starts_with(&format!("stopped by SIG{name} after step ")))
            .unwrap_or_else(|| panic!("no stop line: {err}"));
        // "stopped by SIGTERM after step 7 of 16: checkpoint ..."
        let step: u64 = stopped_line
            .split_whitespace()
            .nth(5)
            .unwrap()
            .parse()
            .unwrap();
        assert!((3..16).contains(&step), "{stopped_line}");
        assert!(run
            .join(format!("checkpoints/step_{step:08}/manifest.json"))
            .exists());
        assert_eq!(
            losses(&run).last().unwrap().0,
            step,
            "metrics end at the stop"
        );

        assert_ok(&run_with(&sets, &[]));
        assert_eq!(losses(&run), losses(&straight), "SIG{name}: bit for bit");
        assert_eq!(
            kinds(&run),
            kinds(&straight),
            "SIG{name}: no line twice or missing"
        );
    }
}

#[test]
fn a_second_signal_ends_a_stuck_run_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    // Rank 0 hangs at the start of step 4: the first signal cannot be acted on.
    let mut child = command(&small_run(&run, &corpus, 16), &[])
        .env("ZEROPP_HANG_RANK", "0@4")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_step(&mut child, &run, 3);
    signal(&child, "TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "one signal waits for the step"
    );
    signal(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 15), "{}", stderr(&out));
}

#[test]
fn a_second_launch_into_a_running_run_is_refused_and_the_first_is_unharmed() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let straight = dir.path().join("straight");
    assert_ok(&run_with(
        &small_run(&straight, &corpus, 12),
        &["checkpoint.interval=4"],
    ));

    let run = dir.path().join("run");
    let sets = small_run(&run, &corpus, 12);
    let mut first = spawn_slow(&sets, &["checkpoint.interval=4"], 150);
    wait_for_step(&mut first, &run, 5);
    let second = run_with(&sets, &["checkpoint.interval=4"]);
    let err = stderr(&second);
    assert!(!second.status.success());
    assert!(
        err.contains("is in use by another run")
            && err.contains(&format!("pid {}", first.id()))
            && err.lines().count() == 1,
        "{err}"
    );
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(losses(&run), losses(&straight), "the first run is unharmed");
    assert_eq!(kinds(&run), kinds(&straight));
    let checkpoints = |r: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(r.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(checkpoints(&run), checkpoints(&straight));
    // Once the first has ended, the directory is free again.
    let again = run_with(&sets, &[]);
    assert_ok(&again);
    assert!(stderr(&again).contains("nothing to do"));
}

#[test]
fn a_resume_with_changed_settings_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    let sets = small_run(&run, &corpus, 4);
    assert_ok(&run_with(&sets, &[]));
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let config = std::fs::read(run.join("config.toml")).unwrap();

    // Finished: nothing to do, and nothing rewritten (even with another log interval).
    let out = run_with(&sets, &["log.interval=2"]);
    assert_ok(&out);
    assert!(stderr(&out).contains("nothing to do"));
    assert_eq!(std::fs::read(run.join("config.toml")).unwrap(), config);

    for (set, key) in [
        ("train.lr=2e-3", "train.lr: 0.001 -> 0.002"),
        ("train.seed=7", "train.seed: 1234 -> 7"),
        ("train.global_batch=16", "train.global_batch: 8 -> 16"),
        (
            "zero.quantized_weights=true",
            "zero.quantized_weights: false -> true",
        ),
        ("train.steps=8", "train.decay_steps: 4 -> 8"),
    ] {
        let out = run_with(&sets, &[set, "train.steps=8"]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{set}: {err}");
        assert!(
            err.contains(key)
                && err.contains("checkpoint.allow_changes")
                && err.lines().count() == 1,
            "{set}: {err}"
        );
        assert_eq!(
            std::fs::read(run.join("metrics.jsonl")).unwrap(),
            metrics,
            "{set}"
        );
        assert_eq!(
            std::fs::read(run.join("config.toml")).unwrap(),
            config,
            "{set}"
        );
    }
    let out = run_with(
        &sets,
        &[
            "checkpoint.allow_changes=[\"train.lr\"]",
            "train.lr=2e-3",
            "train.steps=8",
        ],
    );
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("train.decay_steps"),
        "{err}"
    );

    // Allowed: the first line after the resume names the changes; tokens follow the new batch.
    let allowed = [
        "checkpoint.allow_changes=[\"train.lr\", \"train.global_batch\", \"train.decay_steps\"]",
        "train.lr=2e-3",
        "train.global_batch=16",
        "train.steps=6",
    ];
    let out = run_with(&sets, &allowed);
    assert_ok(&out);
    assert!(stderr(&out)
        .contains("allowed change (checkpoint.allow_changes): train.lr: 0.001 -> 0.002"));
    let lines = metrics_lines(&run);
    let step = |n: u64| {
        lines
            .iter()
            .find(|l| l["step"] == n && l.get("loss").is_some())
            .unwrap()
            .clone()
    };
    let fifth = step(5);
    let changed: Vec<&str> = fifth["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(
        changed,
        [
            "train.decay_steps: 4 -> 6",
            "train.global_batch: 8 -> 16",
            "train.lr: 0.001 -> 0.002"
        ]
    );
    assert!(step(6).get("changed").is_none());
    assert_eq!(step(4)["tokens"], 4 * 8 * 32);
    assert_eq!(step(5)["tokens"], 4 * 8 * 32 + 16 * 32);
    assert_eq!(step(6)["tokens"], 4 * 8 * 32 + 2 * 16 * 32);

    // An unknown key in the list is refused when the config is read.
    let out = run_with(&sets, &["checkpoint.allow_changes=[\"train.lrr\"]"]);
    let err = stderr(&out);
    assert!(
        err.contains("--set checkpoint.allow_changes") && err.contains("\"train.lrr\""),
        "{err}"
    );
}

#[test]
fn a_restart_before_the_first_checkpoint_starts_the_curve_again() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let run = dir.path().join("run");
    let sets = small_run(&run, &corpus, 8);
    let killed = command(&sets, &[])
        .env("ZEROPP_KILL_AT_STEP", "3")
        .output()
        .unwrap();
    assert!(!killed.status.success());
    assert!(!run.join("checkpoints").join("step_00000003").exists());
    assert_ok(&run_with(&sets, &[]));
    let straight = dir.path().join("straight");
    assert_ok(&run_with(&small_run(&straight, &corpus, 8), &[]));
    assert_eq!(
        kinds(&run),
        kinds(&straight),
        "one step-0 line, one line a step"
    );
    assert_eq!(losses(&run), losses(&straight));
}

/// `small_run` on `world` ranks, `per_node` a node, each with `8 / world` sequences a step.
fn on_ranks(run: &Path, corpus: &Path, steps: u64, world: usize, per_node: usize) -> Vec<String> {
    let mut sets = small_run(run, corpus, steps);
    sets.retain(|s| !s.starts_with("dist.") && !s.starts_with("train.micro_batch"));
    sets.push(format!("dist.world_size={world}"));
    sets.push(format!("dist.gpus_per_node={per_node}"));
    sets.push(format!("train.micro_batch={}", 8 / world));
    // The schedule of an 8-step run, whether this launch stops at 4 or goes on to 8.
    sets.push("train.decay_steps=8".into());
    sets
}

#[test]
fn a_checkpoint_of_4_ranks_resumes_on_2_and_8_and_with_zeropp_turned_on() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    // 4 ranks (2 nodes x 2) to step 8, with the checkpoint of step 4 kept aside.
    let straight = dir.path().join("straight");
    let half = dir.path().join("half");
    assert_ok(&run_with(&on_ranks(&half, &corpus, 4, 4, 2), &[]));
    assert_ok(&run_with(
        &on_ranks(&straight, &corpus, 8, 4, 2),
        &["checkpoint.interval=4"],
    ));
    let expected = losses(&straight);

    let zeropp = [
        "zero.quantized_weights=true",
        "zero.quantized_gradients=true",
        "zero.hpz_partition_size=4",
        "zero.weight_quant_block=64",
        "zero.grad_quant_block=64",
        "checkpoint.allow_changes=[\"zero.quantized_weights\", \"zero.quantized_gradients\"]",
    ];
    for (world, per_node, extra) in [(2, 2, &[][..]), (8, 4, &[][..]), (8, 4, &zeropp[..])] {
        let run = dir.path().join(format!("on{world}-{}", extra.len()));
        copy_dir(&half, &run);
        let out = run_with(&on_ranks(&run, &corpus, 8, world, per_node), extra);
        assert_ok(&out);
        assert!(
            stderr(&out).contains(&format!("its 4 ranks' shards re-sliced for {world}")),
            "{}",
            stderr(&out)
        );
        let got = losses(&run);
        assert_eq!(got.len(), expected.len());
        // Plain ZeRO-3: the same sums in another order. ZeRO++: the weights and gradients
        // quantised from step 5 on.
        let tolerance = if extra.is_empty() { 1e-5 } else { 2e-2 };
        for ((step, loss), (_, want)) in got.iter().zip(&expected) {
            let rel = (loss - want).abs() / want.abs();
            assert!(
                rel < tolerance,
                "{world} ranks {extra:?}, step {step}: {loss} vs {want}"
            );
        }
        // Step 5's loss is computed on the weights re-sliced from step 4: equal up to rounding
        // for ZeRO-3; with qwZ, up to INT8 rounding of the weights.
        let first = got.iter().find(|(s, _)| *s == 5).unwrap().1;
        let want = expected.iter().find(|(s, _)| *s == 5).unwrap().1;
        let tolerance = if extra.is_empty() { 1e-6 } else { 1e-3 };
        assert!((first - want).abs() / want < tolerance, "{first} vs {want}");
    }
}

/// qgZ with error feedback (all of ZeRO++ on 2 nodes x 2): a run stopped by a signal after a
/// step and launched again continues the straight run's curve bit for bit, because each rank's
/// error buffers are in its checkpoint file.
#[test]
fn a_run_with_qgz_error_feedback_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let feedback = [
        "zero.quantized_weights=true",
        "zero.quantized_gradients=true",
        "zero.qgz_error_feedback=true",
        "zero.hpz_partition_size=2",
        "zero.weight_quant_block=64",
        "zero.grad_quant_block=64",
    ];
    let straight = dir.path().join("straight");
    assert_ok(&run_with(&on_ranks(&straight, &corpus, 8, 4, 2), &feedback));
    let run = dir.path().join("resumed");
    let sets = on_ranks(&run, &corpus, 8, 4, 2);
    let mut child = spawn_slow(&sets, &feedback, 100);
    wait_for_step(&mut child, &run, 3);
    signal(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let ckpt = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("manifest.json").exists())
        .expect("the stop's checkpoint");
    let bytes = std::fs::read(ckpt.join("rank_00000.safetensors")).unwrap();
    let saved = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let names = saved.names();
    assert!(
        names.iter().any(|n| n.ends_with("qgz_error.hop1"))
            && names.iter().any(|n| n.ends_with("qgz_error.hop2")),
        "no error buffers in {names:?}"
    );
    assert_ok(&run_with(&sets, &feedback));
    assert_eq!(losses(&run), losses(&straight));
}
