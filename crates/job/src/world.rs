//! The world a run's ranks form, for training and `trainer bench` alike. With `dist.backend =
//! "local"` every rank is a thread of this process (a world of one needs no communication:
//! [`comm::Solo`]); with `nccl` or `mpi` this process is one rank of the world that its launcher
//! (mpirun, slurm, torchrun) started ([`launch::join`]). And the device rule: which device each
//! rank computes on.

use std::time::Duration;

use anyhow::Result;

use crate::launch::{self, ProcessRank};
use run::config::{Backend, RunConfig};

/// This process's part of the world.
pub enum World {
    /// The `local` backend: every rank of `topology` is a thread of this process. `device` is
    /// the process's (a world of one computes on it).
    Local {
        topology: comm::Topology,
        device: candle_core::Device,
    },
    /// One rank of a launched world, on its own device.
    Launched(ProcessRank),
}

impl World {
    /// The world `config.dist` describes: the local ranks' topology and device, or this
    /// process's rank of the launched world.
    pub fn join(config: &RunConfig) -> Result<World> {
        if config.dist.backend != Backend::Local {
            return Ok(World::Launched(launch::join(config)?));
        }
        let world = config.dist.world_size;
        let topology = comm::Topology::new(world, config.dist.gpus_per_node.unwrap_or(world))?;
        Ok(World::Local {
            topology,
            device: config.device()?,
        })
    }

    pub fn topology(&self) -> comm::Topology {
        match self {
            World::Local { topology, .. } => *topology,
            World::Launched(rank) => rank.comm.topology(),
        }
    }

    /// This process's device: a world of one's, or the launched rank's. The local ranks of a
    /// larger world each compute on a device of their own ([`World::run`]).
    pub fn device(&self) -> &candle_core::Device {
        match self {
            World::Local { device, .. } => device,
            World::Launched(rank) => &rank.device,
        }
    }

    /// Whether this process holds rank 0.
    pub fn lead(&self) -> bool {
        match self {
            World::Local { .. } => true,
            World::Launched(rank) => rank.comm.rank() == 0,
        }
    }

    /// The ranks of this process: the whole world with the local backend, one when launched.
    pub fn ranks_here(&self) -> usize {
        match self {
            World::Local { topology, .. } => topology.world(),
            World::Launched(_) => 1,
        }
    }

    /// `e`, this process's failure before its ranks ran, after ending a launched world with it:
    /// peers blocked in a collective would wait for this rank until their timeout. (The local
    /// backend's ranks have not started.)
    pub fn abort(&self, e: anyhow::Error) -> anyhow::Error {
        if let World::Launched(rank) = self {
            rank.comm.abort(format!("{e:#}"));
        }
        e
    }

    /// Runs `rank_main` on each rank of this process with the rank's communicator and device,
    /// and returns the results in rank order (one, when launched). A local rank's collectives
    /// wait `dist.timeout_s` for their peers, as the launched backends' do; a launched rank
    /// that fails ends the world ([`World::abort`]).
    ///
    /// The device rule: a world of one and a launched rank compute on [`World::device`]; the
    /// local backend's ranks of a larger world open one each (on a GPU, a stream and candle
    /// device of their own, so that their kernels overlap; their collectives meet on the
    /// world's communication stream, comm's local backend).
    pub fn run<T, F>(self, config: &RunConfig, rank_main: F) -> Result<Vec<T>>
    where
        T: Send,
        F: Fn(Box<dyn comm::Communicator>, candle_core::Device) -> Result<T> + Sync,
    {
        match self {
            World::Local { topology, device } if topology.world() == 1 => {
                Ok(vec![rank_main(Box::new(comm::Solo), device)?])
            }
            World::Local { topology, .. } => {
                let timeout = Duration::from_secs(config.dist.timeout_s);
                let all = comm::run_local_with_timeout(topology, timeout, |c| {
                    config
                        .device()
                        .and_then(|device| rank_main(Box::new(c), device))
                        .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> {
                            format!("{e:#}").into()
                        })
                })?;
                Ok(all)
            }
            World::Launched(rank) => {
                let comm = rank.comm.clone();
                let result = rank_main(Box::new(rank.comm), rank.device);
                if let Err(e) = &result {
                    // Peers blocked in a collective would wait for this rank until their timeout.
                    comm.abort(format!("{e:#}"));
                }
                Ok(vec![result?])
            }
        }
    }
}
