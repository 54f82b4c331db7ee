//! What the commands that read a finished checkpoint share (`trainer export`, `eval`,
//! `generate`): the checkpoint a `--checkpoint` folder names, and the run that wrote it (its
//! `config.toml`, for the tokenizer, the validation data and the ZeRO settings).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::checkpoint;
use crate::config::{Overrides, RunConfig};

/// The checkpoint `dir` names: itself if it is a `step_<N>` folder (it holds a manifest), else
/// the newest checkpoint in it.
pub fn resolve(dir: &Path) -> Result<PathBuf> {
    if dir.join("manifest.json").exists() {
        return Ok(dir.to_path_buf());
    }
    if !dir.is_dir() {
        anyhow::bail!("--checkpoint {}: no such folder", dir.display());
    }
    checkpoint::newest(dir)?.with_context(|| {
        format!(
            "--checkpoint {}: holds no checkpoint (no step_<N> folder with a manifest.json)",
            dir.display()
        )
    })
}

/// The `config.toml` of the run directory above `ckpt` (`<log.dir>/checkpoints/step_<N>`,
/// or a `checkpoint.dir` elsewhere whose parent holds one), if there is one.
pub fn run_config_path(ckpt: &Path) -> Option<PathBuf> {
    ckpt.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("config.toml"))
        .find(|p| p.is_file())
}

/// The config of the run that wrote `ckpt`: `explicit` (the command's `--config`) if given,
/// else the run directory's `config.toml` ([`run_config_path`]), if there is one. A file that
/// is there but does not load is an error naming it.
pub fn run_config(ckpt: &Path, explicit: Option<&Path>) -> Result<Option<RunConfig>> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => match run_config_path(ckpt) {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    RunConfig::load(&path, &Overrides::default())
        .map(Some)
        .with_context(|| format!("the run's config {}", path.display()))
}

/// The run's tokenizer: `explicit` (a `--tokenizer` folder or tokenizer.json) if given, else
/// the run config's `data.tokenizer` (and `data.eod_token`), if it reads.
pub fn tokenizer(
    config: Option<&RunConfig>,
    explicit: Option<&Path>,
) -> Result<Option<data::Tokenizer>> {
    if let Some(t) = explicit {
        return Ok(Some(data::Tokenizer::open(t, None).context("--tokenizer")?));
    }
    Ok(config
        .and_then(|c| data::Tokenizer::open(&c.data.tokenizer, c.data.eod_token.as_deref()).ok()))
}
