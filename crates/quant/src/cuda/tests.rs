//! The launchers' choices and the kernels' NVRTC compile, without a GPU.

use super::*;

#[test]
fn fast_requantizer_takes_whole_rounds_of_full_blocks() {
    let fast = |block, pieces, p| fast_requantizer(block, pieces, p);
    // Block 512: 16 threads a block in the general kernels, 8 (two units) at up to 4
    // pieces, 32 blocks a round; 16 threads, 16 blocks a round at 5 to 8 pieces.
    let q = fast(512, 4, 256 * 70 + 16).unwrap();
    assert_eq!(
        (q.name, q.tpb, q.rounds),
        ("dequantize_sum_requantize_int4_full", 8, 2)
    );
    let q = fast(512, 8, 256 * 70).unwrap();
    assert_eq!(
        (q.name, q.tpb, q.rounds),
        ("dequantize_sum_requantize_int4_full8", 16, 4)
    );
    // Block 2048 (64 threads): 32 threads, 8 blocks a round; block 32: one thread, one unit.
    assert_eq!(
        fast(2048, 2, 1024 * 8).map(|q| (q.tpb, q.rounds)),
        Some((32, 1))
    );
    assert_eq!(
        fast(32, 7, 16 * 256).map(|q| (q.tpb, q.rounds)),
        Some((1, 1))
    );
    // None: less than a round, unaligned pieces, 9 pieces, odd units (block 96), 2^32 bytes.
    assert_eq!(fast(512, 4, 256 * 31), None);
    assert_eq!(fast(512, 4, 256 * 64 + 8), None);
    assert_eq!(fast(512, 9, 256 * 64), None);
    assert_eq!(fast(96, 2, 48 * 1024), None);
    assert_eq!(fast(512, 1, 1 << 32), None);
}

/// Compiles the kernels, with the defines and flavour the launchers use, for the block
/// sizes that exercise every code path (vector and scalar lanes, partial steps). Needs only
/// libnvrtc, no GPU:
/// `LD_LIBRARY_PATH=$CUDA_ROOT/lib cargo test --features cuda -p quant --lib nvrtc`.
#[test]
fn nvrtc_compiles_every_kernel() {
    for block in [32, 64, 96, 128, 160, 256, 512, 1024, 2048, 4096] {
        let ptx = kernels::loader::ptx(&kernels::QUANT, &defines(block), kernels::Flavour::Exact)
            .unwrap_or_else(|e| panic!("block {block}: {e}"));
        for name in [
            "quantize_int8",
            "dequantize_int8_f32",
            "dequantize_int8_bf16",
            "quantize_int4_swizzled",
            "dequantize_sum_int4",
            "dequantize_sum_requantize_int4",
            "dequantize_sum_requantize_int4_full",
            "dequantize_sum_requantize_int4_full8",
        ] {
            assert!(
                ptx.contains(".target sm_80"),
                "block {block}: not sm_80 PTX"
            );
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "block {block}: no entry {name}"
            );
        }
    }
}
