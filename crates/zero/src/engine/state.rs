//! The engine's checkpoint state: each rank's shards of the master weights and Adam moments,
//! and what its gradient codecs keep (qgZ's error feedback), read out, checked finite on every
//! rank, and restored.

use candle_core::Tensor;
use comm::Group;

use super::{Engine, NamedShard, SHARD_STATES};
use crate::{Result, ZeroError};

impl Engine {
    /// My shards of the master weights and Adam moments, named `<unit>.<state>`, read back to
    /// the host; then what the gradient codecs keep of each unit (qgZ's error feedback), named
    /// `<unit>.<name>` by the codec ([`crate::codec::GradState::save`]): this rank's own, not
    /// shards of a partition.
    pub fn state(&self) -> Result<Vec<NamedShard>> {
        let mut out = Vec::new();
        self.state_into(&mut out)?;
        Ok(out)
    }

    /// [`Engine::state`] into `out`, reusing its buffers where `out` holds an earlier state of
    /// this engine (the same names and lengths; else it is rebuilt). A fresh buffer of several
    /// GB costs the kernel's page faults on first touch, many times the copy itself (4 GB:
    /// seconds against a quarter of one), so a trainer that checkpoints often keeps one.
    pub fn state_into(&self, out: &mut Vec<NamedShard>) -> Result<()> {
        let mut wanted: Vec<(String, &Tensor)> = Vec::with_capacity(3 * self.units.len());
        for u in &self.units {
            for (state, data) in
                SHARD_STATES
                    .into_iter()
                    .zip([&u.master, &u.exp_avg, &u.exp_avg_sq])
            {
                wanted.push((format!("{}.{state}", u.layout.name), data));
            }
        }
        // What the gradient codecs keep (qgZ's error feedback), under the names they give.
        for u in &self.units {
            for (state, data) in u.grad_state.save() {
                wanted.push((format!("{}.{state}", u.layout.name), data));
            }
        }
        let reusable = out.len() == wanted.len()
            && out
                .iter()
                .zip(&wanted)
                .all(|(o, (name, t))| o.name == *name && o.data.len() == t.elem_count());
        if !reusable {
            out.clear();
            for (name, t) in &wanted {
                out.push(NamedShard {
                    name: name.clone(),
                    data: t.to_vec1::<f32>()?,
                });
            }
            return Ok(());
        }
        for (o, (_, t)) in out.iter_mut().zip(&wanted) {
            copy_to_host(t, &mut o.data)?;
        }
        Ok(())
    }

    /// Restores the shards named as by [`Engine::state`] and the optimizer step count.
    /// `lookup` returns a saved tensor by name; every name must be present with my shard's length.
    pub fn restore(&mut self, step: u64, lookup: &dyn Fn(&str) -> Option<Vec<f32>>) -> Result<()> {
        let dev = self.opts.device.clone();
        for u in &mut self.units {
            let states = [&mut u.master, &mut u.exp_avg, &mut u.exp_avg_sq];
            for (state, data) in SHARD_STATES.into_iter().zip(states) {
                let name = format!("{}.{state}", u.layout.name);
                let saved =
                    lookup(&name).ok_or_else(|| ZeroError::MissingState { name: name.clone() })?;
                let n = data.elem_count();
                if saved.len() != n {
                    return Err(ZeroError::StateLength {
                        name,
                        what: "shard",
                        got: saved.len(),
                        expected: n,
                    });
                }
                *data = Tensor::from_vec(saved, n, &dev)?;
            }
            u.grad = None;
            // What the gradient codecs keep (qgZ's error feedback, the rank's own buffers), by
            // the names and lengths they give, where the checkpoint has them (it was written
            // with feedback on, by the same layout); otherwise the feedback starts at zero.
            u.grad_state.load(&u.layout.name, lookup, &dev)?;
        }
        self.step = step;
        // New weights: the secondary partitions of the old ones refuse to serve.
        self.weights += 1;
        self.non_finite_loss = false;
        Ok(())
    }

    /// Replaces the master weights with `units` (each unit's full, unpadded parameters, in unit
    /// order: a model read from elsewhere, `model.init_from`), keeping my shard of each. The
    /// moments stay as they are (zero before the first step).
    pub fn load_parameters(&mut self, units: &[Vec<f32>]) -> Result<()> {
        if units.len() != self.units.len() {
            return Err(ZeroError::Model(model::ModelError::UnitCount {
                expected: self.units.len(),
                got: units.len(),
            }));
        }
        let rank = self.comm.rank();
        let dev = self.opts.device.clone();
        for (u, full) in self.units.iter_mut().zip(units) {
            if full.len() != u.layout.numel {
                return Err(ZeroError::StateLength {
                    name: format!("{} parameters", u.layout.name),
                    what: "unit",
                    got: full.len(),
                    expected: u.layout.numel,
                });
            }
            let range = u.partition.shard_range(rank);
            let mut mine = vec![0f32; range.len()];
            let end = range.end.min(full.len());
            if range.start < end {
                mine[..end - range.start].copy_from_slice(&full[range.start..end]);
            }
            u.master = Tensor::from_vec(mine, range.len(), &dev)?;
            u.grad = None;
        }
        self.weights += 1;
        Ok(())
    }

    /// Checks that `state` (this rank's [`Engine::state`]) holds only finite values, and that
    /// every other rank's does, so that no rank writes a checkpoint that could not be resumed
    /// from: one all-gather of a float a rank. The error names the first non-finite tensor in
    /// state order (the lowest rank holding it) and the step, identically on every rank.
    pub fn check_finite_state(&self, state: &[NamedShard]) -> Result<()> {
        use rayon::prelude::*;
        // Several GB a rank: scanned on every core (80 GB of gpt6.7b take seconds on one).
        let first = state.iter().position(|s| {
            s.data
                .par_chunks(1 << 20)
                .any(|c| c.iter().any(|v| !v.is_finite()))
        });
        // 0: all finite; i + 1: tensor i first (exact in f32 for any state count we hold).
        let mine = first.map_or(0.0, |i| (i + 1) as f32);
        let one = Tensor::from_vec(vec![mine], 1, &self.opts.device)?;
        let all = self
            .comm
            .all_gather(Group::World, one)
            .wait()?
            .to_vec1::<f32>()?;
        let worst = all
            .iter()
            .enumerate()
            .filter(|(_, &v)| v > 0.0)
            .min_by_key(|&(rank, &v)| (v as usize, rank));
        match worst {
            None => Ok(()),
            Some((rank, &v)) => Err(ZeroError::NonFiniteState {
                name: state.get(v as usize - 1).map_or_else(
                    || format!("state tensor {}", v as usize - 1),
                    |s| s.name.clone(),
                ),
                rank,
                step: self.step,
            }),
        }
    }
}

/// Copies the 1-D f32 tensor `t` into `dst` (of its length) without allocating: on the GPU one
/// device-to-host copy, on the CPU a memcpy.
fn copy_to_host(t: &Tensor, dst: &mut [f32]) -> Result<()> {
    let t = t.contiguous()?;
    let (st, layout) = t.storage_and_layout();
    let (o, n) = (layout.start_offset(), t.elem_count());
    match &*st {
        candle_core::Storage::Cpu(cs) => {
            dst.copy_from_slice(&cs.as_slice::<f32>()?[o..o + n]);
            Ok(())
        }
        #[cfg(feature = "cuda")]
        candle_core::Storage::Cuda(cs) => {
            use candle_core::cuda_backend::WrapErr;
            let stream = cs.device.cuda_stream();
            let view = cs.as_cuda_slice::<f32>()?.slice(o..o + n);
            stream.memcpy_dtoh(&view, dst).w()?;
            stream.synchronize().w()?;
            Ok(())
        }
        #[allow(unreachable_patterns)]
        _ => {
            drop(st);
            dst.copy_from_slice(&t.to_vec1::<f32>()?);
            Ok(())
        }
    }
}
