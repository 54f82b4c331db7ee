//! `trainer bench`: whole training steps of a config on synthetic tokens (tokens/s, TFLOP/s,
//! MFU, peak device memory, time waiting on communication), and with `--kernels` the
//! quantisation kernels' bandwidth beside a device-to-device copy.
//!
//! The model, world, ZeRO++ settings, precision and device are the config's; the data is not
//! read: every micro-batch is seeded random tokens, which costs the same FLOPs.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use zero::Engine;

use crate::launch;
use crate::world::World;
use report::readable;
use run::config::{Backend, Precision, RunConfig};
use run::device_memory;
use run::engine_options;
use run::Run;

mod profile;
use crate::mfu::PEAK_TFLOPS;
use plan::calibration_file::PhaseTimes;
pub use profile::FamilyTime;

pub struct BenchArgs<'a> {
    pub config: Option<&'a std::path::Path>,
    pub set: &'a run::config::Overrides,
    pub steps: u64,
    pub warmup: u64,
    pub json: bool,
    pub profile: bool,
    pub kernels: bool,
    pub kernel_mib: Vec<usize>,
    pub collectives: bool,
}

/// What `trainer bench` measured, as printed with `--json`.
#[derive(Debug, Serialize)]
pub struct StepReport {
    pub model: String,
    pub params: usize,
    pub world: usize,
    pub nodes: usize,
    pub gpus: usize,
    pub device: String,
    pub precision: String,
    pub techniques: String,
    /// The backend (`local`, `nccl`, `mpi`).
    pub backend: String,
    /// How the ranks' bytes travel: `one device` (local), `emulated link` (of
    /// `emulated_link_gbps`), `nccl sockets` (NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1 in the
    /// environment), `nccl` (NCCL's own choice: NVLink between the GPUs of one host), `mpi`.
    pub network: String,
    /// `dist.emulated_link_gbps`, the emulated link between nodes a node's ranks share.
    pub emulated_link_gbps: Option<f64>,
    pub tokens_per_step: usize,
    pub steps: u64,
    /// Mean seconds per optimizer step over the timed steps (rank 0, device synchronised).
    pub step_seconds: f64,
    pub tokens_per_s: f64,
    /// 6 x params + 6 x layers x width x seq.
    pub flop_per_token: f64,
    pub tflops_per_gpu: f64,
    /// Share of [`PEAK_TFLOPS`] per GPU (GPU runs only).
    pub mfu: Option<f64>,
    /// Device memory pool high-water mark over the timed steps (GPU runs only).
    pub peak_memory_bytes: Option<u64>,
    /// Device memory in use by every process at the end (total - free; GPU runs only): the pool,
    /// cuBLAS's workspace, the loaded kernels.
    pub device_used_bytes: Option<u64>,
    /// Seconds per step rank 0's host spent blocked waiting for collectives: the exposed
    /// communication on the CPU and with the local backend.
    pub comm_wait_seconds: f64,
    /// Seconds per step rank 0's compute stream stood waiting for collectives and jobs, timed
    /// on the device with CUDA events: the exposed communication on a GPU, where waits do not
    /// block the host (`nccl`, and the `local` backend's jobs on its communication stream);
    /// `None` on the CPU.
    pub comm_device_wait_seconds: Option<f64>,
    /// Rank 0's communication jobs per step, by label (gathers forward and backward, gradient
    /// reductions): how long the communication side was busy with them and how much of that the
    /// compute waited for.
    pub jobs: Vec<JobReport>,
    pub comm_intra_bytes: u64,
    pub comm_inter_bytes: u64,
    /// World-mean training loss of the first and the last step (warm-up included), a check that
    /// the steps compute a sane loss: on uniform random tokens it stays near ln(vocab).
    pub loss_first: f64,
    pub loss_last: f64,
    /// With `--profile`: rank 0's GPU time per step by kernel family (exclusive of the families
    /// nested inside), from CUDA events around each family's launches.
    pub profile: Option<Vec<FamilyTime>>,
    /// With `--profile`: each unit's forward and backward and the loss head, timed whole.
    pub phases: Option<PhaseTimes>,
    /// With `--profile`: rank 0's GEMMs by shape, the slowest first.
    pub gemms: Option<Vec<profile::GemmTime>>,
}

/// One label's jobs per step (rank 0), from [`comm::JobClock`].
#[derive(Debug, Serialize)]
pub struct JobReport {
    pub label: &'static str,
    pub jobs: f64,
    /// Seconds the communication side (its stream on a GPU, its thread on the CPU) spent on them.
    pub busy_seconds: f64,
    /// Seconds the compute waited for them (the compute stream on a GPU, the host on the CPU).
    pub exposed_seconds: f64,
    /// 1 - exposed / busy: the share of their time hidden behind compute.
    pub hidden: f64,
}

pub fn run(args: &BenchArgs<'_>) -> Result<()> {
    if args.kernels {
        return kernels(args);
    }
    if args.collectives {
        let path = args
            .config
            .context("no --config given (trainer bench --collectives --config FILE)")?;
        return collectives(&RunConfig::load(path, args.set)?, &args.kernel_mib);
    }
    let path = args
        .config
        .context("no --config given (trainer bench --config FILE)")?;
    let config = RunConfig::load(path, args.set)?;
    config.check_supported()?;
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if args.profile && config.train.device != run::config::DeviceKind::Cuda {
        bail!("--profile times GPU kernels: it needs train.device = \"cuda\"");
    }
    let run = Run::resolve(config, None)?;
    let Some(report) = bench_steps(&run, args.warmup, args.steps, args.profile)? else {
        return Ok(());
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

/// Micro-batch `micro` of `step` for `rank`: seeded tokens below `vocab`, inputs and targets.
fn synthetic_batch(
    seed: u64,
    step: u64,
    rank: usize,
    micro: usize,
    tokens: usize,
    vocab: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut state = seed ^ (step << 40) ^ ((rank as u64) << 20) ^ micro as u64;
    let mut next = || {
        // splitmix64
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % vocab as u64) as u32
    };
    let seq: Vec<u32> = (0..tokens + 1).map(|_| next()).collect();
    (seq[..tokens].to_vec(), seq[1..].to_vec())
}

/// What one rank measured over the timed steps.
struct RankTimes {
    seconds: f64,
    waited: f64,
    device_waited: Option<f64>,
    /// Job times summed over the timed steps, by label.
    jobs: Vec<comm::JobTime>,
    bytes: comm::ByteCounters,
    peak: Option<u64>,
    used: Option<u64>,
    losses: Vec<f64>,
    /// Seconds by family summed over the timed steps (`--profile`, rank 0).
    families: Option<Vec<(kernels::profile::Family, f64)>>,
    /// Phase seconds summed over the timed micro-batches (`--profile`, rank 0).
    phases: profile::PhaseSums,
    /// GEMM seconds by shape summed over the timed steps (`--profile`, rank 0).
    gemms: profile::ShapeSums,
    /// Parameters in rank 0's optimizer shards.
    optimizer_params: usize,
}

/// Runs the steps; the report of rank 0 (`None` in the other processes of a launched world).
fn bench_steps(run: &Run, warmup: u64, steps: u64, profile: bool) -> Result<Option<StepReport>> {
    let (config, model_cfg) = (&run.config, &run.model);
    let t = &config.train;
    let world = config.dist.world_size;
    let ranks = World::join(config)?;
    let (topology, device) = (ranks.topology(), ranks.device().clone());
    data::Sampler::check_batch(t.global_batch, world, t.micro_batch)
        .context("train.global_batch")?;
    let kernels = crate::startup::check_kernels(config, model_cfg, &device)?;
    let mut options = engine_options(config, &device);
    options.total_steps = warmup + steps;
    let accumulation = config.accumulation();
    let micro_tokens = t.micro_batch * model_cfg.seq_len;

    let rank_main =
        |inner: Box<dyn comm::Communicator>, device: candle_core::Device| -> Result<RankTimes> {
            // This rank's steps run on this thread under the kernel plan.
            let _kernels = kernels.as_ref().map(model::KernelPlan::enforce);
            let mut options = options.clone();
            options.device = device.clone();
            let timed = comm::Timed::new(inner);
            let clock = timed.clock();
            let device_clock = comm::Communicator::device_wait_clock(&timed);
            let job_clock = comm::Communicator::job_clock(&timed);
            let on_gpu = device.is_cuda();
            let job_times = || -> Result<Vec<comm::JobTime>> {
                Ok(match &job_clock {
                    Some(c) => c.read()?,
                    None => Vec::new(),
                })
            };
            // The compute stream's waits: for plain collectives (nccl's clock) and for jobs.
            let device_seconds = || -> Result<Option<f64>> {
                let plain = match &device_clock {
                    Some(c) => Some(c.seconds()?),
                    None => None,
                };
                let jobs: f64 = job_times()?.iter().map(|t| t.exposed_s).sum();
                Ok(match (on_gpu, plain) {
                    (true, p) => Some(p.unwrap_or(0.0) + jobs),
                    (false, p) => p,
                })
            };
            let mut engine = Engine::new(model_cfg.clone(), options, Box::new(timed))
                .context("building the engine's shards")?;
            let rank = engine.comm().rank();
            let mut measured = RankTimes {
                seconds: 0.0,
                waited: 0.0,
                device_waited: (on_gpu || device_clock.is_some()).then_some(0.0),
                jobs: Vec::new(),
                bytes: comm::ByteCounters::default(),
                peak: None,
                used: None,
                losses: Vec::new(),
                families: None,
                phases: profile::PhaseSums::default(),
                gemms: profile::ShapeSums::default(),
                optimizer_params: engine.unit_partitions().map(|(_, p)| p.shard_len()).sum(),
            };
            let profiling = profile && rank == 0 && device.is_cuda();
            for step in 0..warmup + steps {
                let timed_step = step >= warmup;
                engine.comm().barrier(comm::Group::World).wait()?;
                device.synchronize()?;
                if step == warmup && rank == 0 {
                    device_memory::reset_peak(&device);
                }
                kernels::profile::enable(profiling && timed_step);
                let (jobs_before, device_waited) = (job_times()?, device_seconds()?);
                let (start, waited, bytes) =
                    (Instant::now(), clock.seconds(), engine.comm().counters());
                let mut loss = 0.0;
                for micro in 0..accumulation {
                    let (inputs, targets) = synthetic_batch(
                        t.seed,
                        step,
                        rank,
                        micro,
                        micro_tokens,
                        model_cfg.vocab_size,
                    );
                    loss += engine
                        .forward_backward(&inputs, &targets, 1.0 / accumulation as f32)
                        .with_context(|| {
                            format!(
                                "step {}, the forward and backward of micro-batch {}",
                                step + 1,
                                micro + 1
                            )
                        })?;
                }
                engine
                    .step(t.lr)
                    .with_context(|| format!("step {}, the optimizer", step + 1))?;
                let loss = engine.mean_over_world(loss / accumulation as f64)?;
                measured.losses.push(loss);
                device.synchronize()?;
                if timed_step {
                    measured.seconds += start.elapsed().as_secs_f64();
                    measured.waited += clock.seconds() - waited;
                    if let (Some(sum), Some(now), Some(then)) = (
                        measured.device_waited.as_mut(),
                        device_seconds()?,
                        device_waited,
                    ) {
                        *sum += now - then;
                    }
                    measured.bytes = measured.bytes + (engine.comm().counters() - bytes);
                    add_job_times(&mut measured.jobs, &job_times()?, &jobs_before);
                    if profiling {
                        let now = kernels::profile::take();
                        let sums = measured
                            .families
                            .get_or_insert_with(|| now.iter().map(|(f, _)| (*f, 0.0)).collect());
                        for ((_, sum), (_, t)) in sums.iter_mut().zip(&now) {
                            *sum += t;
                        }
                        measured.phases.add(&kernels::profile::take_phases());
                        measured.gemms.add(kernels::profile::take_shapes());
                    }
                }
            }
            measured.peak = device_memory::peak_bytes(&device);
            measured.used = device_memory::device_used_bytes(&device);
            Ok(measured)
        };
    let lead = ranks.lead();
    let times = ranks
        .run(config, rank_main)
        .map_err(|e| crate::out_of_memory::explain(e, run, topology, &device))?;
    if !lead {
        return Ok(None);
    }
    let times = times.into_iter().next().expect("rank 0 reports");

    let n = steps as f64;
    let tokens_per_step = t.global_batch * model_cfg.seq_len;
    let step_seconds = times.seconds / n;
    let tokens_per_s = tokens_per_step as f64 / step_seconds;
    let model = model::Model::new(model_cfg.clone())?;
    let flop_per_token = model.flops_per_token(model_cfg.seq_len);
    let on_gpu = device.is_cuda();
    // The local backend puts every rank on one device; nccl gives each its own.
    let gpus = match config.dist.backend {
        Backend::Nccl | Backend::Mpi => world,
        Backend::Local => 1,
    };
    let tflops_per_gpu = tokens_per_s * flop_per_token / gpus as f64 / 1e12;
    let plan = zero::ZeroPlan::resolve(&config.zero, topology, warmup + steps)?;
    let techniques = [
        ("qwZ", plan.qwz.is_some()),
        ("hpZ", plan.hpz),
        ("qgZ", plan.qgz.is_some()),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(name, _)| *name)
    .collect::<Vec<_>>()
    .join("+");
    let backend = format!("{:?}", config.dist.backend).to_lowercase();
    let env_on = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
    let network = match (config.dist.backend, config.dist.emulated_link_gbps) {
        (Backend::Local, _) => "one device",
        (Backend::Nccl, Some(_)) => "emulated link",
        (Backend::Nccl, None) if env_on("NCCL_P2P_DISABLE") && env_on("NCCL_SHM_DISABLE") => {
            "nccl sockets"
        }
        (Backend::Nccl, None) => "nccl",
        (Backend::Mpi, _) => "mpi",
    };
    Ok(Some(StepReport {
        backend,
        network: network.into(),
        emulated_link_gbps: config.dist.emulated_link_gbps,
        model: config
            .model
            .preset
            .clone()
            .unwrap_or_else(|| "custom".into()),
        params: model_cfg.num_params(),
        world,
        nodes: topology.nodes,
        gpus,
        device: if on_gpu { "cuda" } else { "cpu" }.into(),
        // FP8's blocks multiply in FP8 with the rest in the compute dtype: name the recipe.
        precision: match config.train.precision {
            Precision::Fp8 => "fp8".into(),
            _ => format!("{:?}", config.compute_dtype()).to_lowercase(),
        },
        techniques: if techniques.is_empty() {
            "ZeRO-3".into()
        } else {
            format!("ZeRO-3 + {techniques}")
        },
        tokens_per_step,
        steps,
        step_seconds,
        tokens_per_s,
        flop_per_token,
        tflops_per_gpu,
        mfu: on_gpu.then(|| tflops_per_gpu / PEAK_TFLOPS),
        peak_memory_bytes: times.peak,
        device_used_bytes: times.used,
        comm_wait_seconds: times.waited / n,
        comm_device_wait_seconds: times.device_waited.map(|w| w / n),
        jobs: times
            .jobs
            .iter()
            .map(|t| JobReport {
                label: t.label,
                jobs: t.jobs as f64 / n,
                busy_seconds: t.busy_s / n,
                exposed_seconds: t.exposed_s / n,
                hidden: t.hidden(),
            })
            .collect(),
        comm_intra_bytes: (times.bytes.intra as f64 / n) as u64,
        comm_inter_bytes: (times.bytes.inter as f64 / n) as u64,
        loss_first: times.losses.first().copied().unwrap_or(f64::NAN),
        loss_last: times.losses.last().copied().unwrap_or(f64::NAN),
        phases: times.families.as_ref().map(|fs| {
            times.phases.times(
                &model,
                micro_tokens,
                config.model.recompute,
                world,
                times.optimizer_params,
                fs,
                n,
                n * accumulation as f64,
            )
        }),
        gemms: times.families.is_some().then(|| times.gemms.rows(n)),
        profile: times.families.map(|fs| {
            fs.into_iter()
                .map(|(f, s)| FamilyTime {
                    family: f.name(),
                    seconds: s / n,
                })
                .collect()
        }),
    }))
}

/// `sum += now - then`, label by label (labels first seen are appended).
fn add_job_times(sum: &mut Vec<comm::JobTime>, now: &[comm::JobTime], then: &[comm::JobTime]) {
    for t in now {
        let before = then.iter().find(|b| b.label == t.label);
        let (jobs, busy, exposed) = match before {
            Some(b) => (
                t.jobs - b.jobs,
                t.busy_s - b.busy_s,
                t.exposed_s - b.exposed_s,
            ),
            None => (t.jobs, t.busy_s, t.exposed_s),
        };
        let entry = match sum.iter().position(|s| s.label == t.label) {
            Some(i) => &mut sum[i],
            None => {
                sum.push(comm::JobTime {
                    label: t.label,
                    ..Default::default()
                });
                sum.last_mut().expect("just pushed")
            }
        };
        entry.jobs += jobs;
        entry.busy_s += busy;
        entry.exposed_s += exposed;
    }
}

fn print_report(r: &StepReport) {
    println!(
        "{} ({} params) | world {} ({} nodes x {}) on {} {} | {} | {}",
        r.model,
        r.params,
        r.world,
        r.nodes,
        r.world / r.nodes,
        r.gpus,
        if r.device == "cuda" { "GPU" } else { "CPU" },
        r.precision,
        r.techniques
    );
    println!(
        "timed steps        {} of {} tokens",
        r.steps, r.tokens_per_step
    );
    println!(
        "loss               {:.4} (first step) -> {:.4} (last)",
        r.loss_first, r.loss_last
    );
    println!("step time          {:.3} s", r.step_seconds);
    println!("tokens/s           {:.0}", r.tokens_per_s);
    println!(
        "TFLOP/s per {}    {:.2} ({:.2} GFLOP per token)",
        if r.device == "cuda" { "GPU" } else { "CPU" },
        r.tflops_per_gpu,
        r.flop_per_token / 1e9
    );
    if let Some(mfu) = r.mfu {
        println!(
            "MFU                {:.2}% of {PEAK_TFLOPS} TFLOP/s bf16 dense",
            100.0 * mfu
        );
    }
    if let Some(peak) = r.peak_memory_bytes {
        println!(
            "peak GPU memory    {} (allocator high-water mark); {} in use on the device at the end",
            readable::bytes(peak),
            readable::bytes(r.device_used_bytes.unwrap_or(0))
        );
    }
    println!(
        "waiting on comm    {:.3} s per step ({:.1}%) with the host blocked",
        r.comm_wait_seconds,
        100.0 * r.comm_wait_seconds / r.step_seconds,
    );
    if let Some(w) = r.comm_device_wait_seconds {
        println!(
            "                   {:.3} s per step ({:.1}%) with the GPU's compute stream stalled",
            w,
            100.0 * w / r.step_seconds,
        );
    }
    if !r.jobs.is_empty() {
        println!(
            "communication jobs (rank 0, per step; busy on the {} side, exposed to compute):",
            if r.device == "cuda" {
                "stream's"
            } else {
                "thread's"
            }
        );
        for j in &r.jobs {
            println!(
                "  {:<20} {:>6.1} jobs {:>9.2} ms busy {:>9.2} ms exposed {:>6.1}% hidden",
                j.label,
                j.jobs,
                j.busy_seconds * 1e3,
                j.exposed_seconds * 1e3,
                100.0 * j.hidden
            );
        }
    }
    // The exposed communication: the device's stalls where the host does not wait (nccl).
    let exposed = r.comm_device_wait_seconds.unwrap_or(r.comm_wait_seconds);
    println!(
        "compute and rest   {:.3} s per step (the step less the exposed communication)",
        r.step_seconds - exposed
    );
    println!(
        "comm per step      intra-node {}, inter-node {} (rank 0)",
        readable::bytes(r.comm_intra_bytes),
        readable::bytes(r.comm_inter_bytes)
    );
    if let Some(families) = &r.profile {
        let gemms = r.gemms.as_deref().unwrap_or_default();
        profile::print(families, gemms, r.phases.as_ref(), r.step_seconds);
    }
}

/// `trainer bench --kernels`: each quantisation kernel's bandwidth against a device copy.
fn kernels(args: &BenchArgs<'_>) -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        let device = candle_core::Device::new_cuda(0).context("--kernels: cannot open GPU 0")?;
        let candle_core::Device::Cuda(dev) = &device else {
            unreachable!("new_cuda gives a CUDA device")
        };
        println!(
            "{:<36} {:>10} {:>12} {:>10} {:>9}",
            "kernel", "MiB", "time", "GB/s", "of copy"
        );
        for &mib in &args.kernel_mib {
            let rates = quant::bench::kernel_bandwidth(dev, mib << 20, 20)?;
            let copy = rates
                .iter()
                .find(|r| r.name == "copy")
                .map(|r| r.gb_per_s)
                .context("the kernel bench measures a copy")?;
            for r in &rates {
                println!(
                    "{:<36} {:>10} {:>9.3} ms {:>10.0} {:>8.1}%",
                    r.name,
                    mib,
                    r.seconds * 1e3,
                    r.gb_per_s,
                    100.0 * r.gb_per_s / copy
                );
            }
        }
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = &args.kernel_mib;
        bail!("--kernels needs the CUDA build (cargo build --release --features cuda)")
    }
}

/// `trainer bench --collectives`: the world's all-gather, reduce-scatter and all-to-all through
/// our communicator, on bf16 buffers of each size, as nccl-tests reports them: algorithm
/// bandwidth = bytes / time, bus bandwidth = algbw x (n - 1) / n, with bytes the gathered
/// output (all-gather), the input (reduce-scatter, f32) or the buffer sent (all-to-all).
fn collectives(config: &RunConfig, mib: &[usize]) -> Result<()> {
    use comm::{Communicator, Group};

    config.check_supported()?;
    let (comm, device): (Box<dyn Communicator>, candle_core::Device) = match config.dist.backend {
        Backend::Local => {
            bail!("--collectives measures a launched world: dist.backend = \"nccl\" or \"mpi\"")
        }
        _ => {
            let p = launch::join(config)?;
            (Box::new(p.comm), p.device)
        }
    };
    let n = comm.topology().world();
    let lead = comm.rank() == 0;
    if lead {
        println!(
            "{:<16} {:>10} {:>12} {:>12} {:>12}   ({} ranks, {})",
            "collective",
            "MiB",
            "time",
            "algbw GB/s",
            "busbw GB/s",
            n,
            if device.is_cuda() { "GPU" } else { "CPU" }
        );
    }
    let factor = (n as f64 - 1.0) / n as f64;
    for &size in mib {
        let bytes = size << 20;
        for op in ["all_gather", "reduce_scatter", "all_to_all"] {
            // Every op moves `bytes` in the nccl-tests sense.
            let (dtype, elems) = match op {
                "reduce_scatter" => (candle_core::DType::F32, bytes / 4),
                _ => (candle_core::DType::BF16, bytes / 2),
            };
            let send_elems = if op == "all_gather" { elems / n } else { elems };
            let send = candle_core::Tensor::zeros(send_elems - send_elems % n, dtype, &device)?;
            let run = |iters: usize| -> Result<f64> {
                comm.barrier(Group::World).wait()?;
                device.synchronize()?;
                let start = Instant::now();
                for _ in 0..iters {
                    let out = match op {
                        "all_gather" => comm.all_gather(Group::World, send.clone()),
                        "reduce_scatter" => comm.reduce_scatter(Group::World, send.clone()),
                        _ => comm.all_to_all(Group::World, send.clone()),
                    };
                    drop(out.wait()?);
                }
                device.synchronize()?;
                Ok(start.elapsed().as_secs_f64() / iters as f64)
            };
            run(2)?;
            let seconds = run(10)?;
            if lead {
                let algbw = bytes as f64 / seconds / 1e9;
                println!(
                    "{:<16} {:>10} {:>9.3} ms {:>12.1} {:>12.1}",
                    op,
                    size,
                    seconds * 1e3,
                    algbw,
                    algbw * factor
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_batches_are_seeded_shifted_and_in_range() {
        let (x, y) = synthetic_batch(7, 3, 1, 0, 64, 100);
        assert_eq!(x.len(), 64);
        assert_eq!(x[1..], y[..63]);
        assert!(x.iter().chain(&y).all(|&t| t < 100));
        assert_eq!(synthetic_batch(7, 3, 1, 0, 64, 100), (x.clone(), y));
        assert_ne!(synthetic_batch(7, 3, 2, 0, 64, 100).0, x);
    }
}
