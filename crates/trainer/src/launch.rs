//! One rank per process (`dist.backend = "nccl"` or `"mpi"`): which rank this process is, its
//! device, and its communicator, from the launcher's environment (slurm, mpirun, torchrun) and
//! the config (docs/launch.md).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use comm::Communicator;

use crate::config::{Backend, RunConfig};

/// This process's rank: its communicator (shared, so a failing rank can abort the world while
/// the engine holds the other handle) and its device.
pub struct ProcessRank {
    pub comm: Arc<dyn Communicator>,
    pub device: candle_core::Device,
}

/// Joins the world the launcher started, as `config.dist.backend` says.
pub fn join(config: &RunConfig) -> Result<ProcessRank> {
    let dist = &config.dist;
    let timeout = Duration::from_secs(dist.timeout_s);
    let rank = match dist.backend {
        Backend::Local => unreachable!("the local backend runs ranks as threads"),
        Backend::Mpi => join_mpi(config, timeout)?,
        Backend::Nccl => join_nccl(config, timeout)?,
    };
    let world = rank.comm.topology().world();
    if world != dist.world_size {
        bail!(
            "dist.world_size = {} but the launcher started {world} processes",
            dist.world_size
        );
    }
    Ok(rank)
}

#[cfg(feature = "mpi")]
fn join_mpi(config: &RunConfig, timeout: Duration) -> Result<ProcessRank> {
    use crate::config::DeviceKind;
    use anyhow::Context;

    if config.train.device != DeviceKind::Cpu {
        bail!(
            "dist.backend = \"mpi\" is the CPU backend: use \"nccl\" with train.device = \"cuda\""
        );
    }
    let mpi = comm::MpiComm::init(config.dist.gpus_per_node).context("dist.backend = \"mpi\"")?;
    mpi.set_timeout(timeout);
    Ok(ProcessRank {
        comm: Arc::new(mpi),
        device: candle_core::Device::Cpu,
    })
}

#[cfg(not(feature = "mpi"))]
fn join_mpi(_: &RunConfig, _: Duration) -> Result<ProcessRank> {
    bail!("dist.backend = \"mpi\": this binary was built without MPI support (cargo build --release --features mpi)")
}

#[cfg(feature = "cuda")]
fn join_nccl(config: &RunConfig, timeout: Duration) -> Result<ProcessRank> {
    use crate::config::DeviceKind;
    use anyhow::Context;
    use candle_core::cuda_backend::CudaDevice;
    use comm::launch::{LaunchInfo, Launcher};

    if config.train.device != DeviceKind::Cuda {
        bail!("dist.backend = \"nccl\" needs train.device = \"cuda\"");
    }
    let mut info = LaunchInfo::from_env()?.unwrap_or(LaunchInfo {
        // A plain process: a world of one.
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: Some(1),
        nodes: Some(1),
        master_addr: None,
        master_port: None,
        launcher: Launcher::Torchrun,
    });
    info.check_world(Some(config.dist.world_size))?;
    if info.launcher == Launcher::Torchrun {
        // torchrun's own store listens on MASTER_PORT: the NCCL ids meet one port above.
        info.master_port = info.master_port.and_then(|p| p.checked_add(1));
    }
    let topology = info.topology(config.dist.gpus_per_node)?;
    // One GPU per rank: the local rank's, unless the launcher left each process only its own.
    let visible = candle_core::cuda_backend::cudarc::driver::CudaContext::device_count()
        .context("cannot count the GPUs")? as usize;
    let ordinal = if visible == 1 { 0 } else { info.local_rank };
    if ordinal >= visible {
        bail!(
            "local rank {} has no GPU: this node shows {visible} (CUDA_VISIBLE_DEVICES?)",
            info.local_rank
        );
    }
    let device = CudaDevice::new_with_stream(ordinal)
        .with_context(|| format!("cannot open GPU {ordinal}"))?;
    crate::device_memory::keep_freed_memory(&device);
    let nccl = comm::bootstrap::nccl_from_launch(&info, topology, &device, timeout)?;
    // The watchdog: a collective unfinished after the timeout aborts NCCL (a peer died or hung).
    nccl.set_timeout(timeout);
    if let Some(gbps) = config.dist.emulated_link_gbps {
        let link = comm::link::EmulatedLink::per_node(gbps, topology.ranks_per_node)?;
        if info.rank == 0 {
            eprintln!(
                "note: emulating a {gbps} Gb/s link between nodes ({:.3} GB/s a rank)",
                link.rank_bytes_per_s() / 1e9
            );
        }
        nccl.set_emulated_link(Some(link))
            .context("dist.emulated_link_gbps")?;
    }
    Ok(ProcessRank {
        comm: Arc::new(nccl),
        device: candle_core::Device::Cuda(device),
    })
}

#[cfg(not(feature = "cuda"))]
fn join_nccl(_: &RunConfig, _: Duration) -> Result<ProcessRank> {
    bail!("dist.backend = \"nccl\": this binary was built without CUDA support (cargo build --release --features cuda)")
}
