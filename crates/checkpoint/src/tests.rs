//! The checkpoint files' tests: checksums, the manifest's checks, ownership and retention.

use super::*;

fn model() -> model::ModelConfig {
    model::ModelConfig::gpt2(1, 8, 2, 4, 11)
}

/// The run id of the tests' checkpoints.
const RUN: &str = "test-run";

/// Checkpoint `step` of run `run_id` in a world of `ranks.len()` ranks, rank `r`'s state
/// `ranks[r]`, committed in `dir`.
fn save_ranks(dir: &Path, step: u64, ranks: &[&[f32]], run_id: &str) -> Result<PathBuf> {
    let tmp = begin(dir, step, run_id)?;
    let mut crcs = Vec::new();
    for (rank, values) in ranks.iter().enumerate() {
        let state = [zero::NamedShard {
            name: "wte.param".into(),
            data: values.to_vec(),
        }];
        crcs.push(write_rank(&tmp, rank, step, &state)?);
    }
    let topology = comm::Topology::new(ranks.len(), ranks.len())?;
    let m = manifest(
        step,
        0,
        topology,
        &model(),
        1,
        &Default::default(),
        &crcs,
        run_id,
    );
    commit(dir, &tmp, &m)
}

/// Checkpoint `step` of a one-rank world of run [`RUN`] whose state is `values`.
fn save_one(dir: &Path, step: u64, values: &[f32]) -> PathBuf {
    save_ranks(dir, step, &[values], RUN).unwrap()
}

/// Rewrites `ckpt`'s manifest.json through `edit`.
fn edit_manifest(ckpt: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = ckpt.join("manifest.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, json.to_string()).unwrap();
}

/// The error of `r`, as one line.
fn error<T>(r: Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn checksums_round_trip_and_catch_a_changed_byte() {
    let dir = tempfile::tempdir().unwrap();
    let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let ckpt = save_one(dir.path(), 4, &values);
    let m = read_manifest(&ckpt).unwrap();
    assert_eq!(m.checksums.len(), 1);
    assert_eq!(
        read_rank(&ckpt, &m, 0).unwrap().tensors["wte.param"],
        values
    );
    assert!(!tmp_dir(dir.path(), 4).exists());

    // One changed byte in the data: still a valid safetensors file, refused by its checksum.
    let file = ckpt.join(rank_file(0));
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let e = format!("{:#}", read_rank(&ckpt, &m, 0).err().unwrap());
    assert!(
        e.contains("rank_00000.safetensors is corrupt: checksum")
            && e.contains(&format!("!= {} recorded in the manifest", m.checksums[0])),
        "{e}"
    );

    // A manifest of an older version, without checksums nor run id, loads unchecked.
    edit_manifest(&ckpt, |json| {
        let json = json.as_object_mut().unwrap();
        json.remove("checksums");
        json.remove("run_id");
    });
    let old = read_manifest(&ckpt).unwrap();
    assert!(old.checksums.is_empty() && old.run_id.is_none());
    assert!(read_rank(&ckpt, &old, 0).is_ok());
}

#[test]
fn a_manifest_of_another_step_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = save_one(dir.path(), 10, &[1.0, 2.0]);
    edit_manifest(&ckpt, |json| json["step"] = 7.into());
    let e = error(read_manifest(&ckpt));
    assert!(
        e.contains("step_00000010/manifest.json says step 7, its folder is step 10")
            && e.ends_with("move the folder aside to resume from the checkpoint before it"),
        "{e}"
    );
    // Outside a `step_<N>` folder (a copy given to export) there is no folder step; the
    // rank file's own step still disagrees.
    let copy = dir.path().join("copy");
    std::fs::rename(&ckpt, &copy).unwrap();
    let m = read_manifest(&copy).unwrap();
    let e = error(read_rank(&copy, &m, 0));
    assert!(
        e.contains("rank_00000.safetensors is step 10's file of rank 0, the manifest reads it as step 7's of rank 0"),
        "{e}"
    );
}

#[test]
fn files_out_of_rank_order_or_swapped_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = save_ranks(dir.path(), 4, &[&[0.0; 3], &[1.0; 3]], RUN).unwrap();
    let good = read_manifest(&ckpt).unwrap();
    assert_eq!(
        read_rank(&ckpt, &good, 1).unwrap().tensors["wte.param"],
        [1.0; 3]
    );

    // The file list reordered with its checksums: each rank would load the other's shard.
    edit_manifest(&ckpt, |json| {
        json["files"].as_array_mut().unwrap().reverse();
        json["checksums"].as_array_mut().unwrap().reverse();
    });
    let e = error(read_manifest(&ckpt));
    assert!(
        e.contains(
            "lists rank_00001.safetensors as rank 0's file, which is rank_00000.safetensors"
        ),
        "{e}"
    );

    // The files themselves swapped, checksums too: the names are in order, the files'
    // own ranks are not.
    let (a, b) = (ckpt.join(rank_file(0)), ckpt.join(rank_file(1)));
    let swap = dir.path().join("swap");
    std::fs::rename(&a, &swap).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&swap, &b).unwrap();
    edit_manifest(&ckpt, |json| {
        json["files"].as_array_mut().unwrap().reverse();
    });
    let m = read_manifest(&ckpt).unwrap();
    let e = error(read_rank(&ckpt, &m, 0));
    assert!(
        e.contains("rank_00000.safetensors is step 4's file of rank 1, the manifest reads it as step 4's of rank 0"),
        "{e}"
    );

    // More files than ranks.
    edit_manifest(&ckpt, |json| json["world_size"] = 1.into());
    let e = error(read_manifest(&ckpt));
    assert!(e.contains("lists 2 files for 1 ranks"), "{e}");
}

#[test]
fn a_checkpoint_of_another_run_or_a_stray_folder_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    save_ranks(dir.path(), 4, &[&[1.0]], "other").unwrap();
    let e = error(save_ranks(dir.path(), 4, &[&[2.0]], RUN));
    assert!(
        e.contains(
            "step_00000004: the folder exists and is a checkpoint of another run (run id other)"
        ) && e.ends_with("move it aside, or choose another checkpoint.dir"),
        "{e}"
    );
    let kept = step_dir(dir.path(), 4);
    let m = read_manifest(&kept).unwrap();
    assert_eq!(m.run_id.as_deref(), Some("other"));
    assert_eq!(read_rank(&kept, &m, 0).unwrap().tensors["wte.param"], [1.0]);

    std::fs::create_dir(step_dir(dir.path(), 6)).unwrap();
    let e = error(save_ranks(dir.path(), 6, &[&[2.0]], RUN));
    assert!(e.contains("is not a checkpoint (no manifest.json)"), "{e}");

    // A run's own checkpoint of a step is replaced.
    save_one(dir.path(), 8, &[1.0]);
    let again = save_one(dir.path(), 8, &[3.0]);
    let m = read_manifest(&again).unwrap();
    assert_eq!(
        read_rank(&again, &m, 0).unwrap().tensors["wte.param"],
        [3.0]
    );
}

#[test]
fn retention_keeps_the_newest_and_the_milestones() {
    let steps = [2, 4, 6, 8, 10, 12];
    assert_eq!(to_delete(&steps, 12, 2, 4), [2, 6]);
    assert_eq!(to_delete(&steps, 12, 2, 0), [2, 4, 6, 8]);
    assert_eq!(to_delete(&steps, 12, 0, 0), [] as [u64; 0], "0 keeps all");
    assert_eq!(to_delete(&steps, 12, 10, 0), [] as [u64; 0]);
    assert_eq!(to_delete(&[12], 12, 1, 0), [] as [u64; 0]);
    // Never the one just written, nor one newer than it (another run's).
    assert_eq!(to_delete(&steps, 6, 1, 0), [2, 4]);
}

#[test]
fn prune_deletes_old_checkpoints_and_stale_tmp_folders() {
    let dir = tempfile::tempdir().unwrap();
    for step in [1, 2, 3] {
        save_one(dir.path(), step, &[step as f32]);
    }
    std::fs::create_dir(tmp_dir(dir.path(), 7)).unwrap();
    std::fs::create_dir(deleting_dir(dir.path(), 5)).unwrap();
    let pruned = prune(dir.path(), 3, 2, 0, RUN).unwrap();
    assert_eq!(
        pruned,
        Pruned {
            deleted: vec![1],
            left: vec![]
        }
    );
    let mut left: Vec<String> = entries(dir.path())
        .unwrap()
        .iter()
        .map(|p| name_of(p).to_string())
        .collect();
    left.sort();
    assert_eq!(left, ["step_00000002", "step_00000003"]);
    assert_eq!(newest(dir.path()).unwrap(), Some(step_dir(dir.path(), 3)));
}

/// Retention counts and deletes this run's complete checkpoints only: an empty `step_<N>`
/// folder newer than the run, another run's checkpoint and an older trainer's are left,
/// uncounted, and returned for the caller to report.
#[test]
fn retention_counts_this_runs_complete_checkpoints_only() {
    let dir = tempfile::tempdir().unwrap();
    save_ranks(dir.path(), 1, &[&[0.0]], "other").unwrap();
    let legacy = save_one(dir.path(), 2, &[0.0]);
    edit_manifest(&legacy, |json| {
        json.as_object_mut().unwrap().remove("run_id");
    });
    for step in [3, 4, 5] {
        save_one(dir.path(), step, &[step as f32]);
    }
    let stray = step_dir(dir.path(), 100);
    std::fs::create_dir(&stray).unwrap();
    let pruned = prune(dir.path(), 5, 2, 0, RUN).unwrap();
    assert_eq!(pruned.deleted, [3], "steps 4 and 5 are the newest two");
    let left: Vec<(&str, &str)> = pruned
        .left
        .iter()
        .map(|(p, why)| (name_of(p), why.as_str()))
        .collect();
    assert_eq!(
        left,
        [
            (
                "step_00000001",
                "a checkpoint of another run (run id other)"
            ),
            (
                "step_00000002",
                "a checkpoint of an older trainer, which named no run"
            ),
            ("step_00000100", "not a checkpoint (no manifest.json)"),
        ]
    );
    let mut names: Vec<String> = entries(dir.path())
        .unwrap()
        .iter()
        .map(|p| name_of(p).to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "step_00000001",
            "step_00000002",
            "step_00000004",
            "step_00000005",
            "step_00000100"
        ]
    );
}

/// Every write of the same state is the same bytes, its metadata keys in sorted order, whoever
/// writes it (the foreground and the background writer call [`write_rank`] alike): safetensors
/// alone writes them in the order of a `HashMap`, which differs from one write to the next.
#[test]
fn a_rank_file_is_the_same_bytes_at_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let state = [zero::NamedShard {
        name: "wte.param".into(),
        data: vec![1.0, 2.0, 3.0],
    }];
    let files: Vec<Vec<u8>> = (0..8)
        .map(|i| {
            let tmp = dir.path().join(format!("w{i}"));
            std::fs::create_dir_all(&tmp).unwrap();
            write_rank(&tmp, 3, 12, &state).unwrap();
            std::fs::read(tmp.join(rank_file(3))).unwrap()
        })
        .collect();
    assert!(files.iter().all(|f| f == &files[0]));
    let header = String::from_utf8_lossy(&files[0]);
    assert!(
        header.contains(r#""__metadata__":{"rank":"3","step":"12"}"#),
        "{header}"
    );
    assert_eq!(recorded_step_and_rank(&files[0]), Some((12, 3)));
}
