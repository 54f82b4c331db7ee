//! Throughput of the local backend's world collectives at W = 8 (2 nodes x 4), 4 MiB per rank
//! per call. Throughput is bytes each rank contributes per call.
//!
//! `cargo bench -p comm --bench local`

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use comm::{local_world, Group, HostCollectives, LocalComm, Topology};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const BYTES: usize = 4 << 20;

/// Runs `iters` calls of `op` on every rank (one driver thread per rank, started together) and
/// returns the wall time of the slowest rank.
fn time_world(comms: &[LocalComm], iters: u64, op: fn(&LocalComm)) -> Duration {
    let start = Arc::new(Barrier::new(comms.len()));
    std::thread::scope(|s| {
        let threads: Vec<_> = comms
            .iter()
            .map(|comm| {
                let start = start.clone();
                s.spawn(move || {
                    start.wait();
                    let t = Instant::now();
                    for _ in 0..iters {
                        op(comm);
                    }
                    t.elapsed()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a bench rank thread"))
            .max()
            .unwrap_or_default()
    })
}

fn collectives(c: &mut Criterion) {
    let topology = Topology::new(8, 4).expect("8 ranks as 2 x 4");
    let comms = local_world(topology);
    let mut group = c.benchmark_group("local_w8_2x4_4MiB");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(BYTES as u64));
    group.bench_function("all_gather", |b| {
        b.iter_custom(|iters| {
            time_world(&comms, iters, |comm| {
                let out = comm.all_gather_bytes(Group::World, vec![1u8; BYTES]).wait();
                assert_eq!(out.map(|o| o.len()).ok(), Some(8 * BYTES));
            })
        })
    });
    group.bench_function("reduce_scatter", |b| {
        b.iter_custom(|iters| {
            time_world(&comms, iters, |comm| {
                let out = comm
                    .reduce_scatter_f32(Group::World, vec![1.0f32; BYTES / 4])
                    .wait();
                assert_eq!(out.map(|o| o.len()).ok(), Some(BYTES / 32));
            })
        })
    });
    group.bench_function("all_to_all", |b| {
        b.iter_custom(|iters| {
            time_world(&comms, iters, |comm| {
                let out = comm.all_to_all_bytes(Group::World, vec![1u8; BYTES]).wait();
                assert_eq!(out.map(|o| o.len()).ok(), Some(BYTES));
            })
        })
    });
    group.finish();
}

criterion_group!(benches, collectives);
criterion_main!(benches);
