//! `trainer plan`: memory and communication per rank for a run config at a given world size,
//! from the layouts and arithmetic alone (nothing of the model is allocated).
//!
//! docs/plan.md explains every number and the JSON keys; DESIGN.md section 3 the two
//! accountings of communication (logical bytes per rank, and the paper's M-based one).

use std::path::Path;

use anyhow::{bail, Context, Result};
use comm::{ByteCounters, Topology};
use serde::Serialize;
use zero::volume::{logical_step_bytes, paper_volume};
use zero::{ZeroConfig, ZeroPlan};

use crate::config::{Precision, RunConfig};

/// The command line of `trainer plan`.
pub struct PlanArgs<'a> {
    pub config: Option<&'a Path>,
    pub set: &'a [String],
    pub world_size: Option<usize>,
    pub gpus_per_node: Option<usize>,
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub model: ModelInfo,
    pub topology: TopologyInfo,
    pub train: TrainInfo,
    pub zero: ZeroInfo,
    pub memory: Memory,
    pub comm: Comm,
    pub paper: Paper,
    /// Adjustments made to fit the config to the planned topology.
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ModelInfo {
    pub preset: Option<String>,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub seq_len: usize,
    pub vocab_size: usize,
    pub num_params: u64,
    /// Sum over units of the padded flat buffers.
    pub padded_params: u64,
    pub units: usize,
    /// M = 2 x num_params (bf16 bytes).
    pub model_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct TopologyInfo {
    pub world_size: usize,
    pub gpus_per_node: usize,
    pub nodes: usize,
}

#[derive(Debug, Serialize)]
pub struct TrainInfo {
    pub precision: Precision,
    pub param_bytes: usize,
    pub micro_batch: usize,
    pub accumulation: usize,
    pub global_batch: usize,
    pub steps: u64,
    pub recompute: bool,
}

#[derive(Debug, Serialize)]
pub struct ZeroInfo {
    pub qwz: bool,
    pub weight_quant_block: Option<usize>,
    pub hpz: bool,
    pub hpz_partition_size: usize,
    pub qgz: bool,
    pub grad_quant_block: Option<usize>,
    /// qgZ is on for optimizer steps 1..=qgz_until_step.
    pub qgz_until_step: Option<u64>,
    /// Every shard is a whole number of this many elements.
    pub align: usize,
}

#[derive(Debug, Serialize)]
pub struct Memory {
    /// Elements of every unit this rank owns: sum of padded / W.
    pub shard_elems: u64,
    pub param_shard: u64,
    pub grad_shard: u64,
    pub optimizer_states: u64,
    /// fp32 precision: the parameter shard is the fp32 master, so `optimizer_states` is Adam m + v only.
    pub optimizer_includes_master: bool,
    pub hpz_secondary: u64,
    pub gathered_working_set: u64,
    /// Full fp32 gradients of the units whose reduction is in flight (the largest
    /// `zero::REDUCTIONS_IN_FLIGHT`).
    pub reductions_in_flight: u64,
    pub activations_saved_inputs: u64,
    pub activations_block_working: u64,
    pub activations_logits_chunk: u64,
    pub activations: u64,
    pub total: u64,
}

#[derive(Debug, Serialize)]
pub struct Bytes {
    pub intra: u64,
    pub inter: u64,
}

impl From<ByteCounters> for Bytes {
    fn from(c: ByteCounters) -> Self {
        Bytes {
            intra: c.intra,
            inter: c.inter,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct AfterQgz {
    /// The first step without qgZ.
    pub step: u64,
    pub zeropp: Bytes,
    pub inter_ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct Comm {
    /// The step these are for (1) and its micro-batches (= accumulation).
    pub step: u64,
    pub micro_batches: usize,
    pub zero3: Bytes,
    pub zeropp: Bytes,
    /// zeropp.inter / zero3.inter.
    pub inter_ratio: f64,
    /// The same after the qgZ window (qgz_until < 1), else null.
    pub after_qgz: Option<AfterQgz>,
}

#[derive(Debug, Serialize)]
pub struct Paper {
    pub model_bytes: f64,
    pub zero3: f64,
    pub zeropp: f64,
    pub scales: f64,
    /// zeropp / zero3 (without scales).
    pub ratio: f64,
    /// M / gpus_per_node when hpZ is on, else 0.
    pub hpz_memory: f64,
}

/// Runs `trainer plan`: prints the report as a table or, with `--json`, one JSON object.
pub fn run(args: &PlanArgs) -> Result<()> {
    let report = build(args)?;
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
        Precision::Bf16 | Precision::Fp16 => 2,
    }
}

/// Bytes of `numel` INT8 codes plus their f32 scales (as `zero::volume` counts them).
fn int8_bytes(numel: usize, block: usize) -> u64 {
    (numel + numel / block * 4) as u64
}

pub fn build(args: &PlanArgs) -> Result<Report> {
    let path = args
        .config
        .context("no --config given (trainer plan --config FILE)")?;
    let mut config = RunConfig::load(path, args.set)?;
    let mut notes = Vec::new();

    // The topology: the command line over [dist].
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

    // hpZ's group is a node: a config that set it to its own node size follows the node.
    let hpz_explicit = args.set.iter().any(|s| {
        s.split_once('=')
            .is_some_and(|(k, _)| k.trim() == "zero.hpz_partition_size")
    });
    let h = config.zero.hpz_partition_size;
    if h != 1 && h == file_d && h != d && !hpz_explicit {
        notes.push(format!(
            "zero.hpz_partition_size = {h} (the config's gpus per node) follows the node: {d}"
        ));
        config.zero.hpz_partition_size = d;
    }

    // Micro-batches per step at this world size.
    let t = &config.train;
    let per_pass = t.micro_batch * w;
    let mut accumulation = config.accumulation();
    if accumulation == 0 || !t.global_batch.is_multiple_of(per_pass) {
        accumulation = accumulation.max(1);
        notes.push(format!(
            "train.global_batch = {} is not a multiple of micro_batch x world = {} x {w}: \
             planned with {accumulation} micro-batch(es) a step (global batch {})",
            t.global_batch,
            t.micro_batch,
            per_pass * accumulation
        ));
    }
    let global_batch = per_pass * accumulation;

    let cfg = config.model_config()?;
    let plan = ZeroPlan::resolve(&config.zero, topology, t.steps)?;
    let plain_cfg = ZeroConfig {
        quantized_weights: false,
        hpz_partition_size: 1,
        quantized_gradients: false,
        ..config.zero.clone()
    };
    let plain = ZeroPlan::resolve(&plain_cfg, topology, t.steps)?;

    let layout = model::ModelLayout::new(&cfg);
    let numels: Vec<usize> = layout.units.iter().map(|u| u.numel).collect();
    let num_params = cfg.num_params();
    let pb = param_bytes(t.precision);
    let padded: Vec<usize> = numels.iter().map(|&n| plan.partition(n).padded).collect();
    let padded_sum: u64 = padded.iter().map(|&p| p as u64).sum();

    // Memory per rank.
    let shard: u64 = padded.iter().map(|&p| (p / w) as u64).sum();
    let fp32 = t.precision == Precision::Fp32;
    let param_shard = pb as u64 * shard;
    let grad_shard = 4 * shard;
    let optimizer_states = if fp32 { 8 * shard } else { 12 * shard };
    let hpz_secondary: u64 = if plan.hpz {
        padded
            .iter()
            .map(|&p| match plan.qwz {
                Some(q) => int8_bytes(p / d, q.block),
                None => ((p / d) * pb) as u64,
            })
            .sum()
    } else {
        0
    };
    let mut sorted = padded.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let gathered_working_set: u64 = sorted.iter().take(2).map(|&p| (p * pb) as u64).sum();
    let reductions_in_flight: u64 = sorted
        .iter()
        .take(zero::REDUCTIONS_IN_FLIGHT)
        .map(|&p| 4 * p as u64)
        .sum();
    let (b, s, c, a, l) = (
        t.micro_batch as u64,
        cfg.seq_len as u64,
        cfg.n_embd as u64,
        cfg.n_head as u64,
        cfg.n_layer as u64,
    );
    // Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes per layer at 16 bits.
    let per_layer = b * s * (34 * c + 5 * a * s) * pb as u64 / 2;
    let recompute = config.model.recompute;
    let (saved, working) = if recompute {
        (l * b * s * c * pb as u64, per_layer)
    } else {
        (0, l * per_layer)
    };
    let logits = (model::layers::CE_CHUNK_ELEMS * 4) as u64;
    let activations = saved + working + logits;
    let total = param_shard
        + grad_shard
        + optimizer_states
        + hpz_secondary
        + gathered_working_set
        + reductions_in_flight
        + activations;

    // Communication per rank per step.
    let zero3 = logical_step_bytes(&plain, &numels, pb, accumulation, 1);
    let zeropp = logical_step_bytes(&plan, &numels, pb, accumulation, 1);
    let ratio = |x: &ByteCounters| x.inter as f64 / zero3.inter.max(1) as f64;
    let inter_ratio = ratio(&zeropp);
    let after_qgz = plan.qgz.filter(|q| q.until_step < t.steps).map(|q| {
        let step = q.until_step + 1;
        let after = logical_step_bytes(&plan, &numels, pb, accumulation, step);
        AfterQgz {
            step,
            inter_ratio: ratio(&after),
            zeropp: after.into(),
        }
    });

    let pv = paper_volume(&plan, num_params);
    let paper = Paper {
        model_bytes: pv.model_bytes,
        zero3: pv.zero3,
        zeropp: pv.zeropp,
        scales: pv.scales,
        ratio: pv.zeropp / pv.zero3,
        hpz_memory: if plan.hpz {
            pv.model_bytes / d as f64
        } else {
            0.0
        },
    };

    Ok(Report {
        model: ModelInfo {
            preset: config.model.preset.clone(),
            n_layer: cfg.n_layer,
            n_embd: cfg.n_embd,
            n_head: cfg.n_head,
            seq_len: cfg.seq_len,
            vocab_size: cfg.vocab_size,
            num_params: num_params as u64,
            padded_params: padded_sum,
            units: numels.len(),
            model_bytes: 2 * num_params as u64,
        },
        topology: TopologyInfo {
            world_size: w,
            gpus_per_node: d,
            nodes: topology.nodes,
        },
        train: TrainInfo {
            precision: t.precision,
            param_bytes: pb,
            micro_batch: t.micro_batch,
            accumulation,
            global_batch,
            steps: t.steps,
            recompute,
        },
        zero: ZeroInfo {
            qwz: plan.qwz.is_some(),
            weight_quant_block: plan.qwz.map(|q| q.block),
            hpz: plan.hpz,
            hpz_partition_size: config.zero.hpz_partition_size,
            qgz: plan.qgz.is_some(),
            grad_quant_block: plan.qgz.map(|q| q.block),
            qgz_until_step: plan.qgz.map(|q| q.until_step),
            align: plan.align,
        },
        memory: Memory {
            shard_elems: shard,
            param_shard,
            grad_shard,
            optimizer_states,
            optimizer_includes_master: !fp32,
            hpz_secondary,
            gathered_working_set,
            reductions_in_flight,
            activations_saved_inputs: saved,
            activations_block_working: working,
            activations_logits_chunk: logits,
            activations,
            total,
        },
        comm: Comm {
            step: 1,
            micro_batches: accumulation,
            zero3: zero3.into(),
            zeropp: zeropp.into(),
            inter_ratio,
            after_qgz,
        },
        paper,
        notes,
    })
}

/// `1234567` -> `"1,234,567"`.
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Binary units: `"1.50 GiB"`.
fn human_bytes(n: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
    }
}

/// The report as a compact aligned table.
pub fn human(r: &Report) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let m = &r.model;
    let t = &r.train;
    let z = &r.zero;
    let pname = precision_name(t.precision);
    let _ = writeln!(
        o,
        "model     {}: {} layers x {} wide, {} heads, seq {}, vocab {}",
        m.preset.as_deref().unwrap_or("custom"),
        m.n_layer,
        m.n_embd,
        m.n_head,
        m.seq_len,
        m.vocab_size
    );
    let _ = writeln!(
        o,
        "          {} parameters ({:.2} B), M = 2 x params = {} ({})",
        grouped(m.num_params),
        m.num_params as f64 / 1e9,
        grouped(m.model_bytes),
        human_bytes(m.model_bytes as f64)
    );
    let _ = writeln!(
        o,
        "ranks     {} = {} nodes x {}; {pname} ({} bytes a parameter); micro-batch {} x {} accumulation; {} steps",
        r.topology.world_size,
        r.topology.nodes,
        r.topology.gpus_per_node,
        t.param_bytes,
        t.micro_batch,
        t.accumulation,
        t.steps
    );
    let mut tech = Vec::new();
    if let Some(bk) = z.weight_quant_block {
        tech.push(format!("qwZ (INT8, block {bk})"));
    }
    if z.hpz {
        tech.push(format!("hpZ (groups of {})", z.hpz_partition_size));
    }
    if let (Some(bk), Some(until)) = (z.grad_quant_block, z.qgz_until_step) {
        tech.push(format!("qgZ (INT4, block {bk}, steps 1..={until})"));
    }
    let _ = writeln!(
        o,
        "zero++    {}",
        if tech.is_empty() {
            "none (plain ZeRO-3)".to_string()
        } else {
            tech.join(" + ")
        }
    );

    let mem = &r.memory;
    let pct = |x: u64| 100.0 * x as f64 / mem.total.max(1) as f64;
    let _ = writeln!(
        o,
        "\n{:<32}{:>18}{:>12}{:>8}",
        "memory per rank", "bytes", "", "share"
    );
    let mut row = |label: String, x: u64| {
        let _ = writeln!(
            o,
            "  {label:<30}{:>18}{:>12}{:>7.1}%",
            grouped(x),
            human_bytes(x as f64),
            pct(x)
        );
    };
    row(format!("parameters shard ({pname})"), mem.param_shard);
    row("gradient shard (fp32)".into(), mem.grad_shard);
    row(
        if mem.optimizer_includes_master {
            "optimizer (master + m + v)".into()
        } else {
            "Adam m + v (params are master)".into()
        },
        mem.optimizer_states,
    );
    row(
        match (z.hpz, z.qwz) {
            (false, _) => "hpZ secondary (off)".into(),
            (true, true) => format!("hpZ secondary (INT8, 1/{})", r.topology.gpus_per_node),
            (true, false) => format!("hpZ secondary ({pname}, 1/{})", r.topology.gpus_per_node),
        },
        mem.hpz_secondary,
    );
    row(
        "gathered units (largest two)".into(),
        mem.gathered_working_set,
    );
    row("reducing gradients (fp32)".into(), mem.reductions_in_flight);
    row(
        format!(
            "activations{}",
            if t.recompute { " (recompute)" } else { "" }
        ),
        mem.activations,
    );
    if t.recompute {
        row("  saved block inputs".into(), mem.activations_saved_inputs);
        row(
            "  one block's working set".into(),
            mem.activations_block_working,
        );
    } else {
        row(
            "  all blocks' working sets".into(),
            mem.activations_block_working,
        );
    }
    row(
        "  loss logits chunk (fp32)".into(),
        mem.activations_logits_chunk,
    );
    row("total".into(), mem.total);

    let c = &r.comm;
    let _ = writeln!(
        o,
        "\ncomm per rank, step {} ({} micro-batch{}), logical bytes",
        c.step,
        c.micro_batches,
        if c.micro_batches == 1 { "" } else { "es" },
    );
    let _ = writeln!(
        o,
        "  {:<30}{:>30}{:>30}{:>9}",
        "", "intra-node", "inter-node", "/ZeRO-3"
    );
    let mut crow = |label: &str, b: &Bytes, ratio: f64| {
        let _ = writeln!(
            o,
            "  {label:<30}{:>18}{:>12}{:>18}{:>12}{:>9.3}",
            grouped(b.intra),
            human_bytes(b.intra as f64),
            grouped(b.inter),
            human_bytes(b.inter as f64),
            ratio
        );
    };
    crow("ZeRO-3", &c.zero3, 1.0);
    crow("ZeRO++", &c.zeropp, c.inter_ratio);
    if let Some(a) = &c.after_qgz {
        crow(
            &format!("ZeRO++ step {}+ (no qgZ)", a.step),
            &a.zeropp,
            a.inter_ratio,
        );
    }

    let p = &r.paper;
    let _ = writeln!(
        o,
        "\n{:<32}{:>18}{:>12}{:>8}",
        "paper, cross-node per step", "bytes", "", "x M"
    );
    let mut prow = |label: &str, x: f64| {
        let _ = writeln!(
            o,
            "  {label:<30}{:>18}{:>12}{:>8.3}",
            grouped(x.round() as u64),
            human_bytes(x),
            x / p.model_bytes
        );
    };
    prow("M (bf16 parameters)", p.model_bytes);
    prow("ZeRO-3 (3M)", p.zero3);
    prow("ZeRO++ (without scales)", p.zeropp);
    prow("ZeRO++ quantisation scales", p.scales);
    prow(
        &format!("hpZ memory per rank (M/{})", r.topology.gpus_per_node),
        p.hpz_memory,
    );
    for n in &r.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}
