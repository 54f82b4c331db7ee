//! Legend labels of loss curves: each run named by its ZeRO settings, as the ZeRO++ paper names
//! them ("ZeRO-3", "qwZ+hpZ", "ZeRO++", "ZeRO++ (qgZ until 50%)", "ZeRO++ + error feedback"),
//! read from the `config.toml` the trainer writes into the run folder.
//!
//! A label names a run apart from the others plotted with it: when the configs give every run
//! the same name (runs that differ in something other than ZeRO), or a run has no config, the
//! folder's name is the label; two runs of the same ZeRO settings among different ones get the
//! folder's name after it.

use std::path::{Path, PathBuf};

use crate::{bail, Context, Result};

/// The `[zero]` keys that tell the runs of a ZeRO++ ablation apart.
#[derive(Clone, Debug, PartialEq)]
pub struct ZeroSettings {
    /// qwZ (`quantized_weights`).
    pub qwz: bool,
    /// `hpz_partition_size`: hpZ when above 1.
    pub hpz_partition_size: usize,
    /// qgZ (`quantized_gradients`).
    pub qgz: bool,
    /// `qgz_until`: the share of the steps that use qgZ.
    pub qgz_until: f64,
    /// `qgz_error_feedback` (absent in configs of trainers before it: false).
    pub error_feedback: bool,
}

impl Default for ZeroSettings {
    /// The trainer's defaults (plain ZeRO-3, `zero::ZeroConfig::default()`; the trainer's
    /// tests check the two agree), for keys a config does not hold.
    fn default() -> Self {
        ZeroSettings {
            qwz: false,
            hpz_partition_size: 1,
            qgz: false,
            qgz_until: 1.0,
            error_feedback: false,
        }
    }
}

impl ZeroSettings {
    /// Reads `[zero]` of the config at `path`; `None` when there is no such file. The file is
    /// read as a plain TOML table, not as the trainer's run config, so that the folder of
    /// a run by an older or newer trainer (other keys) still gets its label; a key of the wrong
    /// type is an error naming the file and the key.
    pub fn read(path: &Path) -> Result<Option<Self>> {
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            crate::ReportError::Invalid(format!("{}: {}", path.display(), e.message()))
        })?;
        Self::from_table(&table)
            .map(Some)
            .with_context(|| path.display().to_string())
    }

    /// The settings of a parsed config's `[zero]` section.
    pub fn from_table(table: &toml::Table) -> Result<Self> {
        let mut s = ZeroSettings::default();
        let Some(zero) = table.get("zero") else {
            return Ok(s);
        };
        let zero = zero.as_table().context("[zero] is not a section")?;
        let flag = |key: &str, default: bool| -> Result<bool> {
            match zero.get(key) {
                None => Ok(default),
                Some(v) => v
                    .as_bool()
                    .with_context(|| format!("zero.{key} = {v}: expected true or false")),
            }
        };
        s.qwz = flag("quantized_weights", s.qwz)?;
        s.qgz = flag("quantized_gradients", s.qgz)?;
        s.error_feedback = flag("qgz_error_feedback", s.error_feedback)?;
        if let Some(v) = zero.get("hpz_partition_size") {
            s.hpz_partition_size = v
                .as_integer()
                .and_then(|n| usize::try_from(n).ok())
                .with_context(|| format!("zero.hpz_partition_size = {v}: expected a count"))?;
        }
        if let Some(v) = zero.get("qgz_until") {
            s.qgz_until = v
                .as_float()
                .or_else(|| v.as_integer().map(|n| n as f64))
                .with_context(|| format!("zero.qgz_until = {v}: expected a fraction"))?;
        }
        Ok(s)
    }

    /// The settings' name: "ZeRO++" for qwZ + hpZ + qgZ, else the techniques on joined by `+`
    /// ("qwZ+hpZ"), or "ZeRO-3" for none; then, with qgZ, its schedule ("(qgZ until 50%)")
    /// and "+ error feedback". `qgz_until` and error feedback change nothing without qgZ, so
    /// they are not named then.
    pub fn describe(&self) -> String {
        let hpz = self.hpz_partition_size > 1;
        let mut name = match (self.qwz, hpz, self.qgz) {
            (true, true, true) => "ZeRO++".to_string(),
            (false, false, false) => "ZeRO-3".to_string(),
            _ => [("qwZ", self.qwz), ("hpZ", hpz), ("qgZ", self.qgz)]
                .iter()
                .filter(|(_, on)| *on)
                .map(|(t, _)| *t)
                .collect::<Vec<_>>()
                .join("+"),
        };
        if self.qgz && self.qgz_until < 1.0 {
            let percent = format!("{:.1}", 100.0 * self.qgz_until);
            let percent = percent.strip_suffix(".0").unwrap_or(&percent);
            name.push_str(&format!(" (qgZ until {percent}%)"));
        }
        if self.qgz && self.error_feedback {
            name.push_str(" + error feedback");
        }
        name
    }
}

/// The folder a metrics file belongs to (`runs/abc/metrics.jsonl` -> `runs/abc`), where its
/// `config.toml` is; a file of another name stands for itself.
pub fn run_folder(metrics: &Path) -> PathBuf {
    metrics.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The name of a run without a config: its folder's name (`runs/abc/metrics.jsonl` -> `abc`),
/// or the file's for a metrics file of another name (`abc.jsonl`).
pub fn folder_name(metrics: &Path) -> String {
    let stem = if metrics.file_name().is_some_and(|n| n == "metrics.jsonl") {
        metrics.parent()
    } else {
        Some(metrics)
    };
    stem.and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| metrics.display().to_string())
}

/// One label per run, from (folder name, settings read from its config if it has one): a run
/// alone is named by its settings and its folder; several, by the settings' names when they
/// tell at least two runs apart, with the folder name added to a name
/// that several runs share; else the folder names.
pub fn labels(runs: &[(String, Option<ZeroSettings>)]) -> Vec<String> {
    let names: Vec<Option<String>> = runs
        .iter()
        .map(|(_, s)| s.as_ref().map(ZeroSettings::describe))
        .collect();
    // A run alone: its techniques and its folder.
    if let [(folder, _)] = runs {
        return vec![match &names[0] {
            Some(n) => format!("{n} ({folder})"),
            None => folder.clone(),
        }];
    }
    let mut distinct: Vec<&String> = names.iter().flatten().collect();
    distinct.sort();
    distinct.dedup();
    if distinct.len() < 2 {
        return runs.iter().map(|(folder, _)| folder.clone()).collect();
    }
    let count = |n: &String| names.iter().flatten().filter(|m| *m == n).count();
    runs.iter()
        .zip(&names)
        .map(|((folder, _), name)| match name {
            Some(n) if count(n) > 1 => format!("{n} ({folder})"),
            Some(n) => n.clone(),
            None => folder.clone(),
        })
        .collect()
}

/// The labels of the runs whose metrics files are `inputs`: `overrides` (`--label`, one per
/// input) if given, else [`labels`] of their configs.
pub fn for_inputs(inputs: &[PathBuf], overrides: &[String]) -> Result<Vec<String>> {
    if !overrides.is_empty() {
        if overrides.len() != inputs.len() {
            bail!(
                "plot: {} --label for {} input(s): give one --label per input, in order",
                overrides.len(),
                inputs.len()
            );
        }
        return Ok(overrides.to_vec());
    }
    let runs = inputs
        .iter()
        .map(|m| {
            let config = run_folder(m).join("config.toml");
            Ok((folder_name(m), ZeroSettings::read(&config)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(labels(&runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> ZeroSettings {
        ZeroSettings::from_table(&text.parse().unwrap()).unwrap()
    }

    /// The five runs of the ablation, as their `[zero]` sections.
    const ABLATION: [(&str, &str); 5] = [
        (
            "zero3",
            "[zero]\nquantized_weights = false\nhpz_partition_size = 1\nquantized_gradients = false\n",
        ),
        (
            "qwz_hpz",
            "[zero]\nquantized_weights = true\nhpz_partition_size = 8\nquantized_gradients = false\n",
        ),
        (
            "half",
            "[zero]\nquantized_weights = true\nhpz_partition_size = 8\nquantized_gradients = true\nqgz_until = 0.5\n",
        ),
        (
            "zeropp",
            "[zero]\nquantized_weights = true\nhpz_partition_size = 8\nquantized_gradients = true\nqgz_until = 1.0\n",
        ),
        (
            "ef",
            "[zero]\nquantized_weights = true\nhpz_partition_size = 8\nquantized_gradients = true\nqgz_error_feedback = true\n",
        ),
    ];

    #[test]
    fn plot_labels_name_every_ablation_run() {
        let runs: Vec<(String, Option<ZeroSettings>)> = ABLATION
            .iter()
            .map(|(folder, text)| (folder.to_string(), Some(settings(text))))
            .collect();
        assert_eq!(
            labels(&runs),
            [
                "ZeRO-3",
                "qwZ+hpZ",
                "ZeRO++ (qgZ until 50%)",
                "ZeRO++",
                "ZeRO++ + error feedback"
            ]
        );
    }

    #[test]
    fn plot_labels_of_single_techniques_and_defaults() {
        let one = |text: &str| settings(text).describe();
        assert_eq!(one(""), "ZeRO-3", "no [zero]: the defaults");
        assert_eq!(one("[zero]\nstage = 3\n"), "ZeRO-3");
        assert_eq!(one("[zero]\nquantized_weights = true\n"), "qwZ");
        assert_eq!(one("[zero]\nhpz_partition_size = 4\n"), "hpZ");
        assert_eq!(
            one("[zero]\nquantized_gradients = true\nqgz_until = 0.25\n"),
            "qgZ (qgZ until 25%)"
        );
        assert_eq!(
            one(
                "[zero]\nquantized_weights = true\nquantized_gradients = true\nqgz_until = 0.333\n"
            ),
            "qwZ+qgZ (qgZ until 33.3%)"
        );
        // Without qgZ, its schedule and error feedback do nothing and are not named.
        assert_eq!(
            one("[zero]\nquantized_weights = true\nqgz_until = 0.5\nqgz_error_feedback = true\n"),
            "qwZ"
        );
        assert_eq!(
            one("[zero]\nquantized_weights = true\nhpz_partition_size = 8\nquantized_gradients = true\nqgz_until = 0.5\nqgz_error_feedback = true\n"),
            "ZeRO++ (qgZ until 50%) + error feedback"
        );
    }

    #[test]
    fn plot_labels_fall_back_to_folder_names() {
        let zpp = || Some(settings(ABLATION[3].1));
        let z3 = || Some(settings(ABLATION[0].1));
        // The same settings everywhere (a learning-rate sweep): the folders tell them apart.
        let runs = vec![("lr1".to_string(), zpp()), ("lr2".to_string(), zpp())];
        assert_eq!(labels(&runs), ["lr1", "lr2"]);
        // A single run is named by its techniques and its folder; without a config, its folder.
        assert_eq!(labels(&[("demo".to_string(), zpp())]), ["ZeRO++ (demo)"]);
        assert_eq!(labels(&[("demo".to_string(), None)]), ["demo"]);
        // No configs at all.
        assert_eq!(
            labels(&[("a".into(), None), ("b".into(), None)]),
            ["a", "b"]
        );
        // A run without a config among runs with different ones, and two alike.
        let runs = vec![
            ("base".to_string(), z3()),
            ("seed1".to_string(), zpp()),
            ("seed2".to_string(), zpp()),
            ("old".to_string(), None),
        ];
        assert_eq!(
            labels(&runs),
            ["ZeRO-3", "ZeRO++ (seed1)", "ZeRO++ (seed2)", "old"]
        );
    }

    #[test]
    fn plot_labels_folder_names_and_overrides() {
        assert_eq!(folder_name(Path::new("runs/abc/metrics.jsonl")), "abc");
        assert_eq!(folder_name(Path::new("runs/abc.jsonl")), "abc.jsonl");
        assert_eq!(
            run_folder(Path::new("runs/abc/metrics.jsonl")),
            Path::new("runs/abc")
        );
        let inputs = [
            PathBuf::from("a/metrics.jsonl"),
            PathBuf::from("b/metrics.jsonl"),
        ];
        let named = for_inputs(&inputs, &["x".into(), "y".into()]).unwrap();
        assert_eq!(named, ["x", "y"]);
        let e = for_inputs(&inputs, &["x".into()]).unwrap_err().to_string();
        assert!(e.contains("1 --label for 2 input(s)"), "{e}");
    }

    #[test]
    fn plot_labels_refuse_a_key_of_the_wrong_type() {
        let table = "[zero]\nquantized_weights = \"yes\"\n".parse().unwrap();
        let e = ZeroSettings::from_table(&table).unwrap_err().line();
        assert!(e.contains("zero.quantized_weights"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "[zero]\nhpz_partition_size = -2\n").unwrap();
        let e = ZeroSettings::read(&path).unwrap_err().line();
        assert!(
            e.contains("config.toml") && e.contains("zero.hpz_partition_size"),
            "{e}"
        );
        assert!(ZeroSettings::read(&dir.path().join("none.toml"))
            .unwrap()
            .is_none());
    }
}
