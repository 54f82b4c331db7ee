//! Test data shared by the local-backend tests and the MPI check (both compare reductions whose
//! rounding depends on the order of addition).

/// A small deterministic generator (SplitMix64), so the tests need no dependency.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Values of mixed sign and magnitude, so that the order of addition changes the rounding.
pub fn noisy(rank: usize, call: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let h = mix(((rank * 64 + call) * 100_000 + i) as u64);
            let mantissa = (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            mantissa * 10f32.powi((h % 7) as i32 - 3)
        })
        .collect()
}
