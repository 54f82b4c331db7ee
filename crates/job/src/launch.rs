//! One rank per process (`dist.backend = "nccl"` or `"mpi"`): which rank this process is, its
//! device, and its communicator, from the launcher's environment (slurm, mpirun, torchrun) and
//! the config (docs/launch.md). The config has passed `RunConfig::check_supported` (backend
//! against device and build).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use comm::{Communicator, FailureReport};

use run::config::{Backend, RunConfig};

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
    match dist.backend {
        Backend::Local => {
            bail!("dist.backend = \"local\" runs its ranks as threads, not processes")
        }
        Backend::Mpi => join_mpi(config, timeout),
        Backend::Nccl => join_nccl(config, timeout),
    }
}

/// What this process does with its backend's [`FailureReport`]s: prints each as one error line
/// and, for a process still blocked after its NCCL watchdog aborted, exits.
#[cfg_attr(not(any(feature = "mpi", feature = "cuda")), allow(dead_code))]
fn on_failure(report: &FailureReport) {
    eprintln!("error: {report}");
    if let FailureReport::StillBlocked { .. } = report {
        // `exit` runs the atexit handlers, the CUDA runtime's teardown among them, which may
        // block on the stuck device too: abort if it has not ended soon.
        let _ = std::thread::Builder::new().spawn(|| {
            std::thread::sleep(Duration::from_secs(10));
            std::process::abort();
        });
        std::process::exit(1);
    }
}

#[cfg(feature = "mpi")]
fn join_mpi(config: &RunConfig, timeout: Duration) -> Result<ProcessRank> {
    use anyhow::Context;
    use comm::launch::{LaunchError, Launcher};

    let mpi = comm::MpiComm::init(config.dist.gpus_per_node).context("dist.backend = \"mpi\"")?;
    mpi.set_timeout(timeout);
    mpi.set_failure_handler(Some(Arc::new(on_failure)));
    let world = mpi.topology().world();
    if world != config.dist.world_size {
        return Err(LaunchError::WorldSize {
            configured: config.dist.world_size,
            launcher: Launcher::OpenMpi,
            world,
        }
        .into());
    }
    Ok(ProcessRank {
        comm: Arc::new(mpi),
        device: candle_core::Device::Cpu,
    })
}

#[cfg(not(feature = "mpi"))]
fn join_mpi(_: &RunConfig, _: Duration) -> Result<ProcessRank> {
    Err(run::config::not_built_with("dist.backend = \"mpi\"", "mpi"))
}

#[cfg(feature = "cuda")]
fn join_nccl(config: &RunConfig, timeout: Duration) -> Result<ProcessRank> {
    use anyhow::Context;
    use candle_core::cuda_backend::CudaDevice;
    use comm::launch::{LaunchInfo, Launcher};

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
    run::device_memory::keep_freed_memory(&device);
    let nccl = comm::bootstrap::nccl_from_launch(&info, topology, &device, timeout)?;
    // The watchdog: a collective unfinished after the timeout aborts NCCL (a peer died or hung).
    nccl.set_timeout(timeout);
    nccl.set_failure_handler(Some(Arc::new(on_failure)));
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
    Err(run::config::not_built_with(
        "dist.backend = \"nccl\"",
        "cuda",
    ))
}
