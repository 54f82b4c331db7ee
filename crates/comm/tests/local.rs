//! The local backend (and `Solo`) against exact expected values, on nonzero rank-dependent data.

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};

use comm::{
    bytes_to_f32, f32_to_bytes, local_world, local_world_with_timeout, run_local, ByteCounters,
    CommError, Communicator, Group, HostCollectives, LocalRunError, Solo, Topology,
};

const GROUPS: [Group; 3] = [Group::World, Group::IntraNode, Group::InterNode];

fn topo(world: usize, per_node: usize) -> Topology {
    Topology::new(world, per_node).expect("a valid test topology")
}

/// Byte i of world rank r's all-gather contribution.
fn gather_byte(r: usize, i: usize) -> u8 {
    (r * 31 + i * 7 + 1) as u8
}

/// Byte k of the chunk world rank r sends to group rank j in an all-to-all.
fn a2a_byte(r: usize, j: usize, k: usize) -> u8 {
    (r * 17 + j * 5 + k + 3) as u8
}

/// Element i of world rank r's reduction input: exact in f32 for the sizes here.
fn value(r: usize, i: usize) -> f32 {
    (r * 1000 + i) as f32 + 0.5
}

/// Runs every collective on every group of `comm` and checks the exact results.
fn check_every_collective(comm: &dyn Communicator) -> Result<(), CommError> {
    let t = comm.topology();
    let r = comm.rank();
    for g in GROUPS {
        let members = t.members(g, r);
        let n = members.len();
        let me = t.group_rank(g, r);

        let send: Vec<u8> = (0..5).map(|i| gather_byte(r, i)).collect();
        let got = comm.all_gather_bytes(g, send).wait()?;
        let want: Vec<u8> = members
            .iter()
            .flat_map(|&m| (0..5).map(move |i| gather_byte(m, i)))
            .collect();
        assert_eq!(got, want, "all_gather {g:?} rank {r}");

        let c = 3;
        let send: Vec<u8> = (0..n)
            .flat_map(|j| (0..c).map(move |k| a2a_byte(r, j, k)))
            .collect();
        let got = comm.all_to_all_bytes(g, send).wait()?;
        let want: Vec<u8> = members
            .iter()
            .flat_map(|&m| (0..c).map(move |k| a2a_byte(m, me, k)))
            .collect();
        assert_eq!(got, want, "all_to_all {g:?} rank {r}");

        let c = 4;
        let send: Vec<f32> = (0..n * c).map(|i| value(r, i)).collect();
        let got = comm.reduce_scatter_f32(g, send).wait()?;
        let want: Vec<f32> = (me * c..(me + 1) * c)
            .map(|i| members.iter().map(|&m| value(m, i)).sum())
            .collect();
        assert_eq!(got, want, "reduce_scatter {g:?} rank {r}");

        let send: Vec<f32> = (0..7).map(|i| value(r, i)).collect();
        let got = comm.all_reduce_f32(g, send).wait()?;
        let want: Vec<f32> = (0..7)
            .map(|i| members.iter().map(|&m| value(m, i)).sum())
            .collect();
        assert_eq!(got, want, "all_reduce {g:?} rank {r}");

        let root = n - 1;
        let send: Vec<u8> = (0..6).map(|i| gather_byte(r, i)).collect();
        let got = comm.broadcast_bytes(g, root, send).wait()?;
        let want: Vec<u8> = (0..6).map(|i| gather_byte(members[root], i)).collect();
        assert_eq!(got, want, "broadcast {g:?} rank {r}");

        comm.barrier(g).wait()?;
    }
    Ok(())
}

#[test]
fn every_collective_on_every_group_is_exact() {
    for (world, per_node) in [(8, 4), (1, 1), (6, 2), (6, 3)] {
        run_local(topo(world, per_node), |comm| check_every_collective(&comm))
            .unwrap_or_else(|e| panic!("{world} ranks, {per_node} per node: {e:?}"));
    }
    check_every_collective(&Solo).expect("Solo");
}

#[test]
fn byte_round_trip() {
    let v = [0.0f32, -1.5, f32::MAX, f32::MIN_POSITIVE, 3.25e-7];
    let b = f32_to_bytes(&v);
    assert_eq!(b.len(), 20);
    assert_eq!(&b[4..8], &(-1.5f32).to_le_bytes());
    assert_eq!(bytes_to_f32(&b), v);
}

#[path = "support/noisy.rs"]
mod support;
use support::{mix, noisy};

#[test]
fn reductions_are_bitwise_deterministic_whatever_the_timing() {
    let t = topo(8, 4);
    let len = 8 * 257;
    let run = |trial: u64| {
        run_local(t, |comm| {
            let r = comm.rank();
            let mut out = Vec::new();
            for call in 0..6 {
                let sleep = mix(trial * 1000 + (r * 10 + call) as u64) % 3000;
                std::thread::sleep(Duration::from_micros(sleep));
                let g = if call % 2 == 0 {
                    Group::World
                } else {
                    Group::IntraNode
                };
                let v = comm.reduce_scatter_f32(g, noisy(r, call, len)).wait()?;
                out.extend(v.iter().map(|x| x.to_bits()));
            }
            let v = comm.all_reduce_f32(Group::World, noisy(r, 99, 33)).wait()?;
            out.extend(v.iter().map(|x| x.to_bits()));
            Ok::<_, CommError>(out)
        })
        .expect("a run without failures")
    };
    let first = run(0);
    for trial in 1..5 {
        assert_eq!(run(trial), first, "trial {trial} differs from trial 0");
    }
    // And it is the sum in group-rank order: rank 5's first World slice.
    let c = len / 8;
    let want: Vec<u32> = (5 * c..6 * c)
        .map(|i| {
            let mut s = noisy(0, 0, len)[i];
            for m in 1..8 {
                s += noisy(m, 0, len)[i];
            }
            s.to_bits()
        })
        .collect();
    assert_eq!(&first[5][..c], &want[..]);
}

#[test]
fn collectives_issued_before_any_wait_complete_in_order() {
    let t = topo(8, 4);
    run_local(t, |comm| {
        let r = comm.rank();
        let node = t.node_of(r);
        let local = t.local_rank(r);
        // Issue five collectives on three groups, then wait in reverse order.
        let a = comm.all_gather_bytes(Group::World, vec![r as u8; 2]);
        let b = comm.all_to_all_bytes(
            Group::IntraNode,
            (0..4).map(|j| (r * 4 + j) as u8).collect(),
        );
        let c = comm.all_gather_bytes(Group::World, vec![100 + r as u8]);
        let d = comm.reduce_scatter_f32(Group::InterNode, vec![r as f32, 1.0]);
        let e = comm.all_reduce_f32(Group::IntraNode, vec![r as f32]);
        let e = e.wait()?;
        let d = d.wait()?;
        let c = c.wait()?;
        let b = b.wait()?;
        let a = a.wait()?;
        assert_eq!(a, (0..8u8).flat_map(|m| [m, m]).collect::<Vec<_>>());
        let peers = node * 4..node * 4 + 4;
        assert_eq!(
            b,
            peers
                .clone()
                .map(|m| (m * 4 + local) as u8)
                .collect::<Vec<_>>()
        );
        assert_eq!(c, (100..108u8).collect::<Vec<_>>());
        let inter_sum = (local + local + 4) as f32;
        assert_eq!(d, vec![if node == 0 { inter_sum } else { 2.0 }]);
        assert_eq!(e, vec![peers.map(|m| m as f32).sum::<f32>()]);
        Ok::<_, CommError>(())
    })
    .expect("a run without failures");
}

#[test]
fn a_failing_rank_is_reported_at_once() {
    let t = topo(8, 4);
    let start = Instant::now();
    let result = run_local(t, |comm| {
        if comm.rank() == 3 {
            std::thread::sleep(Duration::from_millis(100));
            return Err("rank three broke".to_string());
        }
        comm.all_gather_bytes(Group::World, vec![1; 16])
            .wait()
            .map_err(|e| e.to_string())?;
        Ok(())
    });
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    match result {
        Err(LocalRunError::Failed { rank: 3, source }) => {
            assert_eq!(source.to_string(), "rank three broke")
        }
        other => panic!("expected rank 3's own error, got {other:?}"),
    }
}

#[test]
fn a_panicking_rank_is_reported_at_once() {
    let t = topo(8, 4);
    let start = Instant::now();
    let result = run_local(t, |comm| {
        if comm.rank() == 5 {
            std::thread::sleep(Duration::from_millis(100));
            panic!("rank five exploded");
        }
        comm.all_gather_bytes(Group::World, vec![1; 16]).wait()?;
        Ok::<_, CommError>(())
    });
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    match result {
        Err(LocalRunError::Panicked { rank: 5, message }) => {
            assert_eq!(message, "rank five exploded")
        }
        other => panic!("expected rank 5's panic, got {other:?}"),
    }
}

#[test]
fn peers_see_the_abort_with_its_rank_and_reason() {
    let comms = local_world(topo(4, 2));
    let pending: Vec<_> = comms[..3]
        .iter()
        .map(|c| c.all_gather_bytes(Group::World, vec![0; 4]))
        .collect();
    comms[3].abort("out of memory".into());
    for p in pending {
        match p.wait() {
            Err(e @ CommError::Aborted { rank: 3, .. }) => {
                assert_eq!(e.to_string(), "rank 3 failed: out of memory")
            }
            other => panic!("expected Aborted by rank 3, got {other:?}"),
        }
    }
    // Future collectives fail too, on every rank and group.
    assert!(matches!(
        comms[0].barrier(Group::IntraNode).wait(),
        Err(CommError::Aborted { rank: 3, .. })
    ));
}

#[test]
fn a_dropped_communicator_does_not_hang_its_peers() {
    let mut comms = local_world(topo(4, 2));
    let pending = comms[0].all_gather_bytes(Group::World, vec![0; 4]);
    drop(comms.remove(3));
    match pending.wait() {
        Err(CommError::Aborted { rank: 3, .. }) => {}
        other => panic!("expected Aborted naming rank 3, got {other:?}"),
    }
    // A group without rank 3 still works.
    let a = comms[0].all_reduce_f32(Group::IntraNode, vec![1.0]);
    let b = comms[1].all_reduce_f32(Group::IntraNode, vec![2.0]);
    assert_eq!(a.wait().expect("node 0 is intact"), vec![3.0]);
    assert_eq!(b.wait().expect("node 0 is intact"), vec![3.0]);
}

#[test]
fn a_missing_peer_times_out() {
    let comms = local_world_with_timeout(topo(2, 2), Duration::from_millis(200));
    match comms[0].barrier(Group::World).wait() {
        Err(CommError::Timeout { rank: 0, .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn disagreeing_members_all_fail() {
    let comms = local_world(topo(4, 2));
    let pending: Vec<_> = comms
        .iter()
        .map(|c| c.all_gather_bytes(Group::World, vec![0; 4 + (c.rank() == 2) as usize]))
        .collect();
    for p in pending {
        assert!(matches!(p.wait(), Err(CommError::Mismatch { .. })));
    }
    let pending: Vec<_> = comms
        .iter()
        .map(|c| c.reduce_scatter_f32(Group::IntraNode, vec![0.0; 3]))
        .collect();
    for p in pending {
        assert!(matches!(
            p.wait(),
            Err(CommError::Indivisible { parts: 2, .. })
        ));
    }
    // Same length, another dtype: every member fails alike.
    let pending: Vec<_> = comms
        .iter()
        .map(|c| {
            let dtype = if c.rank() == 1 {
                DType::BF16
            } else {
                DType::F32
            };
            c.all_gather(Group::World, Tensor::zeros(4, dtype, &Device::Cpu).unwrap())
        })
        .collect();
    for p in pending {
        match p.wait() {
            Err(CommError::Mismatch { ours, theirs, .. }) => {
                assert!(
                    ours.contains("BF16") || theirs.contains("BF16"),
                    "{ours} / {theirs}"
                )
            }
            other => panic!("expected a dtype mismatch, got {other:?}"),
        }
    }
    // The world is still usable afterwards.
    let pending: Vec<_> = comms.iter().map(|c| c.barrier(Group::World)).collect();
    for p in pending {
        p.wait().expect("a barrier after failed collectives");
    }
}

/// After all_gather(s bytes), all_to_all(n x c bytes), reduce_scatter(n x k f32),
/// all_reduce(l f32) and broadcast(b bytes from group rank 1), a barrier on every group.
fn run_sequence(comm: &dyn Communicator) -> Result<ByteCounters, CommError> {
    let t = comm.topology();
    for g in GROUPS {
        let n = t.group_size(g);
        comm.all_gather_bytes(g, vec![1; 12]).wait()?;
        comm.all_to_all_bytes(g, vec![2; n * 5]).wait()?;
        comm.reduce_scatter_f32(g, vec![3.0; n * 7]).wait()?;
        comm.all_reduce_f32(g, vec![4.0; 9]).wait()?;
        comm.broadcast_bytes(g, 1.min(n - 1), vec![5; 11]).wait()?;
        comm.barrier(g).wait()?;
    }
    Ok(comm.counters())
}

#[test]
fn counters_equal_the_logical_formulas() {
    // 2 nodes x 4: a rank has 3 peers on its node and 4 off it in the world, 3 on it in its
    // node, 1 off it in its inter-node group.
    let (s, c, k, l, b) = (12, 5, 7 * 4, 9 * 4, 11);
    let got = run_local(topo(8, 4), |comm| run_sequence(&comm)).expect("no failures");
    for (r, got) in got.into_iter().enumerate() {
        // Group rank 1 roots the broadcast: world rank 1; local rank 1; node 1.
        let (world_root, intra_root, inter_root) = (r == 1, r % 4 == 1, r / 4 == 1);
        let want = ByteCounters {
            intra: 3 * (s + c + k + l)
                + 3 * (s + c + k + l)
                + if world_root { 3 * b } else { 0 }
                + if intra_root { 3 * b } else { 0 },
            inter: 4 * (s + c + k + l)
                + (s + c + k + l)
                + if world_root { 4 * b } else { 0 }
                + if inter_root { b } else { 0 },
        };
        assert_eq!(got, want, "rank {r}");
        assert_eq!(got - got, ByteCounters::default());
    }
    // And the all_gather example of the design: intra = 3s, inter = 4s.
    let got = run_local(topo(8, 4), |comm| {
        let before = comm.counters();
        comm.all_gather_bytes(Group::World, vec![0; 1000]).wait()?;
        Ok::<_, CommError>(comm.counters() - before)
    })
    .expect("no failures");
    assert!(got.iter().all(|c| *c
        == ByteCounters {
            intra: 3000,
            inter: 4000
        }));
    // One rank counts nothing.
    assert_eq!(run_sequence(&Solo).expect("Solo"), ByteCounters::default());
}

#[test]
fn handles_are_shareable_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<comm::Pending<Vec<u8>>>();
    send_sync::<comm::LocalComm>();
    send_sync::<Solo>();
}

#[test]
fn timed_counts_the_time_spent_waiting_for_a_late_peer() {
    let comms = local_world(topo(2, 2));
    let mut comms = comms.into_iter();
    let (first, second) = (comms.next().unwrap(), comms.next().unwrap());
    let timed = comm::Timed::new(Box::new(first));
    let clock = timed.clock();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            second.barrier(Group::World).wait().unwrap();
        });
        let pending = timed.barrier(Group::World);
        assert_eq!(clock.seconds(), 0.0, "issuing does not wait");
        pending.wait().unwrap();
    });
    assert!(clock.seconds() >= 0.15, "waited {} s", clock.seconds());
    assert_eq!(timed.rank(), 0);
}

/// A job ([`comm::Job`]) that gathers `mine` in place, exchanges `send` all-to-all and reduces
/// `reduce` into an output, over `group`: what the engine's gathers and reductions do.
fn collectives_job(
    group: Group,
    mine: Tensor,
    send: Tensor,
    reduce: Tensor,
    n: usize,
    me: usize,
) -> comm::Job {
    let (len, chunk) = (mine.elem_count(), reduce.elem_count() / n);
    comm::Job {
        label: "collectives",
        device: Device::Cpu,
        inputs: vec![mine, send, reduce],
        outputs: vec![(DType::U8, len * n), (DType::F32, chunk)],
        run: Box::new(move |lane, inputs, outputs| {
            let (buf, out) = (&outputs[0], &outputs[1]);
            buf.slice_set(&inputs[0], 0, me * len)
                .map_err(|e| CommError::in_job("collectives", e))?;
            Ok(vec![
                lane.all_gather_in_place(group, buf)?,
                lane.all_to_all(group, &inputs[1])?,
                lane.reduce_scatter_into(group, &inputs[2], out)?,
            ])
        }),
    }
}

/// Jobs on the local backend's communication thread give the plain collectives' exact results,
/// on every group, interleaved with plain collectives in issue order.
#[test]
fn jobs_equal_the_plain_collectives_on_every_group() {
    run_local(topo(8, 4), |c| -> Result<(), CommError> {
        let (t, r) = (c.topology(), c.rank());
        for g in GROUPS {
            let (n, me) = (t.group_size(g), t.group_rank(g, r));
            let mine =
                Tensor::from_vec((0..5).map(|i| gather_byte(r, i)).collect(), 5, &Device::Cpu)
                    .unwrap();
            let send: Vec<u8> = (0..n)
                .flat_map(|j| (0..3).map(move |k| a2a_byte(r, j, k)))
                .collect();
            let send = Tensor::from_vec(send, 3 * n, &Device::Cpu).unwrap();
            let reduce: Vec<f32> = (0..4 * n).map(|i| value(r, i)).collect();
            let reduce = Tensor::from_vec(reduce, 4 * n, &Device::Cpu).unwrap();
            // A plain collective before and after the job: the order holds.
            let before = c.all_gather(g, mine.clone());
            let job = c.submit(collectives_job(
                g,
                mine.clone(),
                send.clone(),
                reduce.clone(),
                n,
                me,
            ));
            let after = c.reduce_scatter(g, reduce.clone());
            let got = job.wait()?;
            let to_f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(to_f32(&got[0]), to_f32(&before.wait()?), "gather {g:?}");
            assert_eq!(
                to_f32(&got[1]),
                to_f32(&c.all_to_all(g, send).wait()?),
                "a2a {g:?}"
            );
            assert_eq!(to_f32(&got[2]), to_f32(&after.wait()?), "reduce {g:?}");
        }
        Ok(())
    })
    .unwrap();
}

/// A job's own error comes back from `wait` naming the job, and the rank's later collectives
/// still run; the job clock counts each label's jobs and their time.
#[test]
fn a_failing_job_names_itself_and_the_clock_counts_jobs() {
    run_local(topo(2, 1), |c| -> Result<(), CommError> {
        let clock = c.job_clock().expect("the local backend times its jobs");
        let failing = comm::Job {
            label: "failing",
            device: Device::Cpu,
            inputs: vec![],
            outputs: vec![(DType::F32, 4)],
            run: Box::new(|_, _, _| {
                Err(CommError::in_job(
                    "failing",
                    std::io::Error::other("no such buffer"),
                ))
            }),
        };
        match c.submit(failing).wait() {
            Err(CommError::Job {
                label: "failing",
                source,
            }) => {
                assert_eq!(source.to_string(), "no such buffer")
            }
            other => panic!("expected the job's error, got {other:?}"),
        }
        let sum = c.all_reduce_f32(Group::World, vec![1.0]).wait()?;
        assert_eq!(sum, vec![2.0]);
        let x = Tensor::from_vec(vec![c.rank() as u8; 3], 3, &Device::Cpu).unwrap();
        for _ in 0..3 {
            c.submit(collectives_job(
                Group::World,
                x.clone(),
                Tensor::zeros(2, DType::U8, &Device::Cpu).unwrap(),
                Tensor::zeros(2, DType::F32, &Device::Cpu).unwrap(),
                2,
                c.rank(),
            ))
            .wait()?;
        }
        let times = clock.read()?;
        let of = |label| {
            times
                .iter()
                .find(|t| t.label == label)
                .cloned()
                .unwrap_or_default()
        };
        assert_eq!(
            (of("failing").jobs, of("collectives").jobs),
            (1, 3),
            "{times:?}"
        );
        assert!(of("collectives").busy_s > 0.0);
        assert!((0.0..=1.0).contains(&of("collectives").hidden()));
        Ok(())
    })
    .unwrap();
}
