//! Tests of the time model: each collective against its closed form on hand-computed numbers,
//! the payloads against the plan's logical bytes, and the predictions' orderings.

use comm::Topology;
use model::{Model, ModelConfig, Recompute};
use zero::volume::{logical_step_bytes, unit_payload};
use zero::{ZeroConfig, ZeroPlan};

use super::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

/// 2 nodes x 4, NVLink 800 Gb/s (100 GB/s), a node's link 80 Gb/s (10 GB/s), 1 µs, memory
/// 1000 GB/s, compute 100 TFLOP/s x 0.5.
fn cluster(nodes: usize, d: usize, inter_gbps: f64) -> Cluster {
    Cluster {
        gpu: Gpu {
            name: "test",
            peak_tflops: 100.0,
            fp8_peak_tflops: Some(200.0),
            mem_bw_gbs: 1000.0,
            nvlink_gbps: 800.0,
            memory_gib: 80.0,
        },
        mfu_fraction: 0.5,
        network: Network {
            intra_gbps: 800.0,
            inter_gbps,
            latency_us: 1.0,
        },
        ranks_per_gpu: 1,
        overlap: true,
        topology: Topology::new(nodes * d, d).unwrap(),
    }
}

#[test]
fn ring_and_all_to_all_follow_their_closed_forms() {
    // (4-1)/4 x 1000 B / 100 B/s + 3 x 0.01 s.
    assert!(close(ring_s(1000.0, 4, 100.0, 0.01), 7.53));
    assert_eq!(ring_s(1000.0, 1, 100.0, 0.01), 0.0);
    // (8-1)/8 x 800 B / 100 B/s + 7 x 1 ms.
    assert!(close(all_to_all_s(800.0, 8, 100.0, 0.001), 7.007));
}

#[test]
fn each_group_runs_at_its_slowest_link() {
    let c = cluster(2, 4, 80.0);
    // A world ring crosses the 10 GB/s node link: 7/8 x 8 GB / 10 GB/s + 7 µs.
    assert!(close(c.world_ring_s(8e9), 0.7 + 7e-6));
    // A node ring runs on NVLink: 3/4 x 8 GB / 100 GB/s + 3 µs.
    assert!(close(c.node_ring_s(8e9), 0.06 + 3e-6));
    // Hop 2: the node's 4 ranks share its link, 2.5 GB/s each: 1/2 x 4 GB / 2.5 GB/s + 1 µs.
    assert!(close(c.cross_all_to_all_s(4e9), 0.8 + 1e-6));
    // Hop 1: 3/4 x 4 GB / 100 GB/s + 3 µs.
    assert!(close(c.node_all_to_all_s(4e9), 0.03 + 3e-6));
    // One node: the world ring is a node ring.
    let one = cluster(1, 8, 80.0);
    assert!(close(one.world_ring_s(8e9), 7.0 / 8.0 * 0.08 + 7e-6));
    assert_eq!(one.cross_all_to_all_s(4e9), 0.0);
}

fn plan(cfg: ZeroConfig, nodes: usize, d: usize) -> ZeroPlan {
    ZeroPlan::resolve(&cfg, Topology::new(nodes * d, d).unwrap(), 100).unwrap()
}

fn zeropp() -> ZeroConfig {
    ZeroConfig {
        quantized_weights: true,
        hpz_partition_size: 4,
        quantized_gradients: true,
        weight_quant_block: 2048,
        grad_quant_block: 512,
        ..Default::default()
    }
}

/// A unit of 32768 elements at 2 x 4 (no padding: 8 ranks x 2048 align divides it), bf16.
#[test]
fn unit_jobs_follow_their_closed_forms() {
    let c = cluster(2, 4, 80.0);
    let e = 32768.0;
    let (intra, inter, mem, lat) = (1e11, 1e10, 1e12, 1e-6);
    let zero3 = plan(ZeroConfig::default(), 2, 4);
    let p = unit_payload(&zero3, 0, 32768, 2);
    let j = unit_comm(&zero3, &p, &c);
    assert!(close(
        j.world_gather,
        7.0 / 8.0 * 2.0 * e / inter + 7.0 * lat
    ));
    assert!(close(
        j.node_gather,
        3.0 / 4.0 * 2.0 * e / intra + 3.0 * lat
    ));
    assert!(close(j.reduce, 7.0 / 8.0 * 4.0 * e / inter + 7.0 * lat));

    let pp = plan(zeropp(), 2, 4);
    let p = unit_payload(&pp, 0, 32768, 2);
    assert_eq!((p.gather_data, p.gather_scales), (32768, 16 * 4));
    let j = unit_comm(&pp, &p, &c);
    // Codes and scales: two world rings, then the dequantise (codes + scales in, bf16 out).
    let codes = 7.0 / 8.0 * e / inter + 7.0 * lat;
    let scales = 7.0 / 8.0 * 64.0 / inter + 7.0 * lat;
    let dequantise = (e + 64.0 + 2.0 * e) / mem;
    assert!(close(j.world_gather, codes + scales + dequantise));
    // qgZ: INT4 of the unit (e/2 + 4 e/512) over the node, of its quarter over the 2 nodes.
    let hop1 = e / 2.0 + 4.0 * e / 512.0;
    let hop2 = hop1 / 4.0;
    assert_eq!((p.qgz_hop1, p.qgz_hop2), (hop1 as u64, hop2 as u64));
    let kernels = (4.0 * e + 2.0 * hop1 + 2.0 * hop2 + 4.0 * e / 8.0) / mem;
    let a2a1 = 3.0 / 4.0 * hop1 / intra + 3.0 * lat;
    let a2a2 = 1.0 / 2.0 * hop2 / (inter / 4.0) + lat;
    assert!(close(j.reduce, kernels + a2a1 + a2a2), "{}", j.reduce);
}

/// The payloads are the bytes the plan reports: one unit, one micro-batch, a rank's logical
/// bytes per peer are the payloads over the group's size.
#[test]
fn payloads_are_the_plans_logical_bytes() {
    let (n, d) = (2usize, 4usize);
    let w = n * d;
    let numel = 5000;
    let all_reduces = |peers: usize| (8 * peers) as u64;

    let p3 = plan(ZeroConfig::default(), n, d);
    let p = unit_payload(&p3, 0, numel, 2);
    let logical = logical_step_bytes(&p3, &[numel], &[0, 0], 2, 1, 1);
    let per_peer = 2 * p.gather_data / w as u64 + p.reduce_scatter / w as u64;
    assert_eq!(
        logical.inter,
        per_peer * (w - d) as u64 + all_reduces(w - d)
    );
    assert_eq!(
        logical.intra,
        per_peer * (d - 1) as u64 + all_reduces(d - 1)
    );

    let pp = plan(zeropp(), n, d);
    let p = unit_payload(&pp, 0, numel, 2);
    let logical = logical_step_bytes(&pp, &[numel], &[0, 0], 2, 1, 1);
    let gathered = p.gather_data + p.gather_scales;
    let inter = gathered / w as u64 * (w - d) as u64 + p.qgz_hop2 / n as u64 * (n - 1) as u64;
    assert_eq!(logical.inter, inter + all_reduces(w - d));
    let intra =
        (gathered / w as u64 + gathered / d as u64 + p.qgz_hop1 / d as u64) * (d - 1) as u64;
    assert_eq!(logical.intra, intra + all_reduces(d - 1));
}

/// GPT-2, 8 layers x 1024, seq 1024, on 4 nodes x 8, micro-batch 4.
fn predictions(inter_gbps: f64) -> Throughput {
    predictions_with(inter_gbps, zero::ReduceDtype::Fp32)
}

/// [`predictions`] with the plain reduce-scatter in `reduce_dtype`.
fn predictions_with(inter_gbps: f64, reduce_dtype: zero::ReduceDtype) -> Throughput {
    let model = Model::new(ModelConfig::gpt2(8, 1024, 16, 1024, 50304)).unwrap();
    let work = Workload::bf16(&model, 4, 2, Recompute::Full);
    let mut c = cluster(4, 8, inter_gbps);
    c.network.intra_gbps = 2400.0;
    let base = ZeroConfig {
        weight_quant_block: 2048,
        grad_quant_block: 512,
        reduce_dtype,
        ..Default::default()
    };
    throughput(&work, &base, 100, &c).unwrap()
}

/// `zero.reduce_dtype = "bf16"` halves the reduce-scatter's payload: on a slow link, where
/// ZeRO-3's step is its communication (2 + 2 + 4 bytes an element become 2 + 2 + 2), its
/// communication takes 3/4 of the time; qgZ's variants, which replace the reduce-scatter, do
/// not change.
#[test]
fn a_bf16_reduce_scatter_shortens_zero3_and_leaves_qgz() {
    let (fp32, bf16) = (
        predictions_with(10.0, zero::ReduceDtype::Fp32),
        predictions_with(10.0, zero::ReduceDtype::Bf16),
    );
    let ratio = bf16.zero3.comm_s / fp32.zero3.comm_s;
    assert!((0.74..0.77).contains(&ratio), "{ratio}");
    assert!(bf16.hpz.comm_s < fp32.hpz.comm_s && bf16.qwz.comm_s < fp32.qwz.comm_s);
    assert_eq!(bf16.qgz.comm_s, fp32.qgz.comm_s);
    assert_eq!(bf16.zeropp.step_s, fp32.zeropp.step_s);
    assert!(bf16.zeropp.speedup < fp32.zeropp.speedup);
}

#[test]
fn zeropp_wins_on_a_slow_link_and_ties_on_a_fast_one() {
    let slow = predictions(10.0);
    assert!(
        slow.zeropp.step_s < 0.5 * slow.zero3.step_s,
        "{:?} vs {:?}",
        slow.zeropp,
        slow.zero3
    );
    for (name, p) in slow.variants() {
        assert!(p.speedup >= 1.0, "{name}: {p:?}");
        assert!(p.exposed_comm_s > 0.0 && p.tflops_per_gpu > 0.0, "{name}");
    }
    let fast = predictions(1e6);
    let ratio = fast.zeropp.step_s / fast.zero3.step_s;
    assert!((0.95..1.05).contains(&ratio), "{ratio}");
    // Compute is what the step is made of then.
    assert!(fast.zero3.exposed_comm_s < 0.05 * fast.zero3.step_s);
}

/// `--no-overlap`: each variant's step is its compute and its communication one after the
/// other, never shorter than the overlapped step, and the compute is the same.
#[test]
fn without_overlap_the_step_is_compute_plus_communication() {
    let model = Model::new(ModelConfig::gpt2(8, 1024, 16, 1024, 50304)).unwrap();
    let work = Workload::bf16(&model, 4, 2, Recompute::Full);
    let base = ZeroConfig {
        weight_quant_block: 2048,
        grad_quant_block: 512,
        ..Default::default()
    };
    let overlapped = cluster(4, 8, 200.0);
    let serial = Cluster {
        overlap: false,
        ..overlapped
    };
    let a = throughput(&work, &base, 100, &overlapped).unwrap();
    let b = throughput(&work, &base, 100, &serial).unwrap();
    for ((name, o), (_, s)) in a.variants().into_iter().zip(b.variants()) {
        assert_eq!(o.compute_s, s.compute_s, "{name}");
        assert!(
            (s.step_s - (s.compute_s + s.comm_s)).abs() < 1e-12,
            "{name}: {s:?}"
        );
        assert!(s.step_s >= o.step_s, "{name}: {s:?} vs {o:?}");
    }
    assert!(b.zero3.exposed_comm_s > a.zero3.exposed_comm_s);
}

#[test]
fn every_variant_is_no_slower_on_a_faster_link() {
    let rates = [
        5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1600.0, 1e5,
    ];
    let runs: Vec<Throughput> = rates.iter().map(|&r| predictions(r)).collect();
    for pair in runs.windows(2) {
        for ((name, slow), (_, fast)) in pair[0].variants().into_iter().zip(pair[1].variants()) {
            assert!(fast.step_s <= slow.step_s, "{name}: {slow:?} -> {fast:?}");
        }
    }
}

/// The FLOPs: executed = the model's count with one block forward more (recompute), minus what
/// the model convention counts that no matmul runs (embedding lookup, norms).
#[test]
fn executed_flops_add_the_recomputed_forward() {
    let t = predictions(100.0);
    let cfg = ModelConfig::gpt2(8, 1024, 16, 1024, 50304);
    let tokens = (4 * 1024 * 2) as f64;
    let (l, c, s, v) = (8.0, 1024.0, 1024.0, 50304.0);
    let model = Model::new(cfg).unwrap();
    let block = model.units()[1].numel as f64;
    let hardware = tokens * (l * 4.0 * (2.0 * block + 2.0 * s * c) + 6.0 * v * c);
    assert!(close(t.hardware_flops_per_gpu_step, hardware));
    assert!(close(
        t.model_flops_per_gpu_step,
        tokens * model.flops_per_token(1024)
    ));
    assert!(t.hardware_flops_per_gpu_step > t.model_flops_per_gpu_step);
}

/// Recomputing the attention half runs q|k|v's projection and the attention again, not the
/// whole block: between no recomputation and the full one.
#[test]
fn the_attention_half_recomputes_q_k_v_and_the_attention() {
    let cfg = ModelConfig::llama(4, 256, 8, 2, 768, 128, 1000, true);
    let model = Model::new(cfg.clone()).unwrap();
    let (block, s, c) = (model.units()[1].numel as f64, 128.0, 256.0);
    let qkv = (c * (8.0 + 2.0 * 2.0) * 32.0) as f64;
    let tokens = (2 * 128) as f64;
    let flops = |mode| Workload::bf16(&model, 2, 1, mode).hardware_flops_per_micro_batch();
    let (off, full, half) = (
        flops(Recompute::Off),
        flops(Recompute::Full),
        flops(Recompute::Attention),
    );
    assert!(close(
        full - off,
        tokens * 4.0 * (2.0 * block + 2.0 * s * c)
    ));
    assert!(close(half - off, tokens * 4.0 * (2.0 * qkv + 2.0 * s * c)));
    assert!(off < half && half < full);
}

/// The walk is the engine's: GPT-2's order `[0, 1, .., n-1, 0, n-1, .., 1]` then the embedding's
/// backward, ungathered; every unit reduced once. Under hpZ the backward gathers come from the
/// node, but with a prefetch deeper than 2 the final norm's backward gather (position n + 1) is
/// issued before its forward gather (position n - 1) was waited, and crosses nodes.
#[test]
fn the_walk_follows_the_engines_order_and_hpz_rule() {
    let model = Model::new(ModelConfig::gpt2(3, 64, 4, 32, 100)).unwrap();
    let n = model.units().len();
    let work = Workload::bf16(&model, 1, 1, Recompute::Off);
    let c = cluster(2, 4, 80.0);
    let comm = vec![
        UnitComm {
            world_gather: 1.0,
            node_gather: 0.25,
            reduce: 0.5,
        };
        n
    ];
    let cfg = |depth| ZeroConfig {
        hpz_partition_size: 4,
        prefetch_depth: depth,
        ..Default::default()
    };
    for (depth, norm_gather) in [(2, 0.25), (3, 1.0)] {
        let p = plan(cfg(depth), 2, 4);
        let slots = work.walk(&p, &comm, true, &c);
        assert_eq!(slots.len(), 2 * n + 1);
        let gathers: Vec<f64> = slots.iter().filter_map(|s| s.gather_s).collect();
        assert_eq!(gathers[..n], vec![1.0; n][..], "forward from the world");
        assert_eq!(gathers[n], 0.25, "the head's gather of the embedding");
        assert_eq!(gathers[n + 1], norm_gather, "depth {depth}");
        assert!(gathers[n + 2..].iter().all(|&g| g == 0.25));
        assert_eq!(slots.iter().filter(|s| s.reduce_s.is_some()).count(), n);
        assert_eq!(slots[2 * n].gather_s, None);
        // A later micro-batch gathers everything from the node.
        let later = work.walk(&p, &comm, false, &c);
        assert!(later.iter().filter_map(|s| s.gather_s).all(|g| g == 0.25));
    }
}

/// One rank reduces nothing (the scaled gradient is its shard), with or without qgZ; qwZ still
/// quantises and dequantises its gathers, as the engine does.
#[test]
fn one_rank_reduces_nothing() {
    let c = cluster(1, 1, 80.0);
    let pp = plan(zeropp_on_one(), 1, 1);
    let j = unit_comm(&pp, &unit_payload(&pp, 0, 32768, 2), &c);
    assert_eq!(j.reduce, 0.0);
    assert!(close(j.world_gather, (32768.0 * 3.0 + 64.0) / 1e12));
}

fn zeropp_on_one() -> ZeroConfig {
    ZeroConfig {
        hpz_partition_size: 1,
        ..zeropp()
    }
}

/// Untied Llama: the last unit holds the head, so its forward slot runs the norm, the head's
/// forward and backward, and submits its reduction; the order is `[0, .., n-1, n-2, .., 1]`,
/// then the embedding's backward, ungathered.
#[test]
fn an_untied_head_runs_in_the_last_units_slot() {
    let model = Model::new(ModelConfig::llama(2, 64, 4, 2, 160, 32, 100, false)).unwrap();
    let n = model.units().len();
    let work = Workload::bf16(&model, 3, 1, Recompute::Full);
    let c = cluster(2, 4, 80.0);
    let comm = vec![
        UnitComm {
            world_gather: 1.0,
            node_gather: 1.0,
            reduce: 0.5,
        };
        n
    ];
    let slots = work.walk(&plan(ZeroConfig::default(), 2, 4), &comm, true, &c);
    assert_eq!(slots.len(), n + (n - 2) + 1);
    let reducing: Vec<usize> = (0..slots.len())
        .filter(|&k| slots[k].reduce_s.is_some())
        .collect();
    assert_eq!(reducing[0], n - 1, "the head's unit reduces first");
    assert_eq!(reducing.len(), n);
    // The head's 6 V C a token, at 100 TFLOP/s x 0.5, for 3 x 32 tokens.
    let head = 6.0 * 100.0 * 64.0 * 96.0 / 50e12;
    assert!(close(slots[n - 1].compute_s, head), "{:?}", slots[n - 1]);
    let total: f64 = slots.iter().map(|s| s.compute_s).sum();
    assert!(close(total, work.hardware_flops_per_micro_batch() / 50e12));
}

/// FP8 compute: the GEMMs' share of a block's linear layers (`2 x numel` a token) runs
/// `FP8_GEMM_SPEEDUP` times faster and the rest of their time does not change, its attention
/// (`2 T C`) runs at the dense rate, forward and backward, and its FP8 casts at
/// `FP8_CAST_BANDWIDTH_FRACTION` of the memory bandwidth; the embedding and the head are
/// unchanged, and so are the FLOPs counted.
#[test]
fn fp8_speeds_up_the_gemms_of_the_blocks_linear_layers() {
    let cfg = ModelConfig::gpt2(2, 256, 4, 128, 1000);
    let dense = Model::new(cfg.clone()).unwrap();
    let fp8 = Model::new(cfg).unwrap().with_linears(LinearFormat::Fp8);
    let c = cluster(1, 1, 80.0);
    let (wd, w8) = (
        Workload::bf16(&dense, 2, 1, Recompute::Full),
        Workload::bf16(&fp8, 2, 1, Recompute::Full),
    );
    let tokens = 2.0 * 128.0;
    let block = dense.units()[1].numel as f64;
    let (linear, attention) = (2.0 * block, 2.0 * 128.0 * 256.0);
    // 100 TFLOP/s x 0.5 in all, the GEMMs alone 100 TFLOP/s x 0.7: of a FLOP's 1 / 50e12 s,
    // the GEMM's 1 / 70e12 runs 1.63x faster in FP8 and the rest does not change.
    let dense_rate = 100e12 * 0.5;
    let gemm_s = 1.0 / (100e12 * 0.7);
    let fp8_s_per_flop = gemm_s / 1.63 + (1.0 / dense_rate - gemm_s);
    assert!(close(
        wd.forward_s(1, false, &c),
        tokens * (linear + attention) / dense_rate
    ));
    // The casts of GPT-2's block, by hand: inputs ln_1, ln_2 (256 each) and gelu(h) (1024) kept
    // as codes (both ways in the forward, 4 bytes, none in the backward) and attn.c_proj's 256
    // not (3 bytes each way), outputs 768 + 256 + 1024 + 256 = 2304, 786,432 weights;
    // 1000 GB/s, 0.7 of it reached.
    let weights = 3.0 * 786_432.0;
    let cast_fwd = (tokens * (4.0 * 1536.0 + 3.0 * 256.0) + weights) / 0.7e12;
    let cast_bwd = (tokens * (3.0 * 256.0 + 4.0 * 2304.0) + weights) / 0.7e12;
    let fp8_compute = tokens * (linear * fp8_s_per_flop + attention / dense_rate);
    assert!(close(w8.forward_s(1, false, &c), fp8_compute + cast_fwd));
    // Recomputation: the backward is three forwards' worth, and its casts the forward's again.
    assert!(close(
        w8.backward_s(1, false, &c),
        3.0 * fp8_compute + cast_bwd + cast_fwd
    ));
    // Under FP8 qwZ the weights arrive as codes: transposed in the forward (2 bytes a
    // parameter, not 3), read as they are in the backward.
    let params = 786_432.0;
    assert!(close(
        w8.forward_s(1, true, &c),
        fp8_compute + cast_fwd - params / 0.7e12
    ));
    assert!(close(
        w8.backward_s(1, true, &c),
        3.0 * fp8_compute + cast_bwd - 3.0 * params / 0.7e12 + cast_fwd - params / 0.7e12
    ));
    assert!(close(w8.head_s(&c), wd.head_s(&c)));
    assert!(close(w8.forward_s(0, false, &c), 0.0));
    assert!(close(
        w8.hardware_flops_per_micro_batch(),
        wd.hardware_flops_per_micro_batch()
    ));
    let plan = ZeroPlan::resolve(&ZeroConfig::default(), c.topology, 10).unwrap();
    // At 256 wide the casts cost more than the GEMMs gain (gpt350m measured the same sign).
    assert!(predict(&w8, &plan, &c).step_s > predict(&wd, &plan, &c).step_s);
}
