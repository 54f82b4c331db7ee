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
//! One cuDNN handle and workspace per CUDA stream; an execution plan per (pass, shape),
//! made at first use (the backward's engine compiles for about 2 s) and kept. A shape that no
//! engine takes is remembered as unsupported, and the caller runs our kernels instead.

mod graph;
mod sdpa;

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use candle_core::cuda_backend::CudaDevice;
use cudarc::cudnn::sys;

use crate::error::{ModelError, Result};
use graph::{build_plan, check, Desc, Kind, Name, Plan, Type};
use sdpa::uid;

/// The oldest cuDNN these graphs are built for: from 9.10 the mask value is `-inf` (before, the
/// frontend used the lowest float) and the dq accumulator needs no zeroing (from 9.6).
const MIN_VERSION: usize = 9_10_00;

/// Which pass a plan computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pass {
    Forward,
    Backward,
}

/// `(B, NH, T, hs)` of one attention call, and its `KV` key/value heads (`KV = NH` for
/// multi-head attention, a divisor of `NH` for grouped-query attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub seq: usize,
    pub head_size: usize,
}

impl Shape {
    /// Elements of a row of the packed projection `qkv`: `(NH + 2 KV) hs`.
    pub(crate) fn row(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_size
    }
}

/// Device pointers of the forward: `qkv (B, T, W)` bf16 in (`W` = [`Shape::row`], columns
/// `[q | k | v]`); `y (B, T, NH hs)` bf16 and `lse (B, NH, T)` f32 out.
pub(crate) struct ForwardArgs {
    pub qkv: u64,
    pub y: u64,
    pub lse: u64,
}

/// Device pointers of the backward: the forward's `qkv`, `y`, `lse` and `dy (B, T, NH hs)` in;
/// `dqkv (B, T, W)` bf16 out (every element written).
pub(crate) struct BackwardArgs {
    pub qkv: u64,
    pub y: u64,
    pub lse: u64,
    pub dy: u64,
    pub dqkv: u64,
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
    // SAFETY: a live handle and the device's stream, which outlives it (both live as long as
    // the device).
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
                    Pass::Forward => sdpa::forward_graph(shape),
                    Pass::Backward => sdpa::backward_graph(shape),
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
            unsafe { sys::cudnnBackendExecute(self.handle, plan.plan.raw(), pack.raw()) },
            "execute",
        )
    }
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

/// Runs `pass` at `shape` on `dev`'s stream. The workspace holds `own_bytes` of ours first (the
/// backward's dq accumulator and softmax sum), then the engine's; `bind(workspace)` returns the
/// variant pack's device tensors as (uid, address) pairs, to which the scalars are added here.
/// `Ok(false)`: cuDNN does not take this shape (nothing queued).
fn run(
    dev: &CudaDevice,
    pass: Pass,
    shape: Shape,
    own_bytes: usize,
    bind: impl FnOnce(u64) -> Vec<(i64, u64)>,
) -> Result<bool> {
    let Some(h) = cudnn_for(dev)? else {
        return Ok(false);
    };
    let mut c = h.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(plan) = c.plan(pass, shape) else {
        return Ok(false);
    };
    let workspace = c.workspace(own_bytes + plan.engine_workspace)?;
    let (mut uids, mut pointers): (Vec<i64>, Vec<*mut c_void>) = bind(workspace)
        .into_iter()
        .map(|(uid, p)| (uid, p as *mut c_void))
        .unzip();
    // By-value scalars: host addresses, read when the kernels are queued.
    let mut scale = 1.0 / (shape.head_size as f32).sqrt();
    let mut neg_inf = f32::NEG_INFINITY;
    let mut one = 1.0f32;
    uids.extend([uid::SCALE, uid::NEG_INF]);
    pointers.extend([
        &mut scale as *mut f32 as *mut c_void,
        &mut neg_inf as *mut f32 as *mut c_void,
    ]);
    if pass == Pass::Backward {
        uids.push(uid::ONE);
        pointers.push(&mut one as *mut f32 as *mut c_void);
    }
    c.execute(&plan, &uids, &pointers, workspace + own_bytes as u64)?;
    Ok(true)
}

/// Byte offsets of k and of v in a row of `qkv (B, T, W)`.
fn kv_offsets(shape: Shape) -> (u64, u64) {
    let hs2 = (shape.head_size * 2) as u64;
    (
        shape.heads as u64 * hs2,
        (shape.heads + shape.kv_heads) as u64 * hs2,
    )
}

/// Queues the forward on `dev`'s stream. `Ok(false)`: cuDNN does not take this shape (nothing
/// queued).
///
/// # Safety (of the arguments)
/// The pointers address the tensors [`ForwardArgs`] names at `shape`, 16-byte aligned.
pub(crate) fn forward(dev: &CudaDevice, shape: Shape, a: &ForwardArgs) -> Result<bool> {
    let (k, v) = kv_offsets(shape);
    run(dev, Pass::Forward, shape, 0, |_| {
        vec![
            (uid::Q, a.qkv),
            (uid::K_T, a.qkv + k),
            (uid::V, a.qkv + v),
            (uid::O, a.y),
            (uid::STATS, a.lse),
        ]
    })
}

/// Queues the backward on `dev`'s stream. `Ok(false)`: cuDNN does not take this shape.
///
/// # Safety (of the arguments)
/// The pointers address the tensors [`BackwardArgs`] names at `shape`, 16-byte aligned.
pub(crate) fn backward(dev: &CudaDevice, shape: Shape, a: &BackwardArgs) -> Result<bool> {
    // Ours first in the workspace, as the frontend lays it out: the f32 dq accumulator, then the
    // softmax sum, each 256-byte aligned; then the engine's.
    let Shape {
        batch,
        heads,
        seq,
        head_size,
        ..
    } = shape;
    let align = |x: usize| x.div_ceil(256) * 256;
    let accum_bytes = align(batch * heads * seq * head_size * 4);
    let sum_bytes = align(batch * heads * seq * 4);
    let (k, v) = kv_offsets(shape);
    run(dev, Pass::Backward, shape, accum_bytes + sum_bytes, |ws| {
        vec![
            (uid::Q, a.qkv),
            (uid::K_T, a.qkv + k),
            (uid::V_T, a.qkv + v),
            (uid::O, a.y),
            (uid::STATS, a.lse),
            (uid::DO, a.dy),
            (uid::DQ, a.dqkv),
            (uid::DK, a.dqkv + k),
            (uid::DV, a.dqkv + v),
            (uid::DQ_ACCUM, ws),
            (uid::SOFTMAX_SUM, ws + accum_bytes as u64),
        ]
    })
}
