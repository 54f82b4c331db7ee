//! The run's locks: rank 0 holds `<log.dir>/trainer.lock` and `<checkpoint.dir>/trainer.lock`
//! for the whole run, so a second launch into the same run directory, or into another one with
//! the same checkpoint folder, is refused before it reads or writes anything of the first's.
//!
//! The lock is an advisory `flock` on the file, which the kernel drops when its holder dies, so
//! a lock left by a killed run is simply taken over. The file's text names the holder (host,
//! pid, start time) for the refusal message; it is never deleted, because deleting a locked
//! file would let two processes lock two different files of one name.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

/// The lock file's name inside the locked folder.
pub const LOCK_FILE: &str = "trainer.lock";

/// A held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct RunLock {
    /// Held open: the lock lives as long as this handle.
    file: File,
    pub path: PathBuf,
    /// The holder named in the file when it was taken over from a process that had died.
    pub stale: Option<String>,
}

impl RunLock {
    /// Takes the lock of `dir` (created if missing), or fails naming the process holding it and
    /// `key`, the config key that chose the folder (`log.dir`, `checkpoint.dir`), as the one to
    /// change.
    pub fn acquire(dir: &Path, key: &str) -> Result<RunLock> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{key}: cannot create {}", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("{key}: cannot open the lock {}", path.display()))?;
        let mut previous = String::new();
        // The text is only for messages: an unreadable one is treated as empty.
        let _ = file.read_to_string(&mut previous);
        let previous = previous.trim().to_string();
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => bail!(
                "{} is in use by another run ({}): wait for it to end, or choose another {key}",
                dir.display(),
                if previous.is_empty() {
                    "holder unknown".to_string()
                } else {
                    previous
                }
            ),
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("{key}: cannot lock {}", path.display()))
            }
        }
        let holder = holder_text();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(holder.as_bytes()))
            .and_then(|()| file.flush())
            .with_context(|| format!("{key}: cannot write the lock {}", path.display()))?;
        Ok(RunLock {
            file,
            path,
            stale: (!previous.is_empty()).then_some(previous),
        })
    }
}

impl Drop for RunLock {
    /// Clears the holder's text before the lock goes, so that only a run that died leaves a
    /// name behind (reported as a stale lock by the next run).
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// `host H, pid P, since YYYY-MM-DD hh:mm:ss UTC`: who holds the lock.
fn holder_text() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "host {}, pid {}, since {}\n",
        hostname(),
        std::process::id(),
        utc(now)
    )
}

/// `seconds` after the Unix epoch as a UTC date and time (the civil-from-days algorithm of
/// H. Hinnant's date library).
fn utc(seconds: u64) -> String {
    let (days, rem) = ((seconds / 86_400) as i64, seconds % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// This machine's name, as the kernel has it (Linux); "unknown host" elsewhere.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown host".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_109_400), "2026-12-01 07:16:40 UTC");
    }

    #[test]
    fn a_second_holder_is_refused_and_a_released_lock_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let first = RunLock::acquire(&run, "log.dir").unwrap();
        assert_eq!(first.stale, None);
        let e = RunLock::acquire(&run, "checkpoint.dir")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("in use by another run")
                && e.contains(&format!("pid {}", std::process::id()))
                && e.ends_with("or choose another checkpoint.dir"),
            "{e}"
        );
        drop(first);
        let second = RunLock::acquire(&run, "log.dir").unwrap();
        assert_eq!(
            second.stale, None,
            "a lock released in order leaves no name"
        );
        drop(second);
        // A holder that died leaves its text and no lock: the next run takes over and says so.
        let dead = "host elsewhere, pid 4242, since unix time 1";
        std::fs::write(run.join(LOCK_FILE), dead).unwrap();
        let third = RunLock::acquire(&run, "log.dir").unwrap();
        assert_eq!(third.stale.as_deref(), Some(dead));
    }
}
