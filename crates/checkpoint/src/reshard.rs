//! Restoring a rank's shards from a checkpoint written under another partition: another world
//! size, or another padding (qwZ's and qgZ's blocks align the shards). Each unit's flat buffer
//! is the same whatever the partition, so a new shard is cut from the old shards that overlap
//! it ([`zero::reslice`]); each old rank file is read once, and only if this rank needs it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{bail, Result};
use zero::{Engine, Partition, SHARD_STATES};

use crate::Manifest;

/// This rank's shard of every state of `engine`'s units, from checkpoint `ckpt`, by state name.
pub fn load(
    ckpt: &Path,
    manifest: &Manifest,
    engine: &Engine,
) -> Result<HashMap<String, Vec<f32>>> {
    let rank = engine.comm().rank();
    let world = manifest.world_size;
    let align = match manifest.partition_align {
        Some(align) => align,
        // Written before re-slicing was supported: only the same world can read it, padded to its
        // quantisation blocks alone (as before `zero::MIN_ALIGN`).
        None if world == engine.comm().topology().world() => engine.plan().legacy_align(),
        None => bail!(
            "checkpoint {} was written by {world} ranks by a trainer that did not record its \
             partition: resume it on {world} ranks",
            ckpt.display()
        ),
    };
    // The pieces of old shards each of my shards is made of, grouped by the old rank holding them.
    let mut by_old_rank: BTreeMap<usize, Vec<(&str, usize, zero::Piece)>> = BTreeMap::new();
    let mut shards = HashMap::new();
    for (name, new) in engine.unit_partitions() {
        let old = Partition::new(new.numel, world, align);
        for piece in zero::reslice(&old, new, rank) {
            by_old_rank
                .entry(piece.old_rank)
                .or_default()
                .push((name, old.shard_len(), piece));
        }
        for state in SHARD_STATES {
            shards.insert(format!("{name}.{state}"), vec![0f32; new.shard_len()]);
        }
    }
    for (old_rank, pieces) in by_old_rank {
        let file = crate::read_rank(ckpt, manifest, old_rank)?;
        for (unit, old_len, piece) in pieces {
            for state in SHARD_STATES {
                let name = format!("{unit}.{state}");
                let Some(saved) = file.tensors.get(&name) else {
                    bail!(
                        "checkpoint {} rank {old_rank}: no tensor {name}",
                        ckpt.display()
                    );
                };
                if saved.len() != old_len {
                    bail!(
                        "checkpoint {} rank {old_rank}: tensor {name} has {} elements, its \
                         manifest's partition gives {old_len}",
                        ckpt.display(),
                        saved.len()
                    );
                }
                let shard = shards
                    .get_mut(&name)
                    .expect("inserted for every unit above");
                shard[piece.new.clone()].copy_from_slice(&saved[piece.old.clone()]);
            }
        }
    }
    // qgZ's error-feedback buffers are each rank's own, not shards: a checkpoint of this very
    // layout gives them back from this rank's file; on another world they start at zero.
    let topology = engine.comm().topology();
    if engine.plan().qgz.is_some_and(|q| q.error_feedback)
        && (world, manifest.ranks_per_node) == (topology.world(), topology.ranks_per_node)
        && align == engine.plan().align
    {
        let file = crate::read_rank(ckpt, manifest, rank)?;
        for (name, data) in file.tensors {
            if zero::QGZ_ERROR_STATES.iter().any(|s| name.ends_with(s)) {
                shards.insert(name, data);
            }
        }
    }
    Ok(shards)
}
