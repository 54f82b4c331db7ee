//! Checkpoints: `<dir>/step_<N>/` holds one safetensors file per rank (its fp32 master shard and
//! Adam moments, named `<unit>.<state>`) and `manifest.json` (step, tokens, world, model shape).
//!
//! A checkpoint is written into `step_<N>.tmp/` and renamed when complete, so a killed run never
//! leaves a half-written checkpoint under a final name. The data position is the step itself
//! (the sampler is stateless), and the model has no other random state.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};

pub const FORMAT_VERSION: u32 = 1;

/// The model shape as saved, to refuse a checkpoint of another model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub seq_len: usize,
    pub vocab_size: usize,
}

impl From<&model::GptConfig> for ModelShape {
    fn from(c: &model::GptConfig) -> Self {
        ModelShape {
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_head: c.n_head,
            seq_len: c.seq_len,
            vocab_size: c.vocab_size,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub step: u64,
    pub tokens: u64,
    pub world_size: usize,
    pub ranks_per_node: usize,
    pub model: ModelShape,
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

/// Starts checkpoint `step`: an empty temporary folder (an old one from a killed run is removed).
pub fn begin(dir: &Path, step: u64) -> Result<PathBuf> {
    let tmp = tmp_dir(dir, step);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot clear {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    Ok(tmp)
}

/// Writes one rank's state into the temporary folder of [`begin`].
pub fn write_rank(tmp: &Path, rank: usize, step: u64, state: &[zero::NamedShard]) -> Result<()> {
    let bytes: Vec<(String, Vec<u8>, usize)> = state
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                s.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                s.data.len(),
            )
        })
        .collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (name, data, len) in &bytes {
        views.push((name.clone(), TensorView::new(Dtype::F32, vec![*len], data)?));
    }
    let meta = HashMap::from([
        ("step".to_string(), step.to_string()),
        ("rank".to_string(), rank.to_string()),
    ]);
    let path = tmp.join(rank_file(rank));
    safetensors::serialize_to_file(views, Some(meta), &path)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Writes the manifest and renames the temporary folder to its final name.
pub fn commit(dir: &Path, tmp: &Path, manifest: &Manifest) -> Result<PathBuf> {
    let text = serde_json::to_string_pretty(manifest)?;
    std::fs::write(tmp.join("manifest.json"), text)?;
    let final_dir = step_dir(dir, manifest.step);
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir)?;
    }
    std::fs::rename(tmp, &final_dir)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), final_dir.display()))?;
    Ok(final_dir)
}

/// The newest complete checkpoint in `dir` (a `step_<N>` folder with a manifest), if any.
pub fn newest(dir: &Path) -> Result<Option<PathBuf>> {
    if !dir.exists() {
        return Ok(None);
    }
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let Some(step) = name
            .strip_prefix("step_")
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        if path.join("manifest.json").exists() && best.as_ref().is_none_or(|(b, _)| step > *b) {
            best = Some((step, path));
        }
    }
    Ok(best.map(|(_, p)| p))
}

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
    Ok(m)
}

/// One rank's saved tensors, fully read and checked.
pub struct RankState {
    pub tensors: HashMap<String, Vec<f32>>,
}

/// Reads rank `rank`'s file of checkpoint `ckpt`.
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

/// The manifest of a new checkpoint of a run with these trajectory `settings`, its shards
/// aligned to `partition_align` elements.
pub fn manifest(
    step: u64,
    tokens: u64,
    topology: comm::Topology,
    model: &model::GptConfig,
    partition_align: usize,
    settings: &BTreeMap<String, String>,
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
    }
}
