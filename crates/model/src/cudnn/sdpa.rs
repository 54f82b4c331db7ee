//! The causal attention graphs, forward and backward, as cudnn-frontend builds them for
//! PyTorch's `scaled_dot_product_attention(q, k, v, is_causal=True)`, in the order of the
//! backend log in shared/reference/cudnn-sdpa, on our layouts.
//!
//! Grouped-query attention (fewer K/V heads than Q heads) is the frontend's too
//! (`scaled_dot_product_flash_attention.h`): K and V are described with their own `KV` heads,
//! which the matmuls broadcast over the `NH / KV` query heads of a group (no copies); the
//! backward's dK and dV come out of their matmuls per query head, as virtual `(B, NH, T, hs)`
//! tensors, and a sum reduction over each group writes them.

use cudarc::cudnn::sys;

use super::graph::{DataType, Graph, Mode, BF16, F32};
use super::Shape;
use crate::error::Result;

/// Unique ids of the tensors the caller binds (the variant pack); the graph numbers its
/// virtual tensors from 100 up.
pub(super) mod uid {
    pub const Q: i64 = 1;
    pub const K_T: i64 = 2;
    pub const V: i64 = 3;
    pub const V_T: i64 = 4;
    pub const O: i64 = 5;
    pub const STATS: i64 = 6;
    pub const DO: i64 = 7;
    pub const DQ: i64 = 8;
    pub const DK: i64 = 9;
    pub const DV: i64 = 10;
    /// `rowsum(dO * O)`, f32 `(B, NH, T, 1)`: written by the graph into our workspace.
    pub const SOFTMAX_SUM: i64 = 11;
    /// dq in f32 `(B, NH, T, hs)` before the cast: in our workspace.
    pub const DQ_ACCUM: i64 = 12;
    pub const SCALE: i64 = 13;
    pub const ONE: i64 = 14;
    pub const NEG_INF: i64 = 15;
}

/// Dims and strides of every tensor of one shape, in elements. `W = (NH + 2 KV) hs` is the
/// packed projection's row (`3C` for multi-head attention).
struct Layouts {
    /// `(B, NH, T, hs)`.
    bhtd: [usize; 4],
    /// `(B, KV, T, hs)`: k and v (and dk, dv).
    kv_bhtd: [usize; 4],
    /// `(B, KV, hs, T)`: k and v transposed, as the score and dP matmuls take them.
    kv_bhdt: [usize; 4],
    /// q, k, v (and dq, dk, dv) inside `(B, T, W)`.
    qkv_strides: [usize; 4],
    /// k and v transposed inside `(B, T, W)`.
    qkv_t_strides: [usize; 4],
    /// Whether K/V heads are fewer than Q heads.
    grouped: bool,
    /// y and dy inside `(B, T, C)`.
    y_strides: [usize; 4],
    /// `(B, NH, T, 1)` and its packed strides: lse, the softmax sum.
    rows: [usize; 4],
    rows_strides: [usize; 4],
    /// `(B, NH, T, T)` scores, packed (virtual: never in memory).
    scores: [usize; 4],
    scores_strides: [usize; 4],
    /// The same scores seen transposed.
    scores_t_strides: [usize; 4],
    /// Packed `(B, NH, T, hs)` f32: the dq accumulator.
    packed_strides: [usize; 4],
}

impl Layouts {
    fn new(s: Shape) -> Layouts {
        let Shape {
            batch: b,
            heads: h,
            kv_heads: kv,
            seq: t,
            head_size: d,
        } = s;
        let c = h * d;
        let w = s.row();
        Layouts {
            bhtd: [b, h, t, d],
            kv_bhtd: [b, kv, t, d],
            kv_bhdt: [b, kv, d, t],
            qkv_strides: [t * w, d, w, 1],
            qkv_t_strides: [t * w, d, 1, w],
            grouped: kv != h,
            y_strides: [t * c, d, c, 1],
            rows: [b, h, t, 1],
            rows_strides: [h * t, t, 1, 1],
            scores: [b, h, t, t],
            scores_strides: [h * t * t, t * t, t, 1],
            scores_t_strides: [h * t * t, t * t, 1, t],
            packed_strides: [h * t * d, t * d, d, 1],
        }
    }
}

/// The forward graph: `O = softmax(mask(Q K^T * scale)) V` and `Stats = max + log(sum)`.
pub(super) fn forward_graph(shape: Shape) -> Result<Graph> {
    let s = Layouts::new(shape);
    let mut g = Graph::new();
    g.data(uid::V, BF16, s.kv_bhtd, s.qkv_strides)?;
    g.data(uid::K_T, BF16, s.kv_bhdt, s.qkv_t_strides)?;
    g.data(uid::Q, BF16, s.bhtd, s.qkv_strides)?;
    g.scalar(uid::SCALE)?;
    g.data(uid::STATS, F32, s.rows, s.rows_strides)?;
    g.data(uid::O, BF16, s.bhtd, s.y_strides)?;
    g.scalar(uid::NEG_INF)?;

    let scores = g.virt(F32, s.scores, s.scores_strides)?;
    g.matmul(uid::Q, uid::K_T, scores)?;
    let scaled = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_MUL, scores, Some(uid::SCALE), scaled)?;
    let masked = causal_mask(&mut g, scaled, &s)?;
    let max = g.virt(F32, s.rows, s.rows_strides)?;
    g.reduction(
        sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX,
        masked,
        max,
    )?;
    let centered = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_SUB, masked, Some(max), centered)?;
    let exp = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_EXP, centered, None, exp)?;
    let sum = g.virt(F32, s.rows, s.rows_strides)?;
    g.reduction(
        sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD,
        exp,
        sum,
    )?;
    let log_sum = g.virt(F32, s.rows, s.rows_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_LOG, sum, None, log_sum)?;
    g.pointwise(Mode::CUDNN_POINTWISE_ADD, max, Some(log_sum), uid::STATS)?;
    let probs = g.virt(BF16, s.scores, s.scores_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_DIV, exp, Some(sum), probs)?;
    g.matmul(probs, uid::V, uid::O)?;
    Ok(g)
}

/// The backward graph: P recomputed from Stats, then dV = P^T dO, dP = dO V^T,
/// dS = P (dP - rowsum(dO O)) * scale, dK = dS^T Q, dQ = dS K.
pub(super) fn backward_graph(shape: Shape) -> Result<Graph> {
    let s = Layouts::new(shape);
    let mut g = Graph::new();
    g.data(uid::STATS, F32, s.rows, s.rows_strides)?;
    g.data(uid::DO, BF16, s.bhtd, s.y_strides)?;
    g.data(uid::O, BF16, s.bhtd, s.y_strides)?;
    g.data(uid::V_T, BF16, s.kv_bhdt, s.qkv_t_strides)?;
    g.data(uid::K_T, BF16, s.kv_bhdt, s.qkv_t_strides)?;
    g.data(uid::Q, BF16, s.bhtd, s.qkv_strides)?;
    g.scalar(uid::SCALE)?;
    g.data(uid::DV, BF16, s.kv_bhtd, s.qkv_strides)?;
    g.data(uid::DK, BF16, s.kv_bhtd, s.qkv_strides)?;
    g.data(uid::DQ, BF16, s.bhtd, s.qkv_strides)?;
    g.scalar(uid::ONE)?;
    g.data(uid::SOFTMAX_SUM, F32, s.rows, s.rows_strides)?;
    g.scalar(uid::NEG_INF)?;
    g.data(uid::DQ_ACCUM, F32, s.bhtd, s.packed_strides)?;

    // softmax_sum = rowsum(dO * O) (the frontend's strides for the virtual product).
    let [_, h, t, d] = s.bhtd;
    let d_o = g.virt(F32, s.bhtd, [h * t * d, t * d, h * d, 1])?;
    g.pointwise(Mode::CUDNN_POINTWISE_MUL, uid::DO, Some(uid::O), d_o)?;
    let rowsum = g.virt(F32, s.rows, s.rows_strides)?;
    g.reduction(
        sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD,
        d_o,
        rowsum,
    )?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_MUL,
        rowsum,
        Some(uid::ONE),
        uid::SOFTMAX_SUM,
    )?;

    // P = exp(mask(Q K^T * scale - Stats))
    let scores = g.virt(F32, s.scores, s.scores_strides)?;
    g.matmul(uid::Q, uid::K_T, scores)?;
    let scaled = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_MUL, scores, Some(uid::SCALE), scaled)?;
    let centered = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_SUB,
        scaled,
        Some(uid::STATS),
        centered,
    )?;
    let masked = causal_mask(&mut g, centered, &s)?;
    let probs = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_EXP, masked, None, probs)?;

    // dV = P^T dO (per query head, then summed over each group)
    let probs_t = g.virt(BF16, s.scores, s.scores_t_strides)?;
    g.reshape(probs, probs_t)?;
    grouped_matmul(&mut g, &s, probs_t, uid::DO, uid::DV)?;

    // dS = P * (dO V^T - softmax_sum) * scale
    let d_probs = g.virt(F32, s.scores, s.scores_strides)?;
    g.matmul(uid::DO, uid::V_T, d_probs)?;
    let centered_d = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_SUB,
        d_probs,
        Some(uid::SOFTMAX_SUM),
        centered_d,
    )?;
    let d_scores_unscaled = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_MUL,
        centered_d,
        Some(probs),
        d_scores_unscaled,
    )?;
    let d_scores = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(
        Mode::CUDNN_POINTWISE_MUL,
        d_scores_unscaled,
        Some(uid::SCALE),
        d_scores,
    )?;

    // dK = dS^T Q (per query head, then summed over each group)
    let d_scores_t = g.virt(BF16, s.scores, s.scores_t_strides)?;
    g.reshape(d_scores, d_scores_t)?;
    grouped_matmul(&mut g, &s, d_scores_t, uid::Q, uid::DK)?;

    // dQ = dS K, accumulated in f32, then cast into dqkv.
    let k = g.virt(F32, s.kv_bhtd, s.qkv_strides)?;
    g.reshape(uid::K_T, k)?;
    g.matmul(d_scores, k, uid::DQ_ACCUM)?;
    g.pointwise(Mode::CUDNN_POINTWISE_IDENTITY, uid::DQ_ACCUM, None, uid::DQ)?;
    Ok(g)
}

/// `out = a b` where `out` has the K/V heads: straight into `out` for multi-head attention;
/// with groups, into a virtual per-query-head `(B, NH, T, hs)` bf16 product (packed BHSD
/// strides) that an add-reduction sums over each group into `out` (the frontend's
/// `dV_fullhead` / `dK_fullhead`).
fn grouped_matmul(g: &mut Graph, s: &Layouts, a: i64, b: i64, out: i64) -> Result<()> {
    if !s.grouped {
        return g.matmul(a, b, out);
    }
    let full = g.virt(BF16, s.bhtd, s.packed_strides)?;
    g.matmul(a, b, full)?;
    g.reduction(
        sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD,
        full,
        out,
    )
}

/// `scores` with every key after its query replaced by [`uid::NEG_INF`]: row index (axis 2)
/// >= column index (axis 3) keeps the score (the frontend's top-left causal mask).
fn causal_mask(g: &mut Graph, scores: i64, s: &Layouts) -> Result<i64> {
    let row = g.virt(DataType::CUDNN_DATA_INT32, s.scores, s.scores_strides)?;
    let col = g.virt(DataType::CUDNN_DATA_INT32, s.scores, s.scores_strides)?;
    let keep = g.virt(DataType::CUDNN_DATA_BOOLEAN, s.scores, s.scores_strides)?;
    let masked = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise_full(
        Mode::CUDNN_POINTWISE_GEN_INDEX,
        F32,
        Some(2),
        scores,
        None,
        None,
        row,
    )?;
    g.pointwise_full(
        Mode::CUDNN_POINTWISE_GEN_INDEX,
        F32,
        Some(3),
        scores,
        None,
        None,
        col,
    )?;
    g.pointwise_full(
        Mode::CUDNN_POINTWISE_CMP_GE,
        DataType::CUDNN_DATA_BOOLEAN,
        None,
        row,
        Some(col),
        None,
        keep,
    )?;
    g.pointwise_full(
        Mode::CUDNN_POINTWISE_BINARY_SELECT,
        F32,
        None,
        scores,
        Some(uid::NEG_INF),
        Some(keep),
        masked,
    )?;
    Ok(masked)
}
