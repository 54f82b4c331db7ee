//! Sampler: determinism, epoch coverage, world-size independence, resumption.

use std::collections::BTreeSet;

use data::{DataError, Sampler};

#[test]
fn sizes_and_errors() {
    let s = Sampler::new(1001, 10, 0).unwrap();
    assert_eq!(s.num_samples(), 100);
    assert_eq!(Sampler::new(1000, 10, 0).unwrap().num_samples(), 99);
    assert!(matches!(
        Sampler::new(10, 10, 0),
        Err(DataError::Empty { .. })
    ));
    assert!(Sampler::new(11, 10, 0).is_ok());
    assert!(Sampler::new(100, 0, 0).is_err());
    assert_eq!(Sampler::check_batch(32, 4, 2).unwrap(), 4);
    assert!(Sampler::check_batch(30, 4, 2).is_err());
    assert!(Sampler::check_batch(32, 4, 3).is_err());
    assert!(Sampler::check_batch(32, 0, 1).is_err());
}

#[test]
fn deterministic_and_seeded() {
    let a = Sampler::new(100_000, 16, 42).unwrap();
    let b = Sampler::new(100_000, 16, 42).unwrap();
    let c = Sampler::new(100_000, 16, 43).unwrap();
    let ids = |s: &Sampler| -> Vec<usize> {
        (0..20)
            .flat_map(|st| s.micro_batch_ids(st, 64, 1, 0, 0, 64).unwrap())
            .collect()
    };
    assert_eq!(ids(&a), ids(&b));
    assert_ne!(ids(&a), ids(&c));
    // Shuffled, not the identity.
    assert_ne!(
        a.micro_batch_ids(0, 64, 1, 0, 0, 64).unwrap(),
        (0..64).collect::<Vec<_>>()
    );
}

#[test]
fn each_epoch_is_a_permutation() {
    let n_tokens = 37 * 8 + 1;
    let s = Sampler::new(n_tokens, 8, 5).unwrap();
    let n = s.num_samples();
    assert_eq!(n, 37);
    let all: Vec<usize> = (0..3 * n as u64).map(|g| s.sample_id(g)).collect();
    let mut epochs = Vec::new();
    for e in 0..3 {
        let mut ep = all[e * n..(e + 1) * n].to_vec();
        epochs.push(ep.clone());
        ep.sort_unstable();
        assert_eq!(ep, (0..n).collect::<Vec<_>>(), "epoch {e}");
    }
    assert_ne!(epochs[0], epochs[1], "epochs are reshuffled");
    // Batches of 5 over 37 samples cross epoch boundaries: still the same sequence.
    let batched: Vec<usize> = (0..(3 * n / 5) as u64)
        .flat_map(|st| s.micro_batch_ids(st, 5, 1, 0, 0, 5).unwrap())
        .collect();
    assert_eq!(batched, all[..batched.len()]);
}

#[test]
fn global_batch_is_the_same_for_every_world_size() {
    let s = Sampler::new(50_000, 32, 9).unwrap();
    let global = 16;
    for step in [0u64, 1, 7, 1000] {
        let reference: Vec<usize> = s.micro_batch_ids(step, global, 1, 0, 0, global).unwrap();
        for (world, micro_batch) in [(1, 4), (2, 8), (2, 2), (4, 1), (4, 4), (8, 2), (16, 1)] {
            let per_rank = global / world;
            let mut got = Vec::new();
            for rank in 0..world {
                for micro in 0..per_rank / micro_batch {
                    let ids = s
                        .micro_batch_ids(step, global, world, rank, micro, micro_batch)
                        .unwrap();
                    assert_eq!(ids.len(), micro_batch);
                    got.extend(ids);
                }
            }
            // Same samples in the same global positions, hence also the same set.
            assert_eq!(got, reference, "world {world} micro_batch {micro_batch}");
            let set: BTreeSet<_> = got.iter().collect();
            assert_eq!(set.len(), global);
        }
    }
}

#[test]
fn resumed_sampler_gives_the_same_ids() {
    let run = |s: &Sampler, steps: std::ops::Range<u64>| -> Vec<usize> {
        steps
            .flat_map(|st| (0..2).flat_map(move |r| (0..2).map(move |m| (st, r, m))))
            .flat_map(|(st, r, m)| s.micro_batch_ids(st, 8, 2, r, m, 2).unwrap())
            .collect()
    };
    let full = run(&Sampler::new(10_000, 16, 1).unwrap(), 0..200);
    // A fresh sampler (as after a restart) continuing at step 120.
    let resumed = run(&Sampler::new(10_000, 16, 1).unwrap(), 120..200);
    assert_eq!(resumed, full[120 * 8..]);
}

#[test]
fn gather_and_eval_order() {
    let tokens: Vec<u32> = (100..100 + 25).collect();
    let s = Sampler::new(tokens.len(), 4, 0).unwrap();
    assert_eq!(s.num_samples(), 6);
    let (x, y) = s.gather(&tokens, &[5, 0]).unwrap();
    assert_eq!(x, [120, 121, 122, 123, 100, 101, 102, 103]);
    assert_eq!(y, [121, 122, 123, 124, 101, 102, 103, 104]);
    assert_eq!(s.eval_ids(3), [0, 1, 2]);
    assert_eq!(s.eval_ids(100), [0, 1, 2, 3, 4, 5]);
}

#[test]
fn pinned_order() {
    // Pins the shuffle so that a change to it (which would break resuming old runs) is noticed.
    let s = Sampler::new(10 * 4 + 1, 4, 1234).unwrap();
    let ids: Vec<usize> = (0..10).map(|g| s.sample_id(g)).collect();
    assert_eq!(ids, PINNED);
}

const PINNED: [usize; 10] = [5, 9, 4, 1, 8, 3, 2, 0, 7, 6];

#[test]
fn splitmix64_reference_values() {
    // First outputs from seed 0 of the reference C implementation (Vigna, splitmix64.c).
    let mut state = 0u64;
    assert_eq!(data::splitmix64(&mut state), 0xE220_A839_7B1D_CDAF);
    assert_eq!(data::splitmix64(&mut state), 0x6E78_9E6A_A1B9_65F4);
}

#[test]
fn bad_layouts_ranks_micro_batches_and_short_streams_are_errors() {
    let s = Sampler::new(41, 4, 7).unwrap();
    assert!(matches!(
        s.micro_batch_ids(0, 6, 4, 0, 0, 1),
        Err(DataError::BadBatch { .. })
    ));
    assert!(matches!(
        s.micro_batch_ids(0, 4, 2, 2, 0, 1),
        Err(DataError::RankOutOfRange { rank: 2, world: 2 })
    ));
    assert!(matches!(
        s.micro_batch_ids(0, 4, 2, 1, 2, 1),
        Err(DataError::MicroBatchOutOfRange {
            micro: 2,
            micros: 2
        })
    ));
    let tokens: Vec<u32> = (0..20).collect();
    let err = s.gather(&tokens, &[9]).unwrap_err();
    assert!(matches!(
        err,
        DataError::SampleOutOfRange {
            id: 9,
            start: 36,
            end: 41,
            len: 20
        }
    ));
    assert_eq!(
        err.to_string(),
        "sample 9 needs tokens 36..41 but the stream has 20"
    );
}
