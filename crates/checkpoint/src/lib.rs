//! Checkpoints: `<dir>/step_<N>/` holds one safetensors file per rank (its fp32 master shard and
//! Adam moments, named `<unit>.<state>`) and `manifest.json` (step, tokens, world, model shape,
//! and a CRC-32 of each rank file).
//!
//! A checkpoint is written into `step_<N>.tmp/` and renamed when complete, so a killed run never
//! leaves a half-written checkpoint under a final name. Every file is fsynced before the rename
//! and the parent folder after it, so a committed checkpoint survives a power loss too. The data
//! position is the step itself (the sampler is stateless), and the model has no other random
//! state.
//!
//! A checkpoint is checked, not trusted, when it is read: the manifest's step must be its
//! folder's, its files must be `rank_00000.safetensors`, `rank_00001.safetensors`, ... in rank
//! order, one a rank, and each rank file's own `step` and `rank` (safetensors metadata) must be
//! the manifest's step and the rank it is read for. A folder that fails one is refused in one
//! line naming it, before any rank restores anything.
//!
//! Each manifest names the run that wrote it ([`Manifest::run_id`]), so that a run deletes
//! (retention) and replaces (commit) only checkpoints of its own.
//!
//! Beside the format: the run lock that keeps two runs out of one folder ([`run_lock`]), the
//! resharding of a checkpoint to another world size ([`reshard`]), and the reading of one by
//! `eval`, `export` and `generate` ([`from_checkpoint`]). This crate reads a [`run`] config and
//! nothing else of the trainer.

pub mod from_checkpoint;
pub mod reshard;
pub mod run_lock;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use comm::HostCollectives;
use safetensors::tensor::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};

pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub step: u64,
    pub tokens: u64,
    pub world_size: usize,
    pub ranks_per_node: usize,
    /// The model's shape, as its family records it ([`model::ShapeRecord`]): a checkpoint of
    /// another model is refused, and `trainer export` rebuilds the model from it.
    pub model: model::ShapeRecord,
    /// One file per rank, in rank order.
    pub files: Vec<String>,
    /// Every shard is a whole number of this many elements: with `world_size`, how each unit's
    /// flat buffer was partitioned, so another partition can re-slice it (`None`: written
    /// before it was recorded).
    #[serde(default)]
    pub partition_align: Option<usize>,
    /// The settings that fix the trajectory (`resume::trajectory`), checked on resume (empty:
    /// written before they were recorded).
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The CRC-32 of each file (8 hex digits), in rank order, checked on load. Empty in the
    /// checkpoints of older versions, which load unchecked.
    #[serde(default)]
    pub checksums: Vec<String>,
    /// The run that wrote this checkpoint ([`new_run_id`]): made when a run starts from step 0
    /// and handed on by every resume, so all the checkpoints of one training run carry one id,
    /// whatever its launches, log folders or copies. [`prune`] deletes and [`commit`] replaces
    /// only checkpoints of the writing run's id: the lock on `checkpoint.dir` keeps a second run
    /// out, and this keeps a run from destroying a checkpoint it did not write even when one
    /// got into its folder another way (copied in by hand, an older trainer's). An id rather
    /// than a list of the steps written, because it survives resumes with no state beside the
    /// manifests. `None`: written before runs were named; such a checkpoint is never deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// A new run's id: the host, the process and the time in nanoseconds, unique without a random
/// number generator and readable in a manifest (`gpu-node-17-48213-187c4e2a9d1f3b00`).
pub fn new_run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{}-{nanos:x}",
        crate::run_lock::hostname(),
        std::process::id()
    )
}

pub fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step_{step:08}"))
}

/// Where checkpoint `step` is written before [`commit`] renames it.
pub fn tmp_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step_{step:08}.tmp"))
}

fn rank_file(rank: usize) -> String {
    format!("rank_{rank:05}.safetensors")
}

/// What a refused checkpoint's user does, the end of each refusal of [`read_manifest`] and
/// [`read_rank`].
const MOVE_ASIDE: &str = "move the folder aside to resume from the checkpoint before it";

/// Where a `step_<N>` folder is deleted from, renamed there first by [`prune`] so that one left
/// half-deleted is never taken for a checkpoint, nor for a stray folder.
fn deleting_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step_{step:08}.deleting"))
}

/// Whether `path` holds a complete checkpoint of run `run_id` (readable, checked manifest
/// carrying that id); otherwise why not, as [`prune`] reports it.
fn ownership(path: &Path, run_id: &str) -> std::result::Result<(), String> {
    if !path.join("manifest.json").exists() {
        return Err("not a checkpoint (no manifest.json)".into());
    }
    match read_manifest(path) {
        Ok(m) => match m.run_id {
            Some(id) if id == run_id => Ok(()),
            Some(id) => Err(format!("a checkpoint of another run (run id {id})")),
            None => Err("a checkpoint of an older trainer, which named no run".into()),
        },
        Err(e) => Err(format!("a checkpoint whose manifest is refused ({e:#})")),
    }
}

/// Fails unless checkpoint `step` of run `run_id` may take its final name: free, or held by a
/// checkpoint of the same run. Anything else there (another run's checkpoint, a stray folder)
/// is not this run's to replace.
fn check_replaceable(dir: &Path, step: u64, run_id: &str) -> Result<()> {
    let final_dir = step_dir(dir, step);
    if !final_dir.exists() {
        return Ok(());
    }
    if let Err(why) = ownership(&final_dir, run_id) {
        bail!(
            "cannot write checkpoint {}: the folder exists and is {why}; this run replaces only \
             its own checkpoints: move it aside, or choose another checkpoint.dir",
            final_dir.display()
        );
    }
    Ok(())
}

/// Starts checkpoint `step` of run `run_id`: an empty temporary folder (an old one from a killed
/// run is removed). Fails, writing nothing, if the final folder holds something this run may not
/// replace ([`commit`] checks again).
pub fn begin(dir: &Path, step: u64, run_id: &str) -> Result<PathBuf> {
    check_replaceable(dir, step, run_id)?;
    let tmp = tmp_dir(dir, step);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot clear {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    Ok(tmp)
}

/// One f32 shard as a safetensors tensor: its little-endian bytes are made while serialising,
/// one tensor at a time, so the file's bytes are the only whole copy of the state.
struct F32View<'a> {
    data: &'a [f32],
    shape: [usize; 1],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.data.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
    fn data_len(&self) -> usize {
        self.data.len() * 4
    }
}

/// The text of a CRC-32 in the manifest.
fn checksum_text(crc: u32) -> String {
    format!("{crc:08x}")
}

/// Writes one rank's state into the temporary folder of [`begin`], fsynced, and returns its
/// CRC-32. The checksum is computed over the bytes in memory, just before they are written
/// (crc32fast runs at several GB/s): no second read of a file of several GB. On failure the
/// partial file is removed, and the error names the file and says the cause once.
pub fn write_rank(tmp: &Path, rank: usize, step: u64, state: &[zero::NamedShard]) -> Result<u32> {
    let views = state.iter().map(|s| {
        let view = F32View {
            data: &s.data,
            shape: [s.data.len()],
        };
        (s.name.as_str(), view)
    });
    let meta = HashMap::from([
        ("step".to_string(), step.to_string()),
        ("rank".to_string(), rank.to_string()),
    ]);
    let path = tmp.join(rank_file(rank));
    let mut bytes = safetensors::serialize(views, Some(meta.clone()))
        .with_context(|| format!("cannot serialise checkpoint {}", path.display()))?;
    sort_metadata(&mut bytes, &meta);
    let crc = crc32fast::hash(&bytes);
    write_synced(&path, &bytes)
        .with_context(|| format!("cannot write checkpoint {}", path.display()))?;
    Ok(crc)
}

/// Rewrites the `__metadata__` object of the safetensors header in `bytes` with its keys
/// sorted. safetensors writes it from a `HashMap`, whose order differs from one map to the
/// next, so two writes of the same state (the foreground's and the background's) would differ
/// in those bytes. The keys and values are the same, so the header keeps its length.
fn sort_metadata(bytes: &mut [u8], meta: &HashMap<String, String>) {
    let sorted: BTreeMap<&String, &String> = meta.iter().collect();
    let Ok(sorted) = serde_json::to_string(&sorted) else {
        return;
    };
    let Some(header_len) = bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(|b| u64::from_le_bytes(b) as usize)
    else {
        return;
    };
    let Some(header) = bytes.get_mut(8..8 + header_len) else {
        return;
    };
    let key = b"\"__metadata__\":";
    let Some(start) = header.windows(key.len()).position(|w| w == key) else {
        return;
    };
    let start = start + key.len();
    // The object holds only strings of digits and key names: its first '}' closes it.
    if let Some(end) = header[start..].iter().position(|&b| b == b'}') {
        let object = &mut header[start..start + end + 1];
        if object.len() == sorted.len() {
            object.copy_from_slice(sorted.as_bytes());
        }
    }
}

/// Hands every rank's checksum of [`write_rank`] to every rank (an all-gather, which is also
/// the barrier after the writes): rank 0 records them in the manifest. A rank whose write failed
/// does not come here; it fails, and its peers' gather fails with it.
pub fn exchange_checksums(comm: &dyn comm::Communicator, crc: u32) -> Result<Vec<u32>> {
    let bytes = comm
        .all_gather_bytes(comm::Group::World, crc.to_le_bytes().to_vec())
        .wait()?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Creates `path` holding `bytes`, fsynced; on failure removes what was written, which on a
/// full disk frees the space for the checkpoints already there.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let written = File::create(path).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

/// Fsyncs a folder: its entries (files created or renamed in it) become durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync the folder {}", dir.display()))
}

/// Writes the manifest and renames the temporary folder to its final name. The manifest and the
/// folder are fsynced before the rename, the parent folder after it: once this returns, the
/// checkpoint is on disk in full, under its final name. A folder of that name is replaced only
/// if it is a checkpoint of the manifest's run; anything else there is refused, and the
/// temporary folder is left for the caller to abandon.
pub fn commit(dir: &Path, tmp: &Path, manifest: &Manifest) -> Result<PathBuf> {
    let run_id = manifest
        .run_id
        .as_deref()
        .context("a new checkpoint's manifest names its run")?;
    check_replaceable(dir, manifest.step, run_id)?;
    let text = serde_json::to_string_pretty(manifest)?;
    let path = tmp.join("manifest.json");
    write_synced(&path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    sync_dir(tmp)?;
    let final_dir = step_dir(dir, manifest.step);
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir)
            .with_context(|| format!("cannot replace {}", final_dir.display()))?;
    }
    std::fs::rename(tmp, &final_dir)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), final_dir.display()))?;
    sync_dir(dir)?;
    Ok(final_dir)
}

/// Removes the temporary folder of a checkpoint that failed, as far as it can: the run is
/// failing already with the error that matters, and [`begin`] or [`prune`] clears what is left.
pub fn abandon(tmp: &Path) {
    let _ = std::fs::remove_dir_all(tmp);
}

/// The checkpoints (by step) to delete once `just_written` has committed: those older than it,
/// except the newest `keep_last` of all (0: keep everything) and the milestones, multiples of
/// `keep_every` (0: none). `steps` are the run's complete checkpoints only ([`prune`]): a folder
/// that is not one must not take a place among the newest.
pub fn to_delete(steps: &[u64], just_written: u64, keep_last: usize, keep_every: u64) -> Vec<u64> {
    if keep_last == 0 {
        return Vec::new();
    }
    let mut newest_first = steps.to_vec();
    newest_first.sort_unstable_by(|a, b| b.cmp(a));
    newest_first.dedup();
    let mut out: Vec<u64> = newest_first
        .into_iter()
        .skip(keep_last)
        .filter(|&s| s < just_written && !(keep_every > 0 && s.is_multiple_of(keep_every)))
        .collect();
    out.sort_unstable();
    out
}

/// Every entry of `dir` (none if it does not exist).
fn entries(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let listed: std::io::Result<Vec<PathBuf>> =
        std::fs::read_dir(dir).and_then(|list| list.map(|e| e.map(|e| e.path())).collect());
    listed.with_context(|| format!("cannot list {}", dir.display()))
}

/// The folder name of `path`, or "" if it has none or it is not UTF-8.
fn name_of(path: &Path) -> &str {
    path.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
}

/// The `step_<N>` folders of `dir` (complete or not), by step; `.tmp` folders are not listed.
fn step_folders(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    Ok(entries(dir)?
        .into_iter()
        .filter_map(|path| {
            let step = name_of(&path).strip_prefix("step_")?.parse::<u64>().ok()?;
            Some((step, path))
        })
        .collect())
}

/// What [`prune`] did.
#[derive(Debug, Default, PartialEq)]
pub struct Pruned {
    /// The steps of the checkpoints deleted.
    pub deleted: Vec<u64>,
    /// The `step_<N>` folders left alone and not counted, each with why: not a checkpoint, or
    /// not one of this run's.
    pub left: Vec<(PathBuf, String)>,
}

/// Applies `[checkpoint]` retention to run `run_id`'s checkpoints once checkpoint
/// `just_written` has committed (see [`to_delete`]), and removes what failed writes and
/// deletions left behind (`step_<N>.tmp`, `step_<N>.deleting`); rank 0 calls it while no
/// checkpoint is being written. Only complete checkpoints of this run count and are deleted;
/// every other `step_<N>` folder is left as it is and returned in [`Pruned::left`], for the
/// caller to report. A checkpoint is renamed to `step_<N>.deleting` before it is deleted, so one
/// deleted halfway (a run killed in the middle) is never taken for complete.
pub fn prune(
    dir: &Path,
    just_written: u64,
    keep_last: usize,
    keep_every: u64,
    run_id: &str,
) -> Result<Pruned> {
    for path in entries(dir)? {
        let name = name_of(&path);
        if name.starts_with("step_") && (name.ends_with(".tmp") || name.ends_with(".deleting")) {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("cannot delete {}", path.display()))?;
        }
    }
    let mut ours = Vec::new();
    let mut left = Vec::new();
    for (step, path) in step_folders(dir)? {
        match ownership(&path, run_id) {
            Ok(()) => ours.push(step),
            Err(why) => left.push((path, why)),
        }
    }
    left.sort();
    let deleted = to_delete(&ours, just_written, keep_last, keep_every);
    for &step in &deleted {
        let (path, doomed) = (step_dir(dir, step), deleting_dir(dir, step));
        std::fs::rename(&path, &doomed)
            .and_then(|()| std::fs::remove_dir_all(&doomed))
            .with_context(|| format!("cannot delete old checkpoint {}", path.display()))?;
    }
    Ok(Pruned { deleted, left })
}

/// The newest complete checkpoint in `dir` (a `step_<N>` folder with a manifest), if any.
pub fn newest(dir: &Path) -> Result<Option<PathBuf>> {
    Ok(step_folders(dir)?
        .into_iter()
        .filter(|(_, path)| path.join("manifest.json").exists())
        .max_by_key(|(step, _)| *step)
        .map(|(_, path)| path))
}

/// Reads checkpoint `ckpt`'s manifest and checks it against the folder: the step in its name
/// (`step_<N>`; a folder named otherwise, e.g. one given to `trainer export`, has none to
/// compare), one file a rank, named in rank order. Refuses a disagreement in one line.
pub fn read_manifest(ckpt: &Path) -> Result<Manifest> {
    let path = ckpt.join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let m: Manifest = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a zeropp manifest", path.display()))?;
    if m.format != FORMAT_VERSION {
        bail!(
            "{}: format {} (this trainer reads {FORMAT_VERSION})",
            path.display(),
            m.format
        );
    }
    if !m.checksums.is_empty() && m.checksums.len() != m.files.len() {
        bail!(
            "{}: {} checksums for {} files",
            path.display(),
            m.checksums.len(),
            m.files.len()
        );
    }
    if let Some(folder_step) = name_of(ckpt)
        .strip_prefix("step_")
        .and_then(|n| n.parse::<u64>().ok())
    {
        if folder_step != m.step {
            bail!(
                "{} says step {}, its folder is step {folder_step}: the manifest is not this \
                 checkpoint's; {MOVE_ASIDE}",
                path.display(),
                m.step
            );
        }
    }
    if m.files.len() != m.world_size {
        bail!(
            "{} lists {} files for {} ranks; {MOVE_ASIDE}",
            path.display(),
            m.files.len(),
            m.world_size
        );
    }
    if let Some((rank, name)) = m
        .files
        .iter()
        .enumerate()
        .find(|(rank, name)| **name != rank_file(*rank))
    {
        bail!(
            "{} lists {name} as rank {rank}'s file, which is {}: the files are named in rank \
             order; {MOVE_ASIDE}",
            path.display(),
            rank_file(rank)
        );
    }
    Ok(m)
}

/// The `step` and `rank` a rank file records of itself ([`write_rank`]'s metadata).
fn recorded_step_and_rank(bytes: &[u8]) -> Option<(u64, usize)> {
    let (_, header) = SafeTensors::read_metadata(bytes).ok()?;
    let meta = header.metadata().as_ref()?;
    let step = meta.get("step")?.parse().ok()?;
    let rank = meta.get("rank")?.parse().ok()?;
    Some((step, rank))
}

/// One rank's saved tensors, fully read and checked.
pub struct RankState {
    pub tensors: HashMap<String, Vec<f32>>,
}

/// Reads rank `rank`'s file of checkpoint `ckpt`, checked against the manifest's checksum (when
/// it has one): a file changed on disk is refused, naming it. The step and rank the file
/// records must be the manifest's step and `rank`: a file of another checkpoint or another rank
/// (files swapped or copied in with their checksums) is refused too.
pub fn read_rank(ckpt: &Path, manifest: &Manifest, rank: usize) -> Result<RankState> {
    let name = manifest
        .files
        .get(rank)
        .with_context(|| format!("{}: no file for rank {rank}", ckpt.display()))?;
    let path = ckpt.join(name);
    let bytes = std::fs::read(&path)
        .with_context(|| format!("cannot read checkpoint {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| {
        anyhow::anyhow!("checkpoint {} is corrupt or truncated: {e}", path.display())
    })?;
    if let Some(recorded) = manifest.checksums.get(rank) {
        let actual = checksum_text(crc32fast::hash(&bytes));
        if actual != *recorded {
            bail!(
                "checkpoint {} is corrupt: checksum {actual} != {recorded} recorded in the manifest",
                path.display()
            );
        }
    }
    match recorded_step_and_rank(&bytes) {
        Some(own) if own == (manifest.step, rank) => {}
        Some((step, own_rank)) => bail!(
            "checkpoint {} is step {step}'s file of rank {own_rank}, the manifest reads it as \
             step {}'s of rank {rank}; {MOVE_ASIDE}",
            path.display(),
            manifest.step
        ),
        None => bail!(
            "checkpoint {} records no step and rank: not a file this trainer wrote; {MOVE_ASIDE}",
            path.display()
        ),
    }
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            bail!(
                "checkpoint {}: tensor {name} is {:?}, expected F32",
                path.display(),
                view.dtype()
            );
        }
        let data = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        tensors.insert(name, data);
    }
    Ok(RankState { tensors })
}

/// The manifest of a new checkpoint of run `run_id` with these trajectory `settings`, its
/// shards aligned to `partition_align` elements; `checksums` are [`write_rank`]'s, in rank
/// order.
#[allow(clippy::too_many_arguments)]
pub fn manifest(
    step: u64,
    tokens: u64,
    topology: comm::Topology,
    model: &model::ModelConfig,
    partition_align: usize,
    settings: &BTreeMap<String, String>,
    checksums: &[u32],
    run_id: &str,
) -> Manifest {
    Manifest {
        format: FORMAT_VERSION,
        step,
        tokens,
        world_size: topology.world(),
        ranks_per_node: topology.ranks_per_node,
        model: model.into(),
        files: (0..topology.world()).map(rank_file).collect(),
        partition_align: Some(partition_align),
        settings: settings.clone(),
        checksums: checksums.iter().copied().map(checksum_text).collect(),
        run_id: Some(run_id.to_string()),
    }
}

#[cfg(test)]
mod tests;
