//! qgZ's slice reordering (docs/design.md section 3).
//!
//! World W = N nodes x D ranks per node; x: [W * S] is W slices of S elements, slice p owned in
//! the end by rank p = n * D + d. Swizzling moves slice p to position (p % D) * N + p / D, so
//! that the N slices bound for local rank d (p = n' * D + d, n' in 0..N) form one contiguous
//! chunk, chunk d, for the intra-node all-to-all.
//!
//! ```
//! // N = 2, D = 2: slices [a, b, c, d] -> [a, c, b, d].
//! let y = quant::swizzle(&[0.0, 1.0, 2.0, 3.0], 2, 2);
//! assert_eq!(y, vec![0.0, 2.0, 1.0, 3.0]);
//! assert_eq!(quant::unswizzle(&y, 2, 2), vec![0.0, 1.0, 2.0, 3.0]);
//! ```

/// Slice length S; panics unless x.len() is a multiple of W = nodes * ranks_per_node > 0.
pub(crate) fn slice_len(len: usize, nodes: usize, ranks_per_node: usize) -> usize {
    let w = nodes * ranks_per_node;
    assert!(w > 0, "world size must be positive");
    assert_eq!(
        len % w,
        0,
        "length {len} is not a multiple of the world size {w}"
    );
    len / w
}

/// Position of slice p after swizzling.
#[inline]
pub(crate) fn swizzled_pos(p: usize, nodes: usize, ranks_per_node: usize) -> usize {
    (p % ranks_per_node) * nodes + p / ranks_per_node
}

/// Reorder the W slices of `x`: slice p goes to position (p % D) * N + p / D.
///
/// Panics unless x.len() is a multiple of W = nodes * ranks_per_node > 0.
pub fn swizzle(x: &[f32], nodes: usize, ranks_per_node: usize) -> Vec<f32> {
    let s = slice_len(x.len(), nodes, ranks_per_node);
    let mut out = vec![0f32; x.len()];
    if s == 0 {
        return out;
    }
    for (p, src) in x.chunks_exact(s).enumerate() {
        let q = swizzled_pos(p, nodes, ranks_per_node);
        out[q * s..(q + 1) * s].copy_from_slice(src);
    }
    out
}

/// Inverse of [`swizzle`]: slice at position (p % D) * N + p / D goes back to position p.
///
/// Panics unless x.len() is a multiple of W = nodes * ranks_per_node > 0.
pub fn unswizzle(x: &[f32], nodes: usize, ranks_per_node: usize) -> Vec<f32> {
    let s = slice_len(x.len(), nodes, ranks_per_node);
    let mut out = vec![0f32; x.len()];
    if s == 0 {
        return out;
    }
    for (p, dst) in out.chunks_exact_mut(s).enumerate() {
        let q = swizzled_pos(p, nodes, ranks_per_node);
        dst.copy_from_slice(&x[q * s..(q + 1) * s]);
    }
    out
}
