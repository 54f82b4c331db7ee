//! `trainer plan`: memory and communication per rank for a run config at a given world size,
//! from the layouts and arithmetic alone (nothing of the model is allocated).
//!
//! docs/plan.md explains every number and the JSON keys; docs/design.md section 3 the two
//! accountings of communication (logical bytes per rank, and the paper's M-based one).

use std::path::Path;

use anyhow::{bail, Context, Result};
use comm::{ByteCounters, Topology};
use model::{Pass, Recompute};
use zero::volume::{logical_step_bytes, paper_volume};
use zero::{ZeroConfig, ZeroPlan};

use run::config::{Overrides, Precision, RunConfig};
use run::Run;

pub mod advise;
pub mod calibrate;
pub mod calibration_file;
mod cluster;
mod fields;
mod gpus;
mod human;
mod overlap;
pub mod sweep;
pub mod throughput;
pub use fields::*;
pub use human::human;

use sweep::SweepArgs;
use throughput::{Cluster, Network, Workload};

/// The command line of `trainer plan`.
pub struct PlanArgs<'a> {
    pub config: Option<&'a Path>,
    pub set: &'a Overrides,
    pub world_size: Option<usize>,
    pub gpus_per_node: Option<usize>,
    pub json: bool,
    /// `--throughput` and its options; `None` without it (nor `--sweep`, `--advise`).
    pub throughput: Option<ThroughputArgs>,
    /// `--sweep` and its `--output`.
    pub sweep: Option<SweepArgs>,
    /// `--advise`.
    pub advise: bool,
}

/// The options of `--throughput` as given (`None`: the default, docs/plan.md).
#[derive(Clone, Debug, Default)]
pub struct ThroughputArgs {
    pub gpu: Option<String>,
    pub mfu_fraction: Option<f64>,
    pub intra_gbps: Option<f64>,
    pub inter_gbps: Option<f64>,
    pub latency_us: Option<f64>,
    /// `--calibrate FILE`: the `--json` of `trainer bench --profile` at W = 1.
    pub calibrate: Option<std::path::PathBuf>,
    /// `--shared-gpu`: every rank on one GPU, as the local backend runs a world on one device.
    pub shared_gpu: bool,
    /// `--no-overlap`: every communication job after the compute.
    pub no_overlap: bool,
}

/// Runs `trainer plan`: prints the report as a table or, with `--json`, one JSON object; with
/// `--sweep`, draws its figure.
pub fn run(args: &PlanArgs) -> Result<()> {
    let report = build(args)?;
    if let (Some(s), Some(t)) = (&report.sweep, &report.throughput) {
        let title = format!(
            "{}, {} tokens a GPU step: predicted tokens/s per GPU, {} x {} GPUs ({}, MFU {})",
            report.model.preset.as_deref().unwrap_or("custom"),
            t.tokens_per_gpu_step,
            report.topology.nodes,
            report.topology.gpus_per_node,
            t.gpu.name,
            t.mfu_fraction
        );
        sweep::draw(s, &title)?;
        eprintln!("wrote {}", s.output.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", human(&report));
    }
    Ok(())
}

fn param_bytes(p: Precision) -> usize {
    match p {
        Precision::Fp32 => 4,
        // FP8 keeps and gathers its weights in bf16 (FP8 qwZ's codes are counted by its codec).
        Precision::Bf16 | Precision::Fp16 | Precision::Fp8 => 2,
    }
}

/// The report for `args`, section by section as [`human`] prints them.
pub fn build(args: &PlanArgs) -> Result<Report> {
    let path = args
        .config
        .context("no --config given (trainer plan --config FILE)")?;
    let mut config = RunConfig::load(path, args.set)?;
    let mut notes = Vec::new();
    let topology = fit_topology(&mut config, args, &mut notes)?;
    let (accumulation, global_batch) = fit_batch(&config, topology.world(), &mut notes)?;

    let run = Run::resolve(config, None)?;
    let (config, cfg) = (&run.config, &run.model);
    let t = &config.train;
    let layout = model::ModelLayout::new(cfg);
    let plan =
        ZeroPlan::resolve(&config.zero, topology, t.steps)?.with_linears(config.linears(), &layout);
    notes.extend(reduce_dtype_note(&plan, t.steps));
    let numels: Vec<usize> = layout.units.iter().map(|u| u.numel).collect();
    let order = model::Model::new(cfg.clone())?
        .with_backward_params(plan.backward_params())
        .gather_order(Pass::Train);
    let pb = param_bytes(t.precision);
    let (mut throughput, mut sweep, mut advice) = (None, None, None);
    if let Some(a) = &args.throughput {
        let model = model::Model::new(cfg.clone())?.with_linears(config.linears());
        let calibration = match &a.calibrate {
            Some(path) => Some(calibrate::load(
                path,
                &model,
                t.micro_batch * cfg.seq_len,
                config.model.recompute,
            )?),
            None => None,
        };
        let work = Workload {
            model: &model,
            micro_batch: t.micro_batch,
            accumulation,
            param_bytes: pb,
            recompute: config.model.recompute,
            calibration: calibration.as_ref(),
        };
        let cluster = cluster(a, topology, calibration.as_ref())?;
        if model.linears() == model::LinearFormat::Fp8 && cluster.gpu.fp8_peak_tflops.is_none() {
            bail!(
                "train.precision = \"fp8\" needs FP8 tensor cores: --gpu {} has none \
                 (h100 and h200 have them)",
                cluster.gpu.name
            );
        }
        if let Some(k) = &calibration {
            notes.extend(k.notes.iter().cloned());
        }
        let z = &config.zero;
        let mut report = throughput::throughput(&work, z, t.steps, &cluster)?;
        report.calibrated_from = a.calibrate.as_ref().map(|p| p.display().to_string());
        throughput = Some(report);
        if let Some(s) = &args.sweep {
            sweep = Some(sweep::sweep(s, &work, z, t.steps, &cluster)?);
        }
        if args.advise {
            let activations = memory(config, cfg, &plan, &numels, pb, accumulation).activations;
            let per_rank = |p: &ZeroPlan| {
                zero::rank_memory(p, &numels, pb, accumulation).total() + activations
            };
            advice = Some(advise::advise(&work, z, t.steps, &cluster, per_rank)?);
        }
    }
    Ok(Report {
        model: model_info(config, cfg, &plan, &numels),
        topology: TopologyInfo {
            world_size: topology.world(),
            gpus_per_node: topology.ranks_per_node,
            nodes: topology.nodes,
        },
        train: TrainInfo {
            precision: t.precision,
            param_bytes: pb,
            micro_batch: t.micro_batch,
            accumulation,
            global_batch,
            steps: t.steps,
            recompute: config.model.recompute,
        },
        zero: zero_info(config, &plan),
        memory: memory(config, cfg, &plan, &numels, pb, accumulation),
        comm: comm_per_step(config, &plan, &numels, &order, pb, accumulation)?,
        paper: paper(&plan, cfg.num_params()),
        throughput,
        sweep,
        advice,
        notes,
    })
}

/// The cluster of `--throughput`: the GPU preset and the links, each option checked.
fn cluster(
    a: &ThroughputArgs,
    topology: Topology,
    calibration: Option<&calibrate::Calibration>,
) -> Result<Cluster> {
    let name = a.gpu.as_deref().unwrap_or(throughput::DEFAULT_GPU);
    let mut gpu = throughput::gpu(name).with_context(|| {
        let names: Vec<&str> = throughput::GPUS.iter().map(|g| g.name).collect();
        format!("unknown --gpu {name} (one of {})", names.join(", "))
    })?;
    if let Some(k) = calibration {
        gpu.mem_bw_gbs = k.mem_bw_gbs;
    }
    // On one shared GPU a collective is a device copy: each byte read and written once.
    let link_default = |nvlink: f64| match a.shared_gpu {
        true => gpu.mem_bw_gbs * 8.0 / 2.0,
        false => nvlink,
    };
    let positive = |flag: &str, v: Option<f64>, default: f64| -> Result<f64> {
        let v = v.unwrap_or(default);
        if !(v.is_finite() && v > 0.0) {
            bail!("--{flag} {v} is not a positive number");
        }
        Ok(v)
    };
    let mfu_fraction = positive(
        "mfu-fraction",
        a.mfu_fraction,
        throughput::DEFAULT_MFU_FRACTION,
    )?;
    if mfu_fraction > 1.0 {
        bail!("--mfu-fraction {mfu_fraction} is above 1 (a share of the GPU's peak)");
    }
    let network = Network {
        intra_gbps: positive("intra-gbps", a.intra_gbps, link_default(gpu.nvlink_gbps))?,
        inter_gbps: positive(
            "inter-gbps",
            a.inter_gbps,
            link_default(throughput::DEFAULT_INTER_GBPS),
        )?,
        latency_us: match a.latency_us {
            Some(v) if !(v.is_finite() && v >= 0.0) => {
                bail!("--latency-us {v} is not a number of at least 0")
            }
            v => v.unwrap_or(throughput::DEFAULT_LATENCY_US),
        },
    };
    Ok(Cluster {
        gpu,
        mfu_fraction,
        network,
        topology,
        ranks_per_gpu: if a.shared_gpu { topology.world() } else { 1 },
        overlap: !a.no_overlap,
    })
}

/// The planned topology: the command line over `[dist]`, written back into `config`. hpZ's
/// group is a node: a config that set it to its own node size follows the planned node (a
/// note says so) unless `--set` names it.
fn fit_topology(
    config: &mut RunConfig,
    args: &PlanArgs,
    notes: &mut Vec<String>,
) -> Result<Topology> {
    let file_world = config.dist.world_size;
    let file_d = config.dist.gpus_per_node.unwrap_or(file_world);
    let w = args.world_size.unwrap_or(file_world);
    let d = match (args.gpus_per_node, config.dist.gpus_per_node) {
        (Some(d), _) => d,
        (None, Some(d)) => d,
        (None, None) => w,
    };
    if w == 0 || d == 0 || !w.is_multiple_of(d) {
        let ws = match args.world_size {
            Some(_) => format!("--world-size {w}"),
            None => format!("dist.world_size = {w}"),
        };
        let ds = match args.gpus_per_node {
            Some(_) => format!("--gpus-per-node {d}"),
            None => format!("dist.gpus_per_node = {d}"),
        };
        bail!("{ws} is not a positive multiple of {ds}");
    }
    let topology = Topology::new(w, d)?;
    config.dist.world_size = w;
    config.dist.gpus_per_node = Some(d);

    let h = config.zero.hpz_partition_size;
    if h != 1 && h == file_d && h != d && !args.set.sets("zero.hpz_partition_size") {
        notes.push(format!(
            "zero.hpz_partition_size = {h} (the config's gpus per node) follows the node: {d}"
        ));
        config.zero.hpz_partition_size = d;
    }
    Ok(topology)
}

/// Micro-batches per step at `world` ranks, at least one (a note says when the global batch
/// had to change), and the global batch they make.
fn fit_batch(config: &RunConfig, world: usize, notes: &mut Vec<String>) -> Result<(usize, usize)> {
    let t = &config.train;
    let per_pass = t.micro_batch.checked_mul(world).with_context(|| {
        format!(
            "a world of {world} ranks x train.micro_batch = {} sequences does not fit in 64 bits",
            t.micro_batch
        )
    })?;
    let mut accumulation = t.global_batch / per_pass;
    if accumulation == 0 || !t.global_batch.is_multiple_of(per_pass) {
        accumulation = accumulation.max(1);
        notes.push(format!(
            "train.global_batch = {} is not a multiple of micro_batch x world = {} x {world}: \
             planned with {accumulation} micro-batch(es) a step (global batch {})",
            t.global_batch,
            t.micro_batch,
            per_pass * accumulation
        ));
    }
    let global_batch = per_pass
        .checked_mul(accumulation)
        .context("the planned global batch does not fit in 64 bits")?;
    Ok((accumulation, global_batch))
}

/// The `model` section: the shape and its sizes.
fn model_info(
    config: &RunConfig,
    cfg: &model::ModelConfig,
    plan: &ZeroPlan,
    numels: &[usize],
) -> ModelInfo {
    let num_params = cfg.num_params() as u64;
    ModelInfo {
        preset: config.model.preset.clone(),
        arch: cfg.arch.name(),
        n_layer: cfg.n_layer,
        n_embd: cfg.n_embd,
        n_head: cfg.n_head,
        n_kv_head: cfg.n_kv_head,
        ffn_hidden: cfg.ffn_hidden,
        tie_embeddings: cfg.tie_embeddings,
        seq_len: cfg.seq_len,
        vocab_size: cfg.vocab_size,
        num_params,
        padded_params: numels
            .iter()
            .map(|&n| plan.partition(n).padded as u64)
            .sum(),
        units: numels.len(),
        model_bytes: 2 * num_params,
    }
}

/// The `zero` section: the resolved techniques.
fn zero_info(config: &RunConfig, plan: &ZeroPlan) -> ZeroInfo {
    let labels = plan
        .grad_reductions()
        .into_iter()
        .map(|r| r.codec().label());
    ZeroInfo {
        qwz: plan.qwz.is_some(),
        weight_quant_block: plan.qwz.map(|q| q.block),
        hpz: plan.hpz,
        hpz_partition_size: config.zero.hpz_partition_size,
        qgz: plan.qgz.is_some(),
        grad_quant_block: plan.qgz.map(|q| q.block),
        qgz_until_step: plan.qgz.map(|q| q.until_step),
        qgz_error_feedback: plan.qgz.is_some_and(|q| q.error_feedback),
        prefetch_depth: plan.prefetch_depth,
        reduce_dtype: plan.reduce_dtype.name(),
        align: plan.align,
        weight_codec: plan.step_plan(1, Pass::Train).gather.codec().label(),
        grad_codecs: labels.collect(),
    }
}

/// Where `zero.reduce_dtype = "bf16"` applies to fewer steps than all, a note: to none when qgZ
/// reduces every step or one rank reduces nothing, to the steps after qgZ's window otherwise.
fn reduce_dtype_note(plan: &ZeroPlan, steps: u64) -> Option<String> {
    if plan.reduce_dtype == zero::ReduceDtype::Fp32 {
        return None;
    }
    let key = format!("zero.reduce_dtype = \"{}\"", plan.reduce_dtype.name());
    if plan.topology.world() == 1 {
        return Some(format!(
            "{key} applies to nothing: one rank reduces no gradient"
        ));
    }
    match (plan.qgz, plan.reduce_scatter_from(steps)) {
        (Some(_), None) => Some(format!(
            "{key} applies to no step of this config: qgZ replaces the reduce-scatter on every \
             step (1..={steps}); the predicted variants without qgZ reduce in it"
        )),
        (Some(_), Some(from)) => Some(format!(
            "{key} applies to steps {from}..={steps}, after qgZ's window (the comm section's after_qgz)"
        )),
        (None, _) => None,
    }
}

/// The memory one rank of `run` holds at `topology`, as the report's `memory` section
/// counts it: what a run compares with the memory at hand before it starts
/// (`job::startup::check_memory`).
pub fn rank_memory(run: &Run, topology: Topology) -> Result<Memory> {
    let (config, cfg) = (&run.config, &run.model);
    let layout = model::ModelLayout::new(cfg);
    let plan = ZeroPlan::resolve(&config.zero, topology, config.train.steps)?
        .with_linears(config.linears(), &layout);
    let numels: Vec<usize> = layout.units.iter().map(|u| u.numel).collect();
    let pb = param_bytes(config.train.precision);
    let (accumulation, _) = fit_batch(config, topology.world(), &mut Vec::new())?;
    Ok(memory(config, cfg, &plan, &numels, pb, accumulation))
}

/// The `memory` section: the states as the engine counts them ([`zero::rank_memory`], with
/// `accumulation` micro-batches a step) plus one micro-batch's activations.
fn memory(
    config: &RunConfig,
    cfg: &model::ModelConfig,
    plan: &ZeroPlan,
    numels: &[usize],
    pb: usize,
    accumulation: usize,
) -> Memory {
    let states = zero::rank_memory(plan, numels, pb, accumulation);
    let (b, s, c, l) = (
        config.train.micro_batch as u64,
        cfg.seq_len as u64,
        cfg.n_embd as u64,
        cfg.n_layer as u64,
    );
    let per_layer = model::Model::new(cfg.clone())
        .map(|m| m.with_linears(config.linears()))
        .map(|m| m.block_activation_bytes(config.train.micro_batch, cfg.seq_len, pb))
        .unwrap_or(0);
    // Each block keeps its input, and under "attention" its MLP half's activations beside.
    let (saved, working) = match config.model.recompute {
        Recompute::Off => (0, l * per_layer),
        Recompute::Full => (l * b * s * c * pb as u64, per_layer),
        Recompute::Attention => {
            let kept = cfg.family().mlp_kept_width(cfg).unwrap_or(0) as u64;
            (l * b * s * (c + kept) * pb as u64, per_layer)
        }
    };
    let gpu = config.train.device == run::config::DeviceKind::Cuda;
    let tokens = config.train.micro_batch * cfg.seq_len;
    let logits = model::layers::logits_chunk_bytes(tokens, cfg.vocab_size, gpu) as u64;
    let kept_weights = model::Model::new(cfg.clone())
        .map(|m| m.with_linears(config.linears()))
        .map(|m| m.with_backward_params(plan.backward_params()))
        .map(|m| m.kept_fp8_weight_bytes())
        .unwrap_or(0);
    let activations = saved + working + logits + kept_weights;
    Memory {
        states,
        activations_saved_inputs: saved,
        activations_block_working: working,
        activations_logits_chunk: logits,
        activations_kept_fp8_weights: kept_weights,
        activations,
        total: states.total() + activations,
    }
}

/// The `comm` section: step 1's logical bytes of plain ZeRO-3 and of the configured ZeRO++,
/// and those of the first step after the qgZ window.
fn comm_per_step(
    config: &RunConfig,
    plan: &ZeroPlan,
    numels: &[usize],
    order: &[usize],
    pb: usize,
    accumulation: usize,
) -> Result<Comm> {
    let steps = config.train.steps;
    let plain_cfg = ZeroConfig {
        quantized_weights: false,
        hpz_partition_size: 1,
        quantized_gradients: false,
        qgz_error_feedback: false,
        ..config.zero.clone()
    };
    let plain = ZeroPlan::resolve(&plain_cfg, plan.topology, steps)?;
    let zero3 = logical_step_bytes(&plain, numels, order, pb, accumulation, 1);
    let zeropp = logical_step_bytes(plan, numels, order, pb, accumulation, 1);
    let ratio = |x: &ByteCounters| x.inter as f64 / zero3.inter.max(1) as f64;
    let after_qgz = plan.qgz.filter(|q| q.until_step < steps).map(|q| {
        let step = q.until_step + 1;
        let after = logical_step_bytes(plan, numels, order, pb, accumulation, step);
        AfterQgz {
            step,
            inter_ratio: ratio(&after),
            zeropp: after.into(),
        }
    });
    Ok(Comm {
        step: 1,
        micro_batches: accumulation,
        inter_ratio: ratio(&zeropp),
        zero3: zero3.into(),
        zeropp: zeropp.into(),
        after_qgz,
    })
}

/// The `paper` section: the paper's M-based accounting.
fn paper(plan: &ZeroPlan, num_params: usize) -> Paper {
    let pv = paper_volume(plan, num_params);
    Paper {
        model_bytes: pv.model_bytes,
        zero3: pv.zero3,
        zeropp: pv.zeropp,
        scales: pv.scales,
        ratio: pv.zeropp / pv.zero3,
        hpz_memory: if plan.hpz {
            pv.model_bytes / plan.topology.ranks_per_node as f64
        } else {
            0.0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use run::engine_options;

    /// Rank 0's engine and the plan count the same memory for the states, row by row, and the
    /// plan's shard is what the engine allocates: plain ZeRO-3 at W = 1, with 8 micro-batches a
    /// step and (bf16) with one, whose gradient stays as the backward wrote it; bf16 with hpZ on
    /// a shape whose blocks outgrow the embedding; qwZ + hpZ + qgZ over 2 nodes x 4.
    #[test]
    fn the_engine_and_the_plan_count_memory_alike() {
        let tiny = "[model]\npreset = \"tiny\"\n";
        let wide =
            "[model]\nn_layer = 3\nn_embd = 96\nn_head = 4\nseq_len = 32\nvocab_size = 1000\n";
        // (model, [train] keys, [zero] keys, W, D, global batch); micro-batches of 1.
        let shapes = [
            (tiny, "", "", 1, 1, 8),
            // One micro-batch at W = 1: the gradient is kept in place (zero::rank_memory).
            (tiny, "precision = \"bf16\"\n", "", 1, 1, 1),
            (
                wide,
                "precision = \"bf16\"\n",
                "hpz_partition_size = 2\n",
                4,
                2,
                8,
            ),
            (
                tiny,
                "",
                "quantized_weights = true\nhpz_partition_size = 4\nquantized_gradients = true\n",
                8,
                4,
                8,
            ),
        ];
        for (model, train, zero, w, d, global) in shapes {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("run.toml");
            let text = format!(
                "{model}[train]\nmicro_batch = 1\nglobal_batch = {global}\n{train}[zero]\n{zero}\
                 [dist]\nworld_size = {w}\ngpus_per_node = {d}\n\
                 [data]\ntrain = [\"x.jsonl\"]\nvalid_fraction = 0.1\n"
            );
            std::fs::write(&path, text).unwrap();
            let overrides = Overrides::default();
            let report = build(&PlanArgs {
                config: Some(&path),
                set: &overrides,
                world_size: None,
                gpus_per_node: None,
                json: true,
                throughput: None,
                sweep: None,
                advise: false,
            })
            .unwrap();

            let config = RunConfig::load(&path, &overrides).unwrap();
            let topology = Topology::new(w, d).unwrap();
            let comm = comm::local_world(topology).into_iter().next().unwrap();
            let options = engine_options(&config, &candle_core::Device::Cpu);
            let engine =
                zero::Engine::new(config.model.resolve(None).unwrap(), options, Box::new(comm))
                    .unwrap();
            let shape = format!("W = {w}, D = {d}: {zero}");
            let micro_batches = report.train.accumulation;
            let estimate = engine.memory_estimate(micro_batches);
            assert_eq!(estimate, report.memory.states, "{shape}");
            let allocated: usize = (0..engine.num_units())
                .map(|u| engine.grad_shard(u).unwrap().len())
                .sum();
            assert_eq!(
                report.memory.states.shard_elems, allocated as u64,
                "{shape}"
            );
        }
    }
}
