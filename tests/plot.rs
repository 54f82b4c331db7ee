//! `trainer plot` end to end, on synthetic run folders (metrics.jsonl + config.toml) and
//! `trainer bench --json` files in a temporary folder: the PNGs, the legend labels taken from
//! the runs' configs, `--zoom`, the `--bench` table, and one-line errors that name the file.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{assert_ok, only_error_line, stderr, trainer};

/// `trainer plot ARGS...`.
fn plot<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    trainer().arg("plot").args(args).output().unwrap()
}

/// (width, height) of a PNG file, from its IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "not a PNG: {}",
        path.display()
    );
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

/// The resolved config the trainer writes, as `--print-config` prints it, with the `[zero]`
/// settings `zero` (`key=value` overrides).
fn resolved_config(zero: &[&str]) -> String {
    let mut c = trainer();
    c.args(["--config", "configs/tiny.toml", "--print-config"]);
    for s in zero {
        c.args(["--set", &format!("zero.{s}")]);
    }
    let out = c.output().unwrap();
    assert_ok(&out);
    String::from_utf8(out.stdout).unwrap()
}

/// A run folder `dir/name` with 100 steps of training loss (logged every step) and a
/// validation loss every 10 steps, `gap` above a common curve, and `config` as config.toml.
fn run_folder(dir: &Path, name: &str, gap: f64, config: Option<&str>) -> PathBuf {
    let run = dir.join(name);
    std::fs::create_dir_all(&run).unwrap();
    let curve = |step: u64| 3.0 + 7.8 * (-(step as f64) / 25.0).exp() + gap;
    let mut lines = vec![format!(
        r#"{{"step":0,"tokens":0,"val_loss":{}}}"#,
        curve(0)
    )];
    for step in 1..=100u64 {
        let noise = if step % 2 == 0 { 0.05 } else { -0.05 };
        lines.push(format!(
            r#"{{"step":{step},"tokens":{},"loss":{},"lr":0.001,"grad_norm":1.0,"tokens_per_s":1.0,"comm_intra_bytes":0,"comm_inter_bytes":0,"qwz":false,"hpz":false,"qgz":false}}"#,
            step * 1024,
            curve(step) + noise
        ));
        if step % 10 == 0 {
            lines.push(format!(
                r#"{{"step":{step},"tokens":{},"val_loss":{}}}"#,
                step * 1024,
                curve(step)
            ));
        }
    }
    std::fs::write(run.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
    if let Some(config) = config {
        std::fs::write(run.join("config.toml"), config).unwrap();
    }
    run
}

/// The five runs of the ZeRO++ ablation (0.1% apart at the end), as resolved configs.
fn ablation(dir: &Path) -> Vec<PathBuf> {
    let zpp = [
        "quantized_weights=true",
        "hpz_partition_size=2",
        "quantized_gradients=true",
    ];
    let feedback = {
        // Written by a trainer that knows qgz_error_feedback, whether or not this one does.
        let text = resolved_config(&zpp);
        match text.contains("qgz_error_feedback = false") {
            true => text.replace("qgz_error_feedback = false", "qgz_error_feedback = true"),
            false => text.replace("[zero]\n", "[zero]\nqgz_error_feedback = true\n"),
        }
    };
    let half: Vec<&str> = zpp.iter().copied().chain(["qgz_until=0.5"]).collect();
    let configs = [
        ("zero3", resolved_config(&[])),
        (
            "qwz-hpz",
            resolved_config(&["quantized_weights=true", "hpz_partition_size=2"]),
        ),
        ("qgz-half", resolved_config(&half)),
        ("zeropp", resolved_config(&zpp)),
        ("zeropp-ef", feedback),
    ];
    configs
        .iter()
        .enumerate()
        .map(|(i, (name, config))| run_folder(dir, name, 0.003 * i as f64, Some(config)))
        .collect()
}

#[test]
fn loss_plot_names_runs_by_their_zero_settings() {
    let dir = tempfile::tempdir().unwrap();
    let runs = ablation(dir.path());
    let png = dir.path().join("figures/ablation.png");
    let mut args: Vec<PathBuf> = runs.clone();
    args.extend(["--output".into(), png.clone()]);
    let out = plot(&args);
    assert_ok(&out);
    assert_eq!(png_size(&png), (1024, 640));
    let err = stderr(&out);
    assert!(err.contains("5 run(s) over 102.4K tokens"), "{err}");
    let legend = "legend: ZeRO-3, qwZ+hpZ, ZeRO++ (qgZ until 50%), ZeRO++, ZeRO++ + error feedback";
    assert!(err.contains(legend), "{err}");

    // --label overrides, one per input; the wrong count is one error line.
    let mut named: Vec<PathBuf> = runs[..2].to_vec();
    named.extend(["--label", "base", "--label", "quantised", "--output"].map(PathBuf::from));
    named.push(dir.path().join("named.png"));
    let out = plot(&named);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("legend: base, quantised"),
        "{}",
        stderr(&out)
    );
    let e = only_error_line(&plot(&[
        runs[0].as_os_str(),
        runs[1].as_os_str(),
        "--label".as_ref(),
        "one".as_ref(),
        "--output".as_ref(),
        dir.path().join("x.png").as_os_str(),
    ]));
    assert!(e.contains("1 --label for 2 input(s)"), "{e}");
}

#[test]
fn loss_plot_falls_back_to_folder_names() {
    let dir = tempfile::tempdir().unwrap();
    // The README's demo: one run folder (its config names it nothing the folder does not).
    let demo = run_folder(dir.path(), "demo", 0.0, Some(&resolved_config(&[])));
    let png = demo.join("loss.png");
    let out = plot(&[demo.as_os_str(), "--output".as_ref(), png.as_os_str()]);
    assert_ok(&out);
    assert_eq!(png_size(&png), (1024, 640));
    let err = stderr(&out);
    assert!(
        err.contains("1 run(s)") && err.contains("legend: ZeRO-3 (demo)"),
        "{err}"
    );
    // Two runs of the same settings, and one with no config: folder names.
    let z3 = resolved_config(&[]);
    let a = run_folder(dir.path(), "lr-a", 0.0, Some(&z3));
    let b = run_folder(dir.path(), "lr-b", 0.01, Some(&z3));
    let c = run_folder(dir.path(), "old", 0.02, None);
    let png = dir.path().join("lr.png");
    let out = plot(&[
        a.join("metrics.jsonl").as_os_str(),
        b.as_os_str(),
        c.as_os_str(),
        "--output".as_ref(),
        png.as_os_str(),
    ]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("legend: lr-a, lr-b, old"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn loss_plot_zoom_and_smooth() {
    let dir = tempfile::tempdir().unwrap();
    let runs = ablation(dir.path());
    let png = dir.path().join("zoom.png");
    let mut args: Vec<PathBuf> = runs.clone();
    args.extend(["--zoom", "0.3", "--smooth", "5", "--output"].map(PathBuf::from));
    args.push(png.clone());
    assert_ok(&plot(&args));
    assert_eq!(
        png_size(&png),
        (1024 + 576, 640),
        "the zoom panel is beside"
    );

    let raw = dir.path().join("raw.png");
    let args = [runs[0].as_os_str(), "--smooth".as_ref(), "1".as_ref()];
    assert_ok(&plot(
        &[&args[..], &["--output".as_ref(), raw.as_os_str()]].concat(),
    ));
    assert_eq!(png_size(&raw), (1024, 640));

    for (option, value, want) in [
        ("--zoom", "0", "--zoom 0"),
        ("--zoom", "1.5", "--zoom 1.5"),
        ("--smooth", "0", "--smooth 0"),
    ] {
        let out = plot(&[
            runs[0].as_os_str(),
            option.as_ref(),
            value.as_ref(),
            "--output".as_ref(),
            dir.path().join("bad.png").as_os_str(),
        ]);
        let e = only_error_line(&out);
        assert!(e.contains(want), "{e}");
    }
}

/// One `trainer bench --json` line (the fields the figure reads and a few it ignores).
fn bench_line(techniques: &str, network: &str, gbps: Option<f64>, tokens_per_s: f64) -> String {
    serde_json::json!({
        "model": "gpt350m", "params": 354_000_000, "world": 2, "nodes": 2, "gpus": 2,
        "device": "cuda", "precision": "bf16", "techniques": techniques, "backend": "nccl",
        "network": network, "emulated_link_gbps": gbps, "tokens_per_step": 32768, "steps": 5,
        "step_seconds": 32768.0 / tokens_per_s, "tokens_per_s": tokens_per_s,
        "mfu": 0.3, "jobs": [], "loss_first": 10.9, "loss_last": 10.8,
    })
    .to_string()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn bench_plot_draws_the_sweep_and_prints_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let zpp = "ZeRO-3 + qwZ+qgZ";
    let nvlink = dir.path().join("nvlink.json");
    write_lines(
        &nvlink,
        &[
            bench_line("ZeRO-3", "nccl", None, 80000.0),
            bench_line(zpp, "nccl", None, 76000.0),
            bench_line("ZeRO-3", "nccl sockets", None, 20000.0),
            bench_line(zpp, "nccl sockets", None, 36000.0),
        ],
    );
    let sweep = dir.path().join("sweep.json");
    let mut lines = Vec::new();
    for (gbps, z3, zp) in [
        (400.0, 70000.0, 74000.0),
        (50.0, 30000.0, 60000.0),
        (12.5, 9000.0, 31500.0),
    ] {
        lines.push(bench_line("ZeRO-3", "emulated link", Some(gbps), z3));
        lines.push(bench_line(zpp, "emulated link", Some(gbps), zp));
    }
    write_lines(&sweep, &lines);
    let png = dir.path().join("sweep.png");
    let out = plot(&[
        "--bench".as_ref(),
        nvlink.as_os_str(),
        sweep.as_os_str(),
        "--output".as_ref(),
        png.as_os_str(),
    ]);
    assert_ok(&out);
    assert_eq!(png_size(&png), (1024, 640));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(
        rows,
        [
            "| link (Gb/s a node) | ZeRO-3 tokens/s per GPU | ZeRO-3 + qwZ+qgZ tokens/s per GPU | ratio |",
            "| --- | --- | --- | --- |",
            "| NVLink | 40000 | 38000 | 0.95 |",
            "| 400 | 35000 | 37000 | 1.06 |",
            "| 50 | 15000 | 30000 | 2.00 |",
            "| 12.5 | 4500 | 15750 | 3.50 |",
            "| sockets | 10000 | 18000 | 1.80 |",
        ],
        "{stdout}"
    );
    assert!(
        stdout.starts_with("gpt350m, 32768 tokens a step on 2 GPU(s)"),
        "{stdout}"
    );
    assert!(stderr(&out).contains("2 technique set(s) from 10 bench line(s)"));
}

#[test]
fn bad_inputs_give_one_error_line_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("out.png");
    let out = |args: &[&std::ffi::OsStr]| {
        let mut all = args.to_vec();
        all.extend(["--output".as_ref(), png.as_os_str()]);
        only_error_line(&plot(&all))
    };

    let missing = dir.path().join("missing-run");
    let e = out(&[missing.as_os_str()]);
    assert!(
        e.contains("missing-run") && e.contains("No such file"),
        "{e}"
    );
    let e = out(&["--bench".as_ref(), dir.path().join("nope.json").as_os_str()]);
    assert!(e.contains("nope.json") && e.contains("No such file"), "{e}");

    let no_rate = dir.path().join("no-rate.json");
    let line = bench_line("ZeRO-3", "nccl", None, 1000.0).replace("\"tokens_per_s\"", "\"tps\"");
    write_lines(&no_rate, &[line]);
    let e = out(&["--bench".as_ref(), no_rate.as_os_str()]);
    assert!(
        e.contains("no-rate.json line 1") && e.contains("tokens_per_s"),
        "{e}"
    );

    let run = run_folder(dir.path(), "run", 0.0, None);
    let good = dir.path().join("good.json");
    write_lines(&good, &[bench_line("ZeRO-3", "nccl", None, 1000.0)]);
    let e = out(&[run.as_os_str(), "--bench".as_ref(), good.as_os_str()]);
    assert!(
        e.contains(&format!("{} is a metrics input", run.display())),
        "{e}"
    );
    // A run folder after --bench is taken as a bench file, and said to be a folder.
    let e = out(&["--bench".as_ref(), good.as_os_str(), run.as_os_str()]);
    assert!(e.contains(&format!("{}: a folder", run.display())), "{e}");
    let e = out(&[
        "--bench".as_ref(),
        good.as_os_str(),
        "--zoom".as_ref(),
        "0.5".as_ref(),
    ]);
    assert!(e.contains("options of loss plots"), "{e}");

    let bad = run.join("metrics.jsonl");
    std::fs::write(
        &bad,
        "{\"step\":1,\"tokens\":8,\"loss\":3.0}\n{\"step\":2,\"tok",
    )
    .unwrap();
    let e = out(&[run.as_os_str()]);
    assert!(
        e.contains("metrics.jsonl line 2: not a metrics line"),
        "{e}"
    );
    let e = out(&[]);
    assert!(e.contains("name at least one metrics.jsonl"), "{e}");
}
