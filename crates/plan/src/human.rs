//! `trainer plan`'s table for people: the run, memory per rank, communication per step and the
//! paper's accounting, with `--throughput` the predicted step times, aligned, then the notes (the JSON is the [`Report`] itself).

use std::fmt::Write;

use super::throughput::{Throughput, FP8_CAST_BANDWIDTH_FRACTION, FP8_GEMM_SPEEDUP, GEMM_FRACTION};
use super::{Bytes, Report};
use model::Recompute;
use report::readable;
use run::config::Precision;

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

fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp32 => "fp32",
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
        Precision::Fp8 => "fp8",
    }
}

/// The dtype the parameters are gathered and kept in: FP8 compute gathers bf16 (its GEMMs
/// quantise what they read).
fn parameter_dtype_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp8 => "bf16",
        p => precision_name(p),
    }
}

/// The report as a compact aligned table: the run, then memory, communication and the paper's
/// accounting, then the notes.
pub fn human(r: &Report) -> String {
    let mut o = String::new();
    human_run(&mut o, r);
    human_memory(&mut o, r);
    human_comm(&mut o, r);
    human_paper(&mut o, r);
    if let Some(t) = &r.throughput {
        human_throughput(&mut o, t);
    }
    if let Some(s) = &r.sweep {
        o += &super::sweep::table(s);
    }
    if let Some(a) = &r.advice {
        o += &super::advise::table(a);
    }
    for n in &r.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}

/// The model, ranks and ZeRO++ lines.
fn human_run(o: &mut String, r: &Report) {
    let m = &r.model;
    let t = &r.train;
    let z = &r.zero;
    let pname = precision_name(t.precision);
    let _ = writeln!(
        *o,
        "model     {} ({}): {} layers x {} wide, {} heads{}, MLP {}, seq {}, vocab {}{}",
        m.preset.as_deref().unwrap_or("custom"),
        m.arch,
        m.n_layer,
        m.n_embd,
        m.n_head,
        match m.n_kv_head == m.n_head {
            true => String::new(),
            false => format!(" / {} KV", m.n_kv_head),
        },
        m.ffn_hidden,
        m.seq_len,
        m.vocab_size,
        match m.tie_embeddings {
            true => ", tied head",
            false => ", untied head",
        }
    );
    let _ = writeln!(
        *o,
        "          {} parameters ({:.2} B), M = 2 x params = {} ({})",
        grouped(m.num_params),
        m.num_params as f64 / 1e9,
        grouped(m.model_bytes),
        readable::bytes(m.model_bytes)
    );
    let _ = writeln!(
        *o,
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
    if z.qwz {
        tech.push(z.weight_codec.clone());
    }
    if z.hpz {
        tech.push(format!("hpZ (groups of {})", z.hpz_partition_size));
    }
    if let (Some(qgz), Some(until)) = (z.grad_codecs.first(), z.qgz_until_step) {
        tech.push(format!("{qgz} in steps 1..={until}"));
    }
    let _ = writeln!(
        *o,
        "zero++    {}; reduce-scatter in {}",
        if tech.is_empty() {
            "none (plain ZeRO-3)".to_string()
        } else {
            tech.join(" + ")
        },
        z.reduce_dtype
    );
}

/// The memory table.
fn human_memory(o: &mut String, r: &Report) {
    let (t, z) = (&r.train, &r.zero);
    let pname = parameter_dtype_name(t.precision);
    let mem = &r.memory;
    let pct = |x: u64| 100.0 * x as f64 / mem.total.max(1) as f64;
    let _ = writeln!(
        *o,
        "\n{:<32}{:>18}{:>12}{:>8}",
        "memory per rank", "bytes", "", "share"
    );
    let mut row = |label: String, x: u64| {
        let _ = writeln!(
            *o,
            "  {label:<30}{:>18}{:>12}{:>7.1}%",
            grouped(x),
            readable::bytes(x),
            pct(x)
        );
    };
    row(
        format!("parameters shard ({pname})"),
        mem.states.param_shard,
    );
    let grad = match mem.states.grad_in_place {
        true => format!("gradients as written ({pname})"),
        false => "gradient shard (fp32)".into(),
    };
    row(grad, mem.states.grad_shard);
    row(
        if mem.states.optimizer_includes_master {
            "optimizer (master + m + v)".into()
        } else {
            "Adam m + v (params are master)".into()
        },
        mem.states.optimizer_states,
    );
    row(
        match (z.hpz, z.qwz) {
            (false, _) => "hpZ secondary (off)".into(),
            (true, true) => format!(
                "hpZ secondary ({}, 1/{})",
                match precision_name(t.precision) {
                    "fp8" => "FP8/INT8",
                    _ => "INT8",
                },
                r.topology.gpus_per_node
            ),
            (true, false) => format!("hpZ secondary ({pname}, 1/{})", r.topology.gpus_per_node),
        },
        mem.states.hpz_secondary,
    );
    let ahead = z.prefetch_depth;
    let gathered = format!("gathered (1 + {ahead} prefetched)");
    row(gathered, mem.states.gathered_working_set);
    let reducing = match (z.qgz, z.reduce_dtype) {
        (false, "bf16") => "bf16",
        _ => "fp32",
    };
    row(
        format!("reducing gradients ({reducing})"),
        mem.states.reductions_in_flight,
    );
    if mem.states.qgz_error_feedback > 0 {
        row(
            "qgZ error feedback (fp32)".into(),
            mem.states.qgz_error_feedback,
        );
    }
    row(
        format!(
            "activations{}",
            match t.recompute {
                Recompute::Off => "",
                Recompute::Full => " (recompute)",
                Recompute::Attention => " (recompute attn)",
            }
        ),
        mem.activations,
    );
    if t.recompute.any() {
        let saved = match t.recompute {
            Recompute::Attention => "  saved block inputs and MLPs",
            _ => "  saved block inputs",
        };
        row(saved.into(), mem.activations_saved_inputs);
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
    row("  loss logits chunk".into(), mem.activations_logits_chunk);
    if mem.activations_kept_fp8_weights > 0 {
        row(
            "  FP8 weights kept for the backward".into(),
            mem.activations_kept_fp8_weights,
        );
    }
    row("total".into(), mem.total);
}

/// The communication table.
fn human_comm(o: &mut String, r: &Report) {
    let c = &r.comm;
    let _ = writeln!(
        *o,
        "\ncomm per rank, step {} ({} micro-batch{}), logical bytes",
        c.step,
        c.micro_batches,
        if c.micro_batches == 1 { "" } else { "es" },
    );
    let _ = writeln!(
        *o,
        "  {:<30}{:>30}{:>30}{:>9}",
        "", "intra-node", "inter-node", "/ZeRO-3"
    );
    let mut crow = |label: &str, b: &Bytes, ratio: f64| {
        let _ = writeln!(
            *o,
            "  {label:<30}{:>18}{:>12}{:>18}{:>12}{:>9.3}",
            grouped(b.intra),
            readable::bytes(b.intra),
            grouped(b.inter),
            readable::bytes(b.inter),
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
}

/// The paper's accounting.
fn human_paper(o: &mut String, r: &Report) {
    let p = &r.paper;
    let _ = writeln!(
        *o,
        "\n{:<32}{:>18}{:>12}{:>8}",
        "paper, cross-node per step", "bytes", "", "x M"
    );
    let mut prow = |label: &str, x: f64| {
        let _ = writeln!(
            *o,
            "  {label:<30}{:>18}{:>12}{:>8.3}",
            grouped(x.round() as u64),
            readable::bytes_f64(x),
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
}

/// The predicted step times of `--throughput`.
fn human_throughput(o: &mut String, t: &Throughput) {
    let n = &t.network;
    let compute = match &t.calibrated_from {
        Some(file) => format!(
            "{}, its units as measured in {file} (memory-bound kernels at {:.0} GB/s)",
            t.gpu.name, t.gpu.mem_bw_gbs
        ),
        None => match (t.fp8_linears, t.gpu.fp8_peak_tflops) {
            (true, Some(_)) => format!(
                "{} at {} TFLOP/s x {} (the blocks' linear layers in FP8: their GEMMs, {} of the \
                 peak in bf16, {}x faster; the casts at {} of {:.0} GB/s)",
                t.gpu.name,
                t.gpu.peak_tflops,
                t.mfu_fraction,
                GEMM_FRACTION,
                FP8_GEMM_SPEEDUP,
                FP8_CAST_BANDWIDTH_FRACTION,
                t.gpu.mem_bw_gbs
            ),
            _ => format!(
                "{} at {} TFLOP/s x {}",
                t.gpu.name, t.gpu.peak_tflops, t.mfu_fraction
            ),
        },
    };
    let mut shared = match t.ranks_per_gpu > 1 {
        true => format!(", all {} ranks on one GPU", t.ranks_per_gpu),
        false => String::new(),
    };
    if !t.overlap {
        shared.push_str(", no overlap");
    }
    let _ = writeln!(
        *o,
        "\nthroughput, predicted: {compute}, {} Gb/s a GPU in the node, {} Gb/s a node across, \
         {} us a message{shared}",
        n.intra_gbps, n.inter_gbps, n.latency_us
    );
    let _ = writeln!(
        *o,
        "  a GPU's step: {} tokens, {:.3e} FLOPs executed (recomputation included), {:.3e} model FLOPs",
        grouped(t.tokens_per_gpu_step),
        t.hardware_flops_per_gpu_step,
        t.model_flops_per_gpu_step
    );
    let _ = writeln!(
        *o,
        "  {:<10}{:>10}{:>10}{:>10}{:>10}{:>14}{:>10}{:>9}{:>9}",
        "", "step s", "compute", "comm", "exposed", "tokens/s", "/GPU", "TFLOP/s", "speedup"
    );
    for (name, p) in t.variants() {
        let _ = writeln!(
            *o,
            "  {name:<10}{:>10}{:>10}{:>10}{:>10}{:>14}{:>10.0}{:>9.2}{:>9.2}",
            seconds(p.step_s),
            seconds(p.compute_s),
            seconds(p.comm_s),
            seconds(p.exposed_comm_s),
            grouped(p.tokens_per_s.round() as u64),
            p.tokens_per_s_per_gpu,
            p.tflops_per_gpu,
            p.speedup
        );
    }
}

/// Seconds to 4 significant digits (at most 6 decimals): `12.01`, `0.002600`.
fn seconds(x: f64) -> String {
    let digits = match x > 0.0 {
        true => (3 - x.log10().floor() as i32).clamp(0, 6) as usize,
        false => 3,
    };
    format!("{x:.digits$}")
}
