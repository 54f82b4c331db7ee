//! The byte layout of a quantised message, shared by qwZ's gathers and qgZ's all-to-alls: the
//! codes (INT8 one a byte, INT4 two a byte), then one little-endian f32 scale per block.

/// Appends one message of `codes` and `scales` to `out`.
pub(crate) fn push(out: &mut Vec<u8>, codes: impl IntoIterator<Item = u8>, scales: &[f32]) {
    out.extend(codes);
    out.extend(scales.iter().flat_map(|s| s.to_le_bytes()));
}

/// Splits a concatenation of equal messages, each `code_bytes` of codes and `scales` scales,
/// into (codes, scales) pairs in message order.
pub(crate) fn split(
    bytes: &[u8],
    code_bytes: usize,
    scales: usize,
) -> impl Iterator<Item = (&[u8], Vec<f32>)> {
    bytes.chunks_exact(code_bytes + 4 * scales).map(move |m| {
        let (codes, scale_bytes) = m.split_at(code_bytes);
        (codes, comm::bytes_to_f32(scale_bytes))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn messages_round_trip() {
        let mut out = Vec::new();
        super::push(&mut out, [1u8, 2, 3, 4], &[0.5]);
        super::push(&mut out, [5u8, 6, 7, 8], &[-2.0]);
        let parts: Vec<_> = super::split(&out, 4, 1).collect();
        assert_eq!(
            parts,
            vec![
                (&[1u8, 2, 3, 4][..], vec![0.5]),
                (&[5u8, 6, 7, 8][..], vec![-2.0])
            ]
        );
    }
}
