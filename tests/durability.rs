//! What a run does when the disk fails it: retention of old checkpoints, a checkpoint changed on
//! disk, and a disk that fills up in the middle of a run (on a small tmpfs).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{
    assert_ok, curve, error_line, metrics_lines, run_with, small_corpus, small_model_run,
    step_names,
};

/// A small model (about 20 MB of checkpoint) over `world` ranks, its run folder `run_dir`.
fn small_run(run_dir: &Path, train: &Path, steps: u64, world: usize) -> Vec<String> {
    let mut sets = small_model_run(run_dir, train);
    sets.extend([
        "train.micro_batch=4".into(),
        "train.global_batch=8".into(),
        format!("dist.world_size={world}"),
        format!("dist.gpus_per_node={world}"),
        format!("train.steps={steps}"),
        // One schedule whatever `steps`, so a run may be resumed with more steps.
        "train.decay_steps=12".into(),
        "train.lr=1e-3".into(),
        "train.warmup_steps=5".into(),
        "log.eval_interval=4".into(),
        "log.eval_samples=8".into(),
        "checkpoint.resume=true".into(),
    ]);
    sets
}

#[test]
fn old_checkpoints_are_deleted_except_the_last_and_the_milestones() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    let run = dir.path().join("run");
    assert_ok(&run_with(
        &small_run(&run, &corpus, 12, 1),
        &[
            "checkpoint.interval=2",
            "checkpoint.keep_last=2",
            "checkpoint.keep_every=4",
        ],
    ));
    assert_eq!(
        step_names(&run.join("checkpoints")),
        [
            "step_00000004",
            "step_00000008",
            "step_00000010",
            "step_00000012"
        ]
    );
}

#[test]
fn a_changed_checkpoint_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 4);
    let run = dir.path().join("run");
    assert_ok(&run_with(&small_run(&run, &corpus, 4, 2), &[]));
    let file = run.join("checkpoints/step_00000004/rank_00001.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 400] {
        *b = !*b;
    }
    std::fs::write(&file, &bytes).unwrap();
    let before = std::fs::read(run.join("metrics.jsonl")).unwrap();

    let line = error_line(&run_with(&small_run(&run, &corpus, 6, 2), &[]));
    assert!(
        line.contains(&format!("{} is corrupt: checksum", file.display())),
        "{line}"
    );
    assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), before);
}

/// A tmpfs mounted for a test, unmounted when dropped (also when the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it) on `dir`; the error says why not.
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Set in the copy of the full-disk test that runs in a user namespace of its own.
const IN_NAMESPACE_ENV: &str = "ZEROPP_TEST_IN_NAMESPACE";

/// Runs the test `name` again as root of a user and mount namespace of its own (`unshare -rm`),
/// where it can mount a tmpfs; says so and returns if that is not possible here (a skip).
fn rerun_in_namespace(name: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .arg("-rm")
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(IN_NAMESPACE_ENV, "1")
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: cannot run unshare: {e}");
            return;
        }
    };
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !text.contains("test result:") {
        eprintln!("skipped: unshare -rm failed: {}", text.trim());
        return;
    }
    assert!(out.status.success(), "in the namespace: {text}");
    eprintln!("ran in a user namespace: {}", text.trim());
}

/// The total size of the files in `dir`.
fn size_of(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// A file of `bytes` zeros (written, so that a tmpfs holds them).
fn filler(path: &Path, bytes: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    f.sync_all().unwrap();
}

#[test]
fn a_full_disk_fails_the_run_cleanly_and_it_resumes_once_freed() {
    const NAME: &str = "a_full_disk_fails_the_run_cleanly_and_it_resumes_once_freed";
    const DISK: u64 = 100 << 20;
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 6);
    let checkpoints = ["checkpoint.interval=2"];

    let disk = dir.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let _mounted = match Tmpfs::mount(&disk, "100m") {
        Ok(m) => m,
        Err(why) if std::env::var_os(IN_NAMESPACE_ENV).is_none() => {
            eprintln!("cannot mount a tmpfs ({why}); trying in a user namespace");
            rerun_in_namespace(NAME);
            return;
        }
        Err(why) => {
            eprintln!("skipped: cannot mount a tmpfs, even in a user namespace: {why}");
            return;
        }
    };
    // The control: the same run on a disk with room, which also tells a checkpoint's size.
    let straight = dir.path().join("straight");
    assert_ok(&run_with(
        &small_run(&straight, &corpus, 8, 2),
        &checkpoints,
    ));
    let ckpt_bytes = size_of(&straight.join("checkpoints/step_00000008"));
    assert!(3 * ckpt_bytes < DISK, "{ckpt_bytes} bytes a checkpoint");

    // Room for two checkpoints and a half: the one at step 6 does not fit.
    let fill = disk.join("filler");
    filler(&fill, DISK - 2 * ckpt_bytes - ckpt_bytes / 2);
    let run = disk.join("run");
    let sets = small_run(&run, &corpus, 8, 2);

    let line = error_line(&run_with(&sets, &checkpoints));
    let enospc = "No space left on device";
    assert_eq!(line.matches(enospc).count(), 1, "{line}");
    let tmp = run.join("checkpoints/step_00000006.tmp");
    assert!(
        line.contains(&format!(
            "cannot write checkpoint {}/rank_0000",
            tmp.display()
        )),
        "{line}"
    );
    assert_eq!(
        step_names(&run.join("checkpoints")),
        ["step_00000002", "step_00000004"],
        "no .tmp is left"
    );
    metrics_lines(&run);

    std::fs::remove_file(&fill).unwrap();
    let out = run_with(&sets, &checkpoints);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("resumed from"));
    assert_eq!(curve(&run), curve(&straight));
}
