//! Causal attention through cuDNN's fused SDPA (feature `cuda`).
//!
//! cuDNN fuses a graph of matmul, pointwise and reduction operations into one flash-attention
//! kernel. The graphs here are the ones cudnn-frontend builds for PyTorch's
//! `scaled_dot_product_attention(q, k, v, is_causal=True)` (14 operations forward, 22 backward),
//! made through cuDNN's backend API one descriptor at a time, in the order of the backend log in
//! shared/reference/cudnn-sdpa. On the H200 they run at about 1.5x our own mma.sync kernels.
//!
//! Every operand is described by its strides, so q, k, v are read where the QKV GEMM wrote them
//! (`qkv (B, T, 3C)`, heads split inside each third), y is written `(B, T, C)` and dqkv
//! `(B, T, 3C)`: nothing is permuted or copied. The log-sum-exp ("Stats") is `(B, NH, T)` f32,
//! the same as our kernels', so either backward takes either forward's output.
//!
//! One cuDNN handle and workspace per CUDA stream; an execution plan per (direction, shape),
//! made at first use (the backward's engine compiles for about 2 s) and kept. A shape that no
//! engine takes is remembered as unsupported, and the caller runs our kernels instead.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use candle_core::cuda_backend::CudaDevice;
use cudarc::cudnn::sys;

use crate::error::{ModelError, Result};

type Name = sys::cudnnBackendAttributeName_t;
type Type = sys::cudnnBackendAttributeType_t;
type Kind = sys::cudnnBackendDescriptorType_t;
type DataType = sys::cudnnDataType_t;
type Mode = sys::cudnnPointwiseMode_t;

/// The oldest cuDNN these graphs are built for: from 9.10 the mask value is `-inf` (before, the
/// frontend used the lowest float) and the dq accumulator needs no zeroing (from 9.6).
const MIN_VERSION: usize = 9_10_00;

/// Which pass a plan computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pass {
    Forward,
    Backward,
}

/// `(B, NH, T, hs)` of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub seq: usize,
    pub head_size: usize,
}

/// Device pointers of the forward: `qkv (B, T, 3C)` bf16 in; `y (B, T, C)` bf16 and
/// `lse (B, NH, T)` f32 out.
pub(crate) struct ForwardArgs {
    pub qkv: u64,
    pub y: u64,
    pub lse: u64,
}

/// Device pointers of the backward: the forward's `qkv`, `y`, `lse` and `dy (B, T, C)` in;
/// `dqkv (B, T, 3C)` bf16 out (every element written).
pub(crate) struct BackwardArgs {
    pub qkv: u64,
    pub y: u64,
    pub lse: u64,
    pub dy: u64,
    pub dqkv: u64,
}

fn check(status: sys::cudnnStatus_t, what: &str) -> Result<()> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any status.
    let message = unsafe { CStr::from_ptr(sys::cudnnGetErrorString(status)) }
        .to_string_lossy()
        .into_owned();
    Err(ModelError::Cudnn {
        what: what.to_string(),
        message,
    })
}

/// A backend descriptor, destroyed on drop.
struct Desc(sys::cudnnBackendDescriptor_t);

impl Desc {
    fn new(kind: Kind) -> Result<Desc> {
        let mut d = std::ptr::null_mut();
        // SAFETY: d receives a fresh descriptor.
        check(
            unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut d) },
            &format!("create {kind:?}"),
        )?;
        Ok(Desc(d))
    }

    /// Sets attribute `name` to `values`, each of the C type that `ty` names.
    fn set<T: Copy>(&self, name: Name, ty: Type, values: &[T]) -> Result<()> {
        // SAFETY: `values` holds values.len() elements of the type `ty` stands for (the callers
        // pair them: i64 with INT64, bool with BOOLEAN, the enums with their own types).
        check(
            unsafe {
                sys::cudnnBackendSetAttribute(
                    self.0,
                    name,
                    ty,
                    values.len() as i64,
                    values.as_ptr() as *const c_void,
                )
            },
            &format!("set {name:?}"),
        )
    }

    fn set_descs(&self, name: Name, descs: &[&Desc]) -> Result<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = descs.iter().map(|d| d.0).collect();
        self.set(name, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    fn finalize(&self) -> Result<()> {
        // SAFETY: a live descriptor.
        check(unsafe { sys::cudnnBackendFinalize(self.0) }, "finalize")
    }

    fn get_i64(&self, name: Name) -> Result<i64> {
        let (mut value, mut count) = (0i64, 0i64);
        // SAFETY: one INT64 into `value`.
        check(
            unsafe {
                sys::cudnnBackendGetAttribute(
                    self.0,
                    name,
                    Type::CUDNN_TYPE_INT64,
                    1,
                    &mut count,
                    &mut value as *mut i64 as *mut c_void,
                )
            },
            &format!("get {name:?}"),
        )?;
        Ok(value)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once.
        unsafe {
            sys::cudnnBackendDestroyDescriptor(self.0);
        }
    }
}

/// Unique ids of the tensors the caller binds (the variant pack); virtual tensors count up
/// from [`uid::FIRST_VIRTUAL`].
mod uid {
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
    pub const FIRST_VIRTUAL: i64 = 100;
}

const F32: DataType = DataType::CUDNN_DATA_FLOAT;
const BF16: DataType = DataType::CUDNN_DATA_BFLOAT16;

/// An operation graph under construction: its tensors (by uid) and operations, in order.
struct Graph {
    tensors: HashMap<i64, Desc>,
    /// Pointwise, reduction and matmul descriptors the operations point to.
    parts: Vec<Desc>,
    ops: Vec<Desc>,
    next_virtual: i64,
}

impl Graph {
    fn new() -> Graph {
        Graph {
            tensors: HashMap::new(),
            parts: Vec::new(),
            ops: Vec::new(),
            next_virtual: uid::FIRST_VIRTUAL,
        }
    }

    fn tensor(
        &mut self,
        id: i64,
        dtype: DataType,
        dims: [usize; 4],
        strides: [usize; 4],
        is_virtual: bool,
        by_value: bool,
    ) -> Result<i64> {
        let d = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        let dims = dims.map(|x| x as i64);
        let strides = strides.map(|x| x as i64);
        d.set(
            Name::CUDNN_ATTR_TENSOR_DATA_TYPE,
            Type::CUDNN_TYPE_DATA_TYPE,
            &[dtype],
        )?;
        d.set(
            Name::CUDNN_ATTR_TENSOR_DIMENSIONS,
            Type::CUDNN_TYPE_INT64,
            &dims,
        )?;
        d.set(
            Name::CUDNN_ATTR_TENSOR_STRIDES,
            Type::CUDNN_TYPE_INT64,
            &strides,
        )?;
        d.set(
            Name::CUDNN_ATTR_TENSOR_UNIQUE_ID,
            Type::CUDNN_TYPE_INT64,
            &[id],
        )?;
        d.set(
            Name::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
            Type::CUDNN_TYPE_INT64,
            &[16i64],
        )?;
        if is_virtual {
            d.set(
                Name::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
                Type::CUDNN_TYPE_BOOLEAN,
                &[true],
            )?;
        }
        if by_value {
            d.set(
                Name::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                Type::CUDNN_TYPE_BOOLEAN,
                &[true],
            )?;
        }
        d.finalize()?;
        self.tensors.insert(id, d);
        Ok(id)
    }

    /// A tensor the caller binds to memory.
    fn data(
        &mut self,
        id: i64,
        dtype: DataType,
        dims: [usize; 4],
        strides: [usize; 4],
    ) -> Result<i64> {
        self.tensor(id, dtype, dims, strides, false, false)
    }

    /// An f32 scalar passed by value from the host.
    fn scalar(&mut self, id: i64) -> Result<i64> {
        self.tensor(id, F32, [1; 4], [1; 4], false, true)
    }

    /// An intermediate that lives only inside the fused kernel.
    fn virt(&mut self, dtype: DataType, dims: [usize; 4], strides: [usize; 4]) -> Result<i64> {
        let id = self.next_virtual;
        self.next_virtual += 1;
        self.tensor(id, dtype, dims, strides, true, false)
    }

    fn t(&self, id: i64) -> &Desc {
        &self.tensors[&id]
    }

    /// `y = mode(x, b)` (b is None for unary modes; `t` the condition of BINARY_SELECT;
    /// `axis` that of GEN_INDEX), computed in `prec`.
    #[allow(clippy::too_many_arguments)]
    fn pointwise_full(
        &mut self,
        mode: Mode,
        prec: DataType,
        axis: Option<i64>,
        x: i64,
        b: Option<i64>,
        t: Option<i64>,
        y: i64,
    ) -> Result<()> {
        let pw = Desc::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        pw.set(
            Name::CUDNN_ATTR_POINTWISE_MODE,
            Type::CUDNN_TYPE_POINTWISE_MODE,
            &[mode],
        )?;
        pw.set(
            Name::CUDNN_ATTR_POINTWISE_MATH_PREC,
            Type::CUDNN_TYPE_DATA_TYPE,
            &[prec],
        )?;
        if let Some(axis) = axis {
            pw.set(
                Name::CUDNN_ATTR_POINTWISE_AXIS,
                Type::CUDNN_TYPE_INT64,
                &[axis],
            )?;
        }
        pw.finalize()?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[self.t(x)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[self.t(y)])?;
        if let Some(b) = b {
            op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[self.t(b)])?;
        }
        if let Some(t) = t {
            op.set_descs(Name::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[self.t(t)])?;
        }
        op.finalize()?;
        self.parts.push(pw);
        self.ops.push(op);
        Ok(())
    }

    fn pointwise(&mut self, mode: Mode, x: i64, b: Option<i64>, y: i64) -> Result<()> {
        self.pointwise_full(mode, F32, None, x, b, None, y)
    }

    fn reduction(&mut self, op_kind: sys::cudnnReduceTensorOp_t, x: i64, y: i64) -> Result<()> {
        let red = Desc::new(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        red.set(
            Name::CUDNN_ATTR_REDUCTION_COMP_TYPE,
            Type::CUDNN_TYPE_DATA_TYPE,
            &[F32],
        )?;
        red.set(
            Name::CUDNN_ATTR_REDUCTION_OPERATOR,
            Type::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
            &[op_kind],
        )?;
        red.finalize()?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&red])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[self.t(x)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[self.t(y)])?;
        op.finalize()?;
        self.parts.push(red);
        self.ops.push(op);
        Ok(())
    }

    /// `c = a @ b` over the last two dims, batched over the first two, f32 accumulation.
    fn matmul(&mut self, a: i64, b: i64, c: i64) -> Result<()> {
        let mm = Desc::new(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        mm.set(
            Name::CUDNN_ATTR_MATMUL_COMP_TYPE,
            Type::CUDNN_TYPE_DATA_TYPE,
            &[F32],
        )?;
        mm.finalize()?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[self.t(a)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[self.t(b)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[self.t(c)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&mm])?;
        op.finalize()?;
        self.parts.push(mm);
        self.ops.push(op);
        Ok(())
    }

    /// `y` = `x` seen with `y`'s dims, strides and type (a transpose when the strides swap).
    fn reshape(&mut self, x: i64, y: i64) -> Result<()> {
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[self.t(x)])?;
        op.set_descs(Name::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[self.t(y)])?;
        op.finalize()?;
        self.ops.push(op);
        Ok(())
    }

    /// `scores` with every key after its query replaced by [`uid::NEG_INF`]: row index (axis 2)
    /// >= column index (axis 3) keeps the score (the frontend's top-left causal mask).
    fn causal_mask(&mut self, scores: i64, s: &Layouts) -> Result<i64> {
        let row = self.virt(DataType::CUDNN_DATA_INT32, s.scores, s.scores_strides)?;
        let col = self.virt(DataType::CUDNN_DATA_INT32, s.scores, s.scores_strides)?;
        let keep = self.virt(DataType::CUDNN_DATA_BOOLEAN, s.scores, s.scores_strides)?;
        let masked = self.virt(F32, s.scores, s.scores_strides)?;
        self.pointwise_full(
            Mode::CUDNN_POINTWISE_GEN_INDEX,
            F32,
            Some(2),
            scores,
            None,
            None,
            row,
        )?;
        self.pointwise_full(
            Mode::CUDNN_POINTWISE_GEN_INDEX,
            F32,
            Some(3),
            scores,
            None,
            None,
            col,
        )?;
        self.pointwise_full(
            Mode::CUDNN_POINTWISE_CMP_GE,
            DataType::CUDNN_DATA_BOOLEAN,
            None,
            row,
            Some(col),
            None,
            keep,
        )?;
        self.pointwise_full(
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
}

/// Dims and strides of every tensor of one shape, in elements.
struct Layouts {
    /// `(B, NH, T, hs)`.
    bhtd: [usize; 4],
    /// `(B, NH, hs, T)`: k and v transposed, as the score and dP matmuls take them.
    bhdt: [usize; 4],
    /// q, k, v (and dq, dk, dv) inside `(B, T, 3C)`.
    qkv_strides: [usize; 4],
    /// k and v transposed inside `(B, T, 3C)`.
    qkv_t_strides: [usize; 4],
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
            seq: t,
            head_size: d,
        } = s;
        let c = h * d;
        Layouts {
            bhtd: [b, h, t, d],
            bhdt: [b, h, d, t],
            qkv_strides: [t * 3 * c, d, 3 * c, 1],
            qkv_t_strides: [t * 3 * c, d, 1, 3 * c],
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
fn forward_graph(shape: Shape) -> Result<Graph> {
    let s = Layouts::new(shape);
    let mut g = Graph::new();
    g.data(uid::V, BF16, s.bhtd, s.qkv_strides)?;
    g.data(uid::K_T, BF16, s.bhdt, s.qkv_t_strides)?;
    g.data(uid::Q, BF16, s.bhtd, s.qkv_strides)?;
    g.scalar(uid::SCALE)?;
    g.data(uid::STATS, F32, s.rows, s.rows_strides)?;
    g.data(uid::O, BF16, s.bhtd, s.y_strides)?;
    g.scalar(uid::NEG_INF)?;

    let scores = g.virt(F32, s.scores, s.scores_strides)?;
    g.matmul(uid::Q, uid::K_T, scores)?;
    let scaled = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_MUL, scores, Some(uid::SCALE), scaled)?;
    let masked = g.causal_mask(scaled, &s)?;
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
fn backward_graph(shape: Shape) -> Result<Graph> {
    let s = Layouts::new(shape);
    let mut g = Graph::new();
    g.data(uid::STATS, F32, s.rows, s.rows_strides)?;
    g.data(uid::DO, BF16, s.bhtd, s.y_strides)?;
    g.data(uid::O, BF16, s.bhtd, s.y_strides)?;
    g.data(uid::V_T, BF16, s.bhdt, s.qkv_t_strides)?;
    g.data(uid::K_T, BF16, s.bhdt, s.qkv_t_strides)?;
    g.data(uid::Q, BF16, s.bhtd, s.qkv_strides)?;
    g.scalar(uid::SCALE)?;
    g.data(uid::DV, BF16, s.bhtd, s.qkv_strides)?;
    g.data(uid::DK, BF16, s.bhtd, s.qkv_strides)?;
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
    let masked = g.causal_mask(centered, &s)?;
    let probs = g.virt(F32, s.scores, s.scores_strides)?;
    g.pointwise(Mode::CUDNN_POINTWISE_EXP, masked, None, probs)?;

    // dV = P^T dO
    let probs_t = g.virt(BF16, s.scores, s.scores_t_strides)?;
    g.reshape(probs, probs_t)?;
    g.matmul(probs_t, uid::DO, uid::DV)?;

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

    // dK = dS^T Q
    let d_scores_t = g.virt(BF16, s.scores, s.scores_t_strides)?;
    g.reshape(d_scores, d_scores_t)?;
    g.matmul(d_scores_t, uid::Q, uid::DK)?;

    // dQ = dS K, accumulated in f32, then cast into dqkv.
    let k = g.virt(F32, s.bhtd, s.qkv_strides)?;
    g.reshape(uid::K_T, k)?;
    g.matmul(d_scores, k, uid::DQ_ACCUM)?;
    g.pointwise(Mode::CUDNN_POINTWISE_IDENTITY, uid::DQ_ACCUM, None, uid::DQ)?;
    Ok(g)
}

/// A graph's execution plan and what it points to.
struct Plan {
    plan: Desc,
    _config: Desc,
    _op_graph: Desc,
    _graph: Graph,
    /// Bytes of scratch the engine needs.
    engine_workspace: usize,
}

// SAFETY: the descriptors are only used under the per-stream mutex below.
unsafe impl Send for Plan {}

/// Finalizes `graph` into the plan of the first engine that cuDNN's heuristics (mode A) rank
/// and that takes it.
fn build_plan(handle: sys::cudnnHandle_t, graph: Graph) -> Result<Plan> {
    let op_graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    let ops: Vec<&Desc> = graph.ops.iter().collect();
    op_graph.set_descs(Name::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
    op_graph.set(
        Name::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        Type::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    op_graph.finalize()?;

    let heuristics = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heuristics.set_descs(Name::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&op_graph])?;
    heuristics.set(
        Name::CUDNN_ATTR_ENGINEHEUR_MODE,
        Type::CUDNN_TYPE_HEUR_MODE,
        &[sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
    )?;
    heuristics.finalize()?;
    let mut available = 0i64;
    // SAFETY: a count query: no elements requested, none written.
    check(
        unsafe {
            sys::cudnnBackendGetAttribute(
                heuristics.0,
                Name::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                &mut available,
                std::ptr::null_mut(),
            )
        },
        "count engine configs",
    )?;
    let configs = (0..available)
        .map(|_| Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = configs.iter().map(|d| d.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds `available` created ENGINECFG descriptors for cuDNN to fill.
    check(
        unsafe {
            sys::cudnnBackendGetAttribute(
                heuristics.0,
                Name::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                available,
                &mut got,
                raw.as_mut_ptr() as *mut c_void,
            )
        },
        "get engine configs",
    )?;
    let mut last_error = None;
    for config in configs.into_iter().take(got.max(0) as usize) {
        let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        plan.set(
            Name::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
            Type::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        plan.set_descs(Name::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&config])?;
        match plan.finalize() {
            Ok(()) => {
                let engine_workspace = plan
                    .get_i64(Name::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?
                    .max(0) as usize;
                return Ok(Plan {
                    plan,
                    _config: config,
                    _op_graph: op_graph,
                    _graph: graph,
                    engine_workspace,
                });
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or(ModelError::Cudnn {
        what: "plan".into(),
        message: "no engine configuration for this graph".into(),
    }))
}

/// A cuDNN handle bound to one stream, its workspace and its plans.
struct Cudnn {
    handle: sys::cudnnHandle_t,
    stream: Arc<CudaStream>,
    workspace: Option<CudaSlice<u8>>,
    /// The plan of each (pass, shape) seen, or why none could be made.
    plans: HashMap<(Pass, Shape), std::result::Result<Arc<Plan>, String>>,
}

// SAFETY: the handle is used only with its own stream and under its mutex.
unsafe impl Send for Cudnn {}

fn handles() -> &'static Mutex<HashMap<usize, Arc<Mutex<Cudnn>>>> {
    static H: OnceLock<Mutex<HashMap<usize, Arc<Mutex<Cudnn>>>>> = OnceLock::new();
    H.get_or_init(Default::default)
}

/// The cuDNN of `dev`'s stream, made at first use; `None` when the library is older than
/// [`MIN_VERSION`].
fn cudnn_for(dev: &CudaDevice) -> Result<Option<Arc<Mutex<Cudnn>>>> {
    // SAFETY: a plain query.
    if unsafe { sys::cudnnGetVersion() } < MIN_VERSION {
        return Ok(None);
    }
    let stream = dev.cuda_stream();
    let key = stream.cu_stream() as usize;
    let mut map = handles().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = map.get(&key) {
        return Ok(Some(h.clone()));
    }
    let mut handle = std::ptr::null_mut();
    // SAFETY: handle receives a fresh cuDNN context, bound to our stream next.
    check(unsafe { sys::cudnnCreate(&mut handle) }, "create handle")?;
    check(
        unsafe { sys::cudnnSetStream(handle, stream.cu_stream() as sys::cudaStream_t) },
        "set stream",
    )?;
    let h = Arc::new(Mutex::new(Cudnn {
        handle,
        stream,
        workspace: None,
        plans: HashMap::new(),
    }));
    map.insert(key, h.clone());
    Ok(Some(h))
}

impl Cudnn {
    /// The plan of (pass, shape), built at first use; `Err(reason)` when cuDNN takes no such
    /// graph (remembered).
    fn plan(&mut self, pass: Pass, shape: Shape) -> std::result::Result<Arc<Plan>, String> {
        let handle = self.handle;
        self.plans
            .entry((pass, shape))
            .or_insert_with(|| {
                let graph = match pass {
                    Pass::Forward => forward_graph(shape),
                    Pass::Backward => backward_graph(shape),
                };
                graph
                    .and_then(|g| build_plan(handle, g))
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    /// Device address of a workspace of at least `bytes` (grown, never shrunk: stream order
    /// keeps a replaced buffer alive until the work queued before it is done).
    fn workspace(&mut self, bytes: usize) -> Result<u64> {
        let bytes = bytes.max(256);
        if self.workspace.as_ref().is_none_or(|w| w.len() < bytes) {
            // SAFETY: scratch memory, written by cuDNN before it reads it.
            let w = unsafe { self.stream.alloc::<u8>(bytes) }
                .map_err(|e| ModelError::Candle(candle_core::Error::wrap(e)))?;
            self.workspace = Some(w);
        }
        let w = self.workspace.as_ref().expect("allocated above");
        let (ptr, _record) = w.device_ptr(&self.stream);
        Ok(ptr)
    }

    fn execute(
        &self,
        plan: &Plan,
        uids: &[i64],
        pointers: &[*mut c_void],
        workspace: u64,
    ) -> Result<()> {
        let pack = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        pack.set(
            Name::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            Type::CUDNN_TYPE_INT64,
            uids,
        )?;
        pack.set(
            Name::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            Type::CUDNN_TYPE_VOID_PTR,
            pointers,
        )?;
        pack.set(
            Name::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            Type::CUDNN_TYPE_VOID_PTR,
            &[workspace as *mut c_void],
        )?;
        pack.finalize()?;
        // SAFETY: the plan and pack are finalized; every pointer in the pack addresses memory of
        // its tensor's layout (the callers' contract) or a host scalar alive for this call.
        check(
            unsafe { sys::cudnnBackendExecute(self.handle, plan.plan.0, pack.0) },
            "execute",
        )
    }
}

fn dev_ptr(p: u64) -> *mut c_void {
    p as *mut c_void
}

/// Why cuDNN cannot run `pass` at `shape` on `dev` (`Ok(())` when it can): for the tests.
pub(crate) fn support(
    dev: &CudaDevice,
    pass: Pass,
    shape: Shape,
) -> Result<std::result::Result<(), String>> {
    let Some(h) = cudnn_for(dev)? else {
        return Ok(Err(format!("cuDNN older than {MIN_VERSION}")));
    };
    let mut c = h.lock().unwrap_or_else(|e| e.into_inner());
    Ok(c.plan(pass, shape).map(|_| ()))
}

/// Queues the forward on `dev`'s stream. `Ok(false)`: cuDNN does not take this shape (nothing
/// queued).
///
/// # Safety (of the arguments)
/// The pointers address the tensors [`ForwardArgs`] names at `shape`, 16-byte aligned.
pub(crate) fn forward(dev: &CudaDevice, shape: Shape, a: &ForwardArgs) -> Result<bool> {
    let Some(h) = cudnn_for(dev)? else {
        return Ok(false);
    };
    let mut c = h.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(plan) = c.plan(Pass::Forward, shape) else {
        return Ok(false);
    };
    let workspace = c.workspace(plan.engine_workspace)?;
    // Byte offset of k (and of v from k) in a row of qkv.
    let c_bytes = (shape.heads * shape.head_size * 2) as u64;
    let mut scale = 1.0 / (shape.head_size as f32).sqrt();
    let mut neg_inf = f32::NEG_INFINITY;
    let uids = [
        uid::Q,
        uid::K_T,
        uid::V,
        uid::O,
        uid::STATS,
        uid::SCALE,
        uid::NEG_INF,
    ];
    let pointers = [
        dev_ptr(a.qkv),
        dev_ptr(a.qkv + c_bytes),
        dev_ptr(a.qkv + 2 * c_bytes),
        dev_ptr(a.y),
        dev_ptr(a.lse),
        &mut scale as *mut f32 as *mut c_void,
        &mut neg_inf as *mut f32 as *mut c_void,
    ];
    c.execute(&plan, &uids, &pointers, workspace)?;
    Ok(true)
}

/// Queues the backward on `dev`'s stream. `Ok(false)`: cuDNN does not take this shape.
///
/// # Safety (of the arguments)
/// The pointers address the tensors [`BackwardArgs`] names at `shape`, 16-byte aligned.
pub(crate) fn backward(dev: &CudaDevice, shape: Shape, a: &BackwardArgs) -> Result<bool> {
    let Some(h) = cudnn_for(dev)? else {
        return Ok(false);
    };
    let mut c = h.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(plan) = c.plan(Pass::Backward, shape) else {
        return Ok(false);
    };
    // Our part of the workspace first, as the frontend lays it out: the dq accumulator, then the
    // softmax sum, each 256-byte aligned, then the engine's.
    let Shape {
        batch: b,
        heads: h_,
        seq: t,
        head_size: d,
    } = shape;
    let align = |x: usize| x.div_ceil(256) * 256;
    let accum_bytes = align(b * h_ * t * d * 4);
    let sum_bytes = align(b * h_ * t * 4);
    let workspace = c.workspace(accum_bytes + sum_bytes + plan.engine_workspace)?;
    let (accum, sum, engine) = (
        workspace,
        workspace + accum_bytes as u64,
        workspace + (accum_bytes + sum_bytes) as u64,
    );
    let c_bytes = (h_ * d * 2) as u64;
    let mut scale = 1.0 / (d as f32).sqrt();
    let mut one = 1.0f32;
    let mut neg_inf = f32::NEG_INFINITY;
    let uids = [
        uid::Q,
        uid::K_T,
        uid::V_T,
        uid::O,
        uid::STATS,
        uid::DO,
        uid::DQ,
        uid::DK,
        uid::DV,
        uid::SOFTMAX_SUM,
        uid::DQ_ACCUM,
        uid::SCALE,
        uid::ONE,
        uid::NEG_INF,
    ];
    let pointers = [
        dev_ptr(a.qkv),
        dev_ptr(a.qkv + c_bytes),
        dev_ptr(a.qkv + 2 * c_bytes),
        dev_ptr(a.y),
        dev_ptr(a.lse),
        dev_ptr(a.dy),
        dev_ptr(a.dqkv),
        dev_ptr(a.dqkv + c_bytes),
        dev_ptr(a.dqkv + 2 * c_bytes),
        dev_ptr(sum),
        dev_ptr(accum),
        &mut scale as *mut f32 as *mut c_void,
        &mut one as *mut f32 as *mut c_void,
        &mut neg_inf as *mut f32 as *mut c_void,
    ];
    c.execute(&plan, &uids, &pointers, engine)?;
    Ok(true)
}
