//! Every collective on every group against exact expected values, for any [`Communicator`] on
//! any device: the NCCL world-of-one test runs it, and so does the multi-GPU test below, one rank
//! per GPU and thread, against the local backend on the CPU (results and byte counters).

use std::error::Error;

use candle_core::cuda_backend::cudarc::driver::CudaContext;
use candle_core::{DType, Device, Tensor};
use comm::{run_local, ByteCounters, Communicator, Group, NcclComm, NcclIds, Topology};

pub type TestError = Box<dyn Error + Send + Sync>;

const GROUPS: [Group; 3] = [Group::World, Group::IntraNode, Group::InterNode];
/// Elements per member (per chunk for all-to-all and reduce-scatter).
const C: usize = 6;

/// Element i of world rank r's gather and broadcast input: exact in u8 and bf16.
fn gather_value(r: usize, i: usize) -> f32 {
    ((r * 31 + i * 7 + 1) % 256) as f32
}

/// Element k of the chunk world rank r sends to group rank j in an all-to-all.
fn a2a_value(r: usize, j: usize, k: usize) -> f32 {
    ((r * 17 + j * 5 + k + 3) % 256) as f32
}

/// Element i of world rank r's reduction input: small integers, so sums are exact in bf16.
fn reduce_value(r: usize, i: usize) -> f32 {
    ((r + 2 * i) % 7 + 1) as f32
}

fn tensor(values: Vec<f32>, dtype: DType, device: &Device) -> Result<Tensor, TestError> {
    let n = values.len();
    Ok(Tensor::from_vec(values, n, &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)?)
}

fn values(t: &Tensor) -> Result<Vec<f32>, TestError> {
    Ok(t.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// Runs every collective on every group of `comm` with buffers on `device` (U8, BF16 and F32
/// moves, BF16 and F32 sums), asserts each result exactly, and returns them all as f32 vectors.
pub fn exercise(comm: &dyn Communicator, device: &Device) -> Result<Vec<Vec<f32>>, TestError> {
    let t = comm.topology();
    let r = comm.rank();
    let mut out = Vec::new();
    let mut check = |what: String, got: Tensor, dtype: DType, want: Vec<f32>| {
        assert!(
            got.device().same_device(device),
            "{what}: result moved device"
        );
        assert_eq!(got.dtype(), dtype, "{what}: dtype");
        let got = values(&got)?;
        assert_eq!(got, want, "{what} (rank {r})");
        out.push(got);
        Ok::<(), TestError>(())
    };
    for g in GROUPS {
        let members = t.members(g, r);
        let n = members.len();
        let me = t.group_rank(g, r);
        for dtype in [DType::U8, DType::BF16, DType::F32] {
            let mine = tensor((0..C).map(|i| gather_value(r, i)).collect(), dtype, device)?;
            let want = members
                .iter()
                .flat_map(|&m| (0..C).map(move |i| gather_value(m, i)))
                .collect();
            let got = comm.all_gather(g, mine.clone()).wait()?;
            check(format!("all_gather {g:?} {dtype:?}"), got, dtype, want)?;

            let root = n - 1;
            let want = (0..C).map(|i| gather_value(members[root], i)).collect();
            let got = comm.broadcast(g, root, mine).wait()?;
            check(format!("broadcast {g:?} {dtype:?}"), got, dtype, want)?;

            let send = (0..n)
                .flat_map(|j| (0..C).map(move |k| a2a_value(r, j, k)))
                .collect();
            let want = members
                .iter()
                .flat_map(|&m| (0..C).map(move |k| a2a_value(m, me, k)))
                .collect();
            let got = comm.all_to_all(g, tensor(send, dtype, device)?).wait()?;
            check(format!("all_to_all {g:?} {dtype:?}"), got, dtype, want)?;
        }
        for dtype in [DType::BF16, DType::F32] {
            let send: Vec<f32> = (0..C * n).map(|i| reduce_value(r, i)).collect();
            let sum = |i: usize| members.iter().map(|&m| reduce_value(m, i)).sum::<f32>();
            let got = comm
                .reduce_scatter(g, tensor(send.clone(), dtype, device)?)
                .wait()?;
            let want = (0..C).map(|k| sum(me * C + k)).collect();
            check(format!("reduce_scatter {g:?} {dtype:?}"), got, dtype, want)?;

            let got = comm.all_reduce(g, tensor(send, dtype, device)?).wait()?;
            let want = (0..C * n).map(sum).collect();
            check(format!("all_reduce {g:?} {dtype:?}"), got, dtype, want)?;
        }
        comm.barrier(g).wait()?;
    }
    out.extend(exercise_jobs(comm, device)?);
    Ok(out)
}

/// One job per group on `comm`'s communication side ([`comm::Job`]): my contribution copied into
/// my slot of an output buffer and gathered in place (U8, BF16, F32), an all-to-all, a
/// reduce-scatter into a second output, and qwZ's chain (quantise into my slot on the lane's
/// place, gather codes and scales in place, dequantise into a third output); asserts each
/// result exactly and returns them as f32 vectors. The values are those of [`exercise`]; the
/// qwZ chain's expected values come from the CPU reference.
pub fn exercise_jobs(comm: &dyn Communicator, device: &Device) -> Result<Vec<Vec<f32>>, TestError> {
    const BLOCK: usize = 32;
    let t = comm.topology();
    let r = comm.rank();
    let mut out = Vec::new();
    for g in GROUPS {
        let members = t.members(g, r);
        let n = members.len();
        let me = t.group_rank(g, r);
        for dtype in [DType::U8, DType::BF16, DType::F32] {
            let mine = tensor((0..C).map(|i| gather_value(r, i)).collect(), dtype, device)?;
            let send = (0..n)
                .flat_map(|j| (0..C).map(move |k| a2a_value(r, j, k)))
                .collect();
            let reduce: Vec<f32> = (0..C * n).map(|i| reduce_value(r, i)).collect();
            // qwZ's chain: BLOCK f32 values a member, quantised and dequantised.
            let weights: Vec<f32> = (0..BLOCK)
                .map(|i| (i as f32 - 13.5) * 0.37 + r as f32)
                .collect();
            let inputs = vec![
                mine,
                tensor(send, dtype, device)?,
                tensor(reduce, DType::F32, device)?,
                tensor(weights, DType::F32, device)?,
            ];
            let outputs = vec![(dtype, C * n), (DType::F32, C), (DType::F32, BLOCK * n)];
            let job = comm::Job {
                label: "exercise",
                device: device.clone(),
                inputs,
                outputs,
                run: Box::new(move |lane, inputs, outputs| {
                    let e = |e: zero::ZeroError| comm::CommError::in_job("exercise", e);
                    let q = |e: quant::QuantError| comm::CommError::in_job("exercise", e);
                    let place = lane.place().clone();
                    let [buf, rs_out, deq]: [Tensor; 3] = outputs.try_into().expect("3 outputs");
                    zero::shard_passes::copy_into(&place, &inputs[0], 0, C, &buf, me * C)
                        .map_err(e)?;
                    let gathered = lane.all_gather_in_place(g, &buf)?;
                    let a2a = lane.all_to_all(g, &inputs[1])?;
                    let reduced = lane.reduce_scatter_into(g, &inputs[2], &rs_out)?;
                    let codes = lane.alloc(DType::U8, BLOCK * n)?;
                    let scales = lane.alloc(DType::F32, n)?;
                    quant::tensor::quantize_int8_into(
                        &inputs[3],
                        BLOCK,
                        &codes,
                        &scales,
                        me * BLOCK,
                        &place,
                    )
                    .map_err(q)?;
                    let codes = lane.all_gather_in_place(g, &codes)?;
                    let scales = lane.all_gather_in_place(g, &scales)?;
                    let deq =
                        quant::tensor::dequantize_int8_into(&codes, &scales, BLOCK, &deq, &place)
                            .map_err(q)?;
                    Ok(vec![gathered, a2a, reduced, deq])
                }),
            };
            let got = comm.submit(job).wait()?;
            let [gathered, a2a, reduced, deq]: [Tensor; 4] =
                got.try_into().map_err(|_| "a job returns 4 tensors")?;
            let want: Vec<f32> = members
                .iter()
                .flat_map(|&m| (0..C).map(move |i| gather_value(m, i)))
                .collect();
            assert_eq!(gathered.dtype(), dtype);
            assert_eq!(
                values(&gathered)?,
                want,
                "job all_gather {g:?} {dtype:?} (rank {r})"
            );
            let want: Vec<f32> = members
                .iter()
                .flat_map(|&m| (0..C).map(move |k| a2a_value(m, me, k)))
                .collect();
            assert_eq!(
                values(&a2a)?,
                want,
                "job all_to_all {g:?} {dtype:?} (rank {r})"
            );
            let want: Vec<f32> = (0..C)
                .map(|k| members.iter().map(|&m| reduce_value(m, me * C + k)).sum())
                .collect();
            assert_eq!(
                values(&reduced)?,
                want,
                "job reduce_scatter {g:?} (rank {r})"
            );
            let want: Vec<f32> = members
                .iter()
                .flat_map(|&m| {
                    let w: Vec<f32> = (0..BLOCK)
                        .map(|i| (i as f32 - 13.5) * 0.37 + m as f32)
                        .collect();
                    let (c, s) = quant::quantize_int8(&w, BLOCK).expect("CPU reference");
                    quant::dequantize_int8(&c, &s, BLOCK)
                })
                .collect();
            assert_eq!(values(&deq)?, want, "job qwZ chain {g:?} (rank {r})");
            for t in [gathered, a2a, reduced, deq] {
                out.push(values(&t)?);
            }
        }
    }
    Ok(out)
}

/// One rank of an in-process NCCL world on GPU `ordinal`: joins with the ids rank 0 made,
/// runs [`exercise`], and returns its results and byte counters.
pub fn run_rank(
    rank: usize,
    ordinal: usize,
    topology: Topology,
    ids: &[u8],
) -> Result<(Vec<Vec<f32>>, ByteCounters), TestError> {
    let device = Device::new_cuda(ordinal)?;
    let ids = NcclIds::from_bytes(ids, topology)?;
    let comm = NcclComm::new(device.as_cuda_device()?, topology, rank, &ids)?;
    let results = exercise(&comm, &device)?;
    Ok((results, comm.counters()))
}

/// One NCCL rank per visible GPU (two "nodes" when the count is even), every collective on
/// every group: the results and counters equal the local backend's on the CPU. Passes without
/// checking anything on a machine with fewer than two GPUs.
#[test]
fn nccl_every_gpu_one_rank_per_thread_equals_local() {
    let gpus = CudaContext::device_count().expect("CUDA device count") as usize;
    if gpus < 2 {
        eprintln!("nccl_every_gpu_one_rank_per_thread_equals_local: {gpus} GPU, nothing to check");
        return;
    }
    let per_node = if gpus.is_multiple_of(2) {
        gpus / 2
    } else {
        gpus
    };
    let topology = Topology::new(gpus, per_node).unwrap();
    let ids = NcclIds::new(topology).unwrap().to_bytes();
    let nccl: Vec<_> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..gpus)
            .map(|rank| {
                let ids = &ids;
                s.spawn(move || run_rank(rank, rank, topology, ids).expect("an NCCL rank"))
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let local = run_local(topology, |c| {
        exercise(&c, &Device::Cpu).map(|results| (results, c.counters()))
    })
    .unwrap();
    for (rank, ((got, got_bytes), (want, want_bytes))) in nccl.iter().zip(&local).enumerate() {
        assert_eq!(got, want, "rank {rank}: results");
        assert_eq!(got_bytes, want_bytes, "rank {rank}: byte counters");
    }
}

/// The emulated slow link ([`comm::link`]): over 2 GPUs as 2 nodes x 1, an all-gather of 32 MiB a
/// rank at 8 Gb/s (1 GB/s a rank) completes no sooner than its 33.5 ms on that link, and still
/// gathers the right data; an intra-node all-gather (no cross-node bytes) is not held. Passes
/// without checking anything on a machine with fewer than two GPUs.
#[test]
fn emulated_link_holds_cross_node_collectives() {
    let gpus = CudaContext::device_count().expect("CUDA device count") as usize;
    if gpus < 2 {
        eprintln!("emulated_link_holds_cross_node_collectives: {gpus} GPU, nothing to check");
        return;
    }
    const N: usize = 8 << 20; // f32 elements a rank: 32 MiB
    let topology = Topology::new(2, 1).unwrap();
    let link = comm::link::EmulatedLink::per_node(8.0, 1).unwrap();
    let want_hold = link.hold((N * 4) as u64);
    let ids = NcclIds::new(topology).unwrap().to_bytes();
    let held: Vec<_> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let ids = &ids;
                s.spawn(move || -> Result<_, TestError> {
                    let device = Device::new_cuda(rank)?;
                    let ids = NcclIds::from_bytes(ids, topology)?;
                    let comm = NcclComm::new(device.as_cuda_device()?, topology, rank, &ids)?;
                    comm.set_emulated_link(Some(link))?;
                    let send = Tensor::full(rank as f32, N, &device)?;
                    // Warm-up (NCCL's first collective sets up its channels), then timed.
                    comm.all_gather(Group::World, send.clone()).wait()?;
                    comm.all_gather(Group::IntraNode, send.clone()).wait()?;
                    device.synchronize()?;
                    let start = std::time::Instant::now();
                    let out = comm.all_gather(Group::World, send.clone()).wait()?;
                    let sum = out.sum_all()?.to_scalar::<f32>()?;
                    let world = start.elapsed();
                    let start = std::time::Instant::now();
                    comm.all_gather(Group::IntraNode, send)
                        .wait()?
                        .sum_all()?
                        .to_scalar::<f32>()?;
                    let intra = start.elapsed();
                    Ok((world, intra, sum))
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap().expect("an NCCL rank"))
            .collect()
    });
    for (rank, (world, intra, sum)) in held.into_iter().enumerate() {
        assert_eq!(sum, N as f32, "rank {rank}: gathered 0s and 1s");
        assert!(
            world >= want_hold,
            "rank {rank}: world all-gather took {world:?} < {want_hold:?}"
        );
        assert!(
            intra < want_hold,
            "rank {rank}: the intra-node gather was held ({intra:?})"
        );
    }
}
