//! What the commands that read a finished checkpoint share (`trainer export`, `eval`,
//! `generate`): the checkpoint a `--checkpoint` folder names, and the run that wrote it (its
//! `config.toml`, for the tokenizer, the validation data and the ZeRO settings).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use run::config::{Overrides, RunConfig};

/// The checkpoint `dir` names: itself if it is a `step_<N>` folder (it holds a manifest), else
/// the newest checkpoint in it.
pub fn resolve(dir: &Path) -> Result<PathBuf> {
    if dir.join("manifest.json").exists() {
        return Ok(dir.to_path_buf());
    }
    if !dir.is_dir() {
        anyhow::bail!("--checkpoint {}: no such folder", dir.display());
    }
    crate::newest(dir)?.with_context(|| {
        format!(
            "--checkpoint {}: holds no checkpoint (no step_<N> folder with a manifest.json)",
            dir.display()
        )
    })
}

/// `read` of the checkpoint `dir` names ([`resolve`]), and that checkpoint. A running job's
/// retention (`checkpoint.keep_last`) may prune the checkpoint between its choice and the end of
/// its read: where `dir` is a checkpoint folder the newest checkpoint is then taken again;
/// where it names the pruned checkpoint itself, the error says it was pruned.
pub fn read_newest<T>(
    dir: &Path,
    mut read: impl FnMut(&Path) -> Result<T>,
) -> Result<(PathBuf, T)> {
    // Each retry follows a checkpoint newer than the last: a few suffice.
    for _ in 0..5 {
        let ckpt = resolve(dir)?;
        match read(&ckpt) {
            Ok(value) => return Ok((ckpt, value)),
            Err(e) if ckpt.join("manifest.json").exists() => return Err(e),
            Err(_) if ckpt == dir => anyhow::bail!(
                "checkpoint {} was pruned while being read (the run's checkpoint.keep_last): name \
                 its checkpoint folder to take the newest",
                dir.display()
            ),
            Err(_) => continue,
        }
    }
    anyhow::bail!(
        "--checkpoint {}: each newest checkpoint was pruned while being read",
        dir.display()
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint folder as [`crate::newest`] sees it: `step_<N>` folders with a
    /// manifest.
    fn checkpoint(dir: &Path, step: u64) -> PathBuf {
        let path = crate::step_dir(dir, step);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("manifest.json"), "{}").unwrap();
        path
    }

    /// A running job's retention prunes the checkpoint being read (a newer one is committed,
    /// the older removed): from a checkpoint folder the read moves on to the newest; from the
    /// pruned checkpoint's own folder the error says it was pruned.
    #[test]
    fn a_checkpoint_pruned_while_being_read() {
        let dir = tempfile::tempdir().unwrap();
        let four = checkpoint(dir.path(), 4);
        let mut reads = Vec::new();
        let prune_once = |ckpt: &Path, reads: &mut Vec<PathBuf>| -> Result<u64> {
            reads.push(ckpt.to_path_buf());
            if reads.len() == 1 {
                checkpoint(dir.path(), 6);
                std::fs::remove_dir_all(ckpt).unwrap();
                anyhow::bail!("cannot read {}: No such file or directory", ckpt.display());
            }
            Ok(reads.len() as u64)
        };
        let (ckpt, value) = read_newest(dir.path(), |c| prune_once(c, &mut reads)).unwrap();
        assert_eq!(ckpt, crate::step_dir(dir.path(), 6));
        assert_eq!(value, 2);
        assert_eq!(reads, [four.clone(), ckpt.clone()]);

        let mut named = Vec::new();
        std::fs::remove_dir_all(&ckpt).unwrap();
        let eight = checkpoint(dir.path(), 8);
        let e = read_newest(&eight, |c| prune_once(c, &mut named)).unwrap_err();
        assert!(
            format!("{e:#}").contains("was pruned while being read"),
            "{e:#}"
        );

        // Any other failure is the read's own.
        let nine = checkpoint(dir.path(), 9);
        let e = read_newest(&nine, |_| -> Result<()> { anyhow::bail!("bad crc") }).unwrap_err();
        assert_eq!(format!("{e:#}"), "bad crc");
    }
}
