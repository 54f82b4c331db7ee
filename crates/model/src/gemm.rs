//! GEMMs on the GPU through cuBLASLt (feature `cuda`), in row-major terms, with the epilogues
//! the layers use: a bias added to every row, a residual matrix added (`D = A B + bias + C`
//! with C and D distinct), GELU with its input kept, and GELU's backward with a bias gradient.
//! bf16 inputs, f32 accumulation and scaling, bf16 or f32 output. No transpose is ever copied:
//! a row-major `(R, S)` matrix is cuBLAS's column-major `(S, R)`, so every product here is one
//! cuBLASLt call with the right transpose flags.
//!
//! FP8 (issue 40): E4M3 inputs with [`BlockScales`], the block scaling cuBLASLt has on Hopper
//! since CUDA 12.9 (`VEC128_32F` for 1 x 128 blocks along K, `BLK128x128_32F` for weight
//! tiles; not both operands in tiles). Hopper's FP8 MMA reads both operands K-contiguous, so an
//! FP8 product is always TN in cuBLAS terms (`trans_a`, not `trans_b`); the quantisers of
//! `kernels/cuda/fp8.cu` write the codes that way, transposing where the layer needs it.
//!
//! One cuBLASLt handle and a 32 MiB workspace per CUDA stream, made at first use. Each shape's
//! descriptors and algorithm (cuBLASLt's first heuristic pick) are made once and kept with the
//! handle, so a call costs only the pointer attributes and the launch on the host.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::cublaslt::{result as lt, sys};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use candle_core::cuda_backend::CudaDevice;
use candle_core::DType;

use crate::error::{ModelError, Result};

/// cuBLASLt's recommended workspace on Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLASLt handle and its workspace, bound to one stream.
struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    /// Descriptors, layouts and algorithm of every shape seen on this stream.
    plans: HashMap<AlgoKey, Plan>,
}

// SAFETY: the handle is only used with its own stream; cuBLASLt handles may be shared between
// threads when calls on them are not concurrent, which the per-stream mutex below ensures.
unsafe impl Send for Lt {}

fn lt_error(e: impl std::fmt::Debug) -> ModelError {
    ModelError::Candle(candle_core::Error::Msg(format!("cuBLASLt: {e:?}")))
}

/// Key of an algorithm choice: every argument of the heuristic query (then: whether C is read
/// and the pointers' common alignment; the FP8 scale modes).
type AlgoKey = (
    u64,
    u64,
    u64,
    bool,
    bool,
    i64,
    i64,
    i64,
    u8,
    u8,
    u8,
    (bool, u32, Option<(u32, u32)>),
);

/// The largest power of two up to 256 that divides every matrix address of `g`: what the
/// algorithm may assume (cuBLASLt's heuristic assumes 256 bytes unless told less, and views into
/// a unit's flat buffer or a packed projection's columns can sit at any 16-byte boundary).
fn alignment(g: &Gemm) -> u32 {
    let all = g.a | g.b | g.d | g.c.unwrap_or(0) | 256;
    1 << all.trailing_zeros().min(8)
}

fn handles() -> &'static Mutex<HashMap<usize, Arc<Mutex<Lt>>>> {
    static H: OnceLock<Mutex<HashMap<usize, Arc<Mutex<Lt>>>>> = OnceLock::new();
    H.get_or_init(Default::default)
}

/// The handle of `dev`'s stream, made at first use.
fn lt_for(dev: &CudaDevice) -> Result<Arc<Mutex<Lt>>> {
    let stream = dev.cuda_stream();
    let key = stream.cu_stream() as usize;
    let mut map = handles().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = map.get(&key) {
        return Ok(h.clone());
    }
    let handle = lt::create_handle().map_err(lt_error)?;
    // SAFETY: scratch memory of cuBLASLt, never read by us.
    let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
        .map_err(|e| ModelError::Candle(candle_core::Error::wrap(e)))?;
    let h = Arc::new(Mutex::new(Lt {
        handle,
        workspace,
        stream,
        plans: HashMap::new(),
    }));
    map.insert(key, h.clone());
    Ok(h)
}

fn cuda_type(d: DType) -> Result<sys::cudaDataType> {
    match d {
        DType::BF16 => Ok(sys::cudaDataType::CUDA_R_16BF),
        DType::F32 => Ok(sys::cudaDataType::CUDA_R_32F),
        DType::F8E4M3 => Ok(sys::cudaDataType::CUDA_R_8F_E4M3),
        d => Err(candle_core::Error::UnsupportedDTypeForOp(d, "gemm").into()),
    }
}

/// What cuBLASLt does to the product before storing D (`m` = rows of D, column-major).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Epilogue {
    /// `D = op(A) op(B) [+ C]`.
    None,
    /// `D = op(A) op(B) + bias [+ C]`, `bias` one value a row (D's type).
    Bias(u64),
    /// `aux = op(A) op(B) + bias`, `D = gelu(aux)` (tanh form): a forward linear layer and
    /// its GELU, keeping the GELU's input for backward. `aux` has D's type and shape.
    GeluAuxBias { bias: u64, aux: u64 },
    /// `D = (op(A) op(B)) * gelu'(aux)` and `bias_grad[i] = sum_j D[i, j]`: the backward of a
    /// GELU and the bias gradient of the layer before it, in one GEMM.
    DGeluBGrad { aux: u64, bias_grad: u64 },
}

impl Epilogue {
    fn code(self) -> u8 {
        match self {
            Epilogue::None => 0,
            Epilogue::Bias(_) => 1,
            Epilogue::GeluAuxBias { .. } => 2,
            Epilogue::DGeluBGrad { .. } => 3,
        }
    }
}

/// How an FP8 operand's f32 scales cover it (cuBLASLt's `cublasLtMatmulMatrixScale_t`), for an
/// operand stored K-contiguous with `outer` rows of K: the layouts `kernels/cuda/fp8.cu` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleMode {
    /// One scale a row of the operand, the whole of K: `outer` scales (torchao's row-wise; on
    /// Hopper both operands of a GEMM must take it).
    Outer,
    /// One scale a 128 elements along K, `(K block kb, outer o)` at `kb * outer + o`.
    Vec128,
    /// One scale a 128 x 128 tile, `(outer block ob, K block kb)` at `ob * round_up(KB, 4) + kb`.
    Blk128x128,
}

impl ScaleMode {
    /// cuBLASLt's value (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F` = 3, `_VEC128_32F` = 4,
    /// `_BLK128x128_32F` = 5 in cublasLt.h since CUDA 12.9; cudarc names them only for some
    /// CUDA versions).
    fn code(self) -> u32 {
        match self {
            ScaleMode::Outer => 3,
            ScaleMode::Vec128 => 4,
            ScaleMode::Blk128x128 => 5,
        }
    }
}

/// The scales of an FP8 GEMM's two operands: device addresses and how each covers its operand.
#[derive(Clone, Copy, Debug)]
pub struct BlockScales {
    pub a: u64,
    pub a_mode: ScaleMode,
    pub b: u64,
    pub b_mode: ScaleMode,
}

/// A column-major product `D (m, n) = op(A) op(B)` with an [`Epilogue`] and optionally `+ C`
/// (cuBLAS terms).
/// Pointers are device addresses; `in_type` is the inputs' dtype (bf16, or F8E4M3 with
/// `scales`), `d_type` the output's (bf16 or f32; C has D's type and leading dimension).
pub(crate) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: u64,
    pub lda: usize,
    pub trans_a: bool,
    pub b: u64,
    pub ldb: usize,
    pub trans_b: bool,
    pub in_type: DType,
    pub d: u64,
    pub ldd: usize,
    pub d_type: DType,
    pub epilogue: Epilogue,
    /// `beta = 1` with this C.
    pub c: Option<u64>,
    /// FP8 only: the operands' block scales.
    pub scales: Option<BlockScales>,
}

struct Desc(sys::cublasLtMatmulDesc_t);
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: made by create_matmul_desc below, dropped once.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.0);
        }
    }
}
struct Layout(sys::cublasLtMatrixLayout_t);
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: made by create_matrix_layout below, dropped once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.0);
        }
    }
}
struct Pref(sys::cublasLtMatmulPreference_t);
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: made by create_matmul_pref below, dropped once.
        unsafe {
            let _ = lt::destroy_matmul_pref(self.0);
        }
    }
}

fn layout(t: sys::cudaDataType, rows: usize, cols: usize, ld: usize) -> Result<Layout> {
    Ok(Layout(
        lt::create_matrix_layout(t, rows as u64, cols as u64, ld as i64).map_err(lt_error)?,
    ))
}

/// Everything of one GEMM shape that does not change from call to call: the descriptor (with
/// its transposes and epilogue kind), the three layouts and cuBLASLt's algorithm choice. Made
/// at the first call of a shape and kept with the stream's handle; only the pointers (data,
/// bias, aux) are set per call.
struct Plan {
    desc: Desc,
    a: Layout,
    b: Layout,
    d: Layout,
    algo: sys::cublasLtMatmulAlgo_t,
}

// SAFETY: the descriptors are plain host objects of cuBLASLt, used under the stream's mutex.
unsafe impl Send for Plan {}

fn set_attr(
    desc: &Desc,
    attr: sys::cublasLtMatmulDescAttributes_t,
    ptr: *const c_void,
    size: usize,
) -> Result<()> {
    // SAFETY: attribute values of the documented types and sizes.
    unsafe { lt::set_matmul_desc_attribute(desc.0, attr, ptr, size) }.map_err(lt_error)
}

fn plan(handle: sys::cublasLtHandle_t, g: &Gemm, align: u32) -> Result<Plan> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let in_t = cuda_type(g.in_type)?;
    let d_t = cuda_type(g.d_type)?;
    let desc = Desc(
        lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_error)?,
    );
    use candle_core::cuda_backend::cudarc::cublas::sys::cublasOperation_t as Op;
    let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
    let (ta, tb) = (op(g.trans_a), op(g.trans_b));
    set_attr(
        &desc,
        A::CUBLASLT_MATMUL_DESC_TRANSA,
        &ta as *const _ as _,
        size_of_val(&ta),
    )?;
    set_attr(
        &desc,
        A::CUBLASLT_MATMUL_DESC_TRANSB,
        &tb as *const _ as _,
        size_of_val(&tb),
    )?;
    use sys::cublasLtEpilogue_t as E;
    let epilogue = match g.epilogue {
        Epilogue::None => E::CUBLASLT_EPILOGUE_DEFAULT,
        Epilogue::Bias(_) => E::CUBLASLT_EPILOGUE_BIAS,
        Epilogue::GeluAuxBias { .. } => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        Epilogue::DGeluBGrad { .. } => E::CUBLASLT_EPILOGUE_DGELU_BGRAD,
    };
    set_attr(
        &desc,
        A::CUBLASLT_MATMUL_DESC_EPILOGUE,
        &epilogue as *const _ as _,
        size_of_val(&epilogue),
    )?;
    if let (Some(_), Epilogue::Bias(_)) = (g.scales, g.epilogue) {
        // An FP8 GEMM's bias is bf16, D's type, set explicitly (as the device probe that
        // measured the epilogue set it).
        set_attr(
            &desc,
            A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
            &d_t as *const _ as _,
            size_of_val(&d_t),
        )?;
    }
    if let Some(s) = g.scales {
        for (attr, mode) in [
            (A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, s.a_mode.code()),
            (A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, s.b_mode.code()),
        ] {
            set_attr(&desc, attr, &mode as *const u32 as _, size_of::<u32>())?;
        }
    }
    set_pointers(&desc, g)?;
    let (a_rows, a_cols) = if g.trans_a { (g.k, g.m) } else { (g.m, g.k) };
    let (b_rows, b_cols) = if g.trans_b { (g.n, g.k) } else { (g.k, g.n) };
    let a = layout(in_t, a_rows, a_cols, g.lda)?;
    let b = layout(in_t, b_rows, b_cols, g.ldb)?;
    let d = layout(d_t, g.m, g.n, g.ldd)?;
    let pref = Pref(lt::create_matmul_pref().map_err(lt_error)?);
    // SAFETY: a usize attribute, as documented.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.0,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &WORKSPACE_BYTES as *const usize as _,
            size_of::<usize>(),
        )
    }
    .map_err(lt_error)?;
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    for attr in [
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    ] {
        // SAFETY: a uint32_t attribute, as documented.
        unsafe {
            lt::set_matmul_pref_attribute(pref.0, attr, &align as *const u32 as _, size_of::<u32>())
        }
        .map_err(lt_error)?;
    }
    // SAFETY: every descriptor above is alive.
    let heuristic =
        unsafe { lt::get_matmul_algo_heuristic(handle, desc.0, a.0, b.0, d.0, d.0, pref.0) }
            .map_err(lt_error)?;
    Ok(Plan {
        desc,
        a,
        b,
        d,
        algo: heuristic.algo,
    })
}

/// Sets the per-call pointers of `g`'s epilogue (bias, aux) on `desc`.
fn set_pointers(desc: &Desc, g: &Gemm) -> Result<()> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let (bias, aux) = match g.epilogue {
        Epilogue::None => (None, None),
        Epilogue::Bias(b) => (Some(b), None),
        Epilogue::GeluAuxBias { bias, aux } => (Some(bias), Some(aux)),
        Epilogue::DGeluBGrad { aux, bias_grad } => (Some(bias_grad), Some(aux)),
    };
    if let Some(bias) = &bias {
        set_attr(
            desc,
            A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            bias as *const u64 as _,
            size_of::<u64>(),
        )?;
    }
    if let Some(s) = &g.scales {
        for (attr, p) in [
            (A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &s.a),
            (A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &s.b),
        ] {
            set_attr(desc, attr, p as *const u64 as _, size_of::<u64>())?;
        }
    }
    if let Some(aux) = &aux {
        let aux_ld = g.ldd as i64;
        set_attr(
            desc,
            A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
            aux as *const u64 as _,
            size_of::<u64>(),
        )?;
        set_attr(
            desc,
            A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
            &aux_ld as *const i64 as _,
            size_of::<i64>(),
        )?;
    }
    Ok(())
}

/// Queues `g` on `dev`'s stream.
///
/// # Safety (of the arguments)
/// Every pointer must address a matrix of the stated shape and leading dimension on `dev`.
pub(crate) fn run(dev: &CudaDevice, g: &Gemm) -> Result<()> {
    let _span = kernels::profile::scope_cuda_shape(dev, kernels::profile::Family::Gemm, || {
        let t = |b: bool| if b { 'T' } else { 'N' };
        let name = format!(
            "m {} n {} k {} {}{} {:?}->{:?} epilogue {}{}",
            g.m,
            g.n,
            g.k,
            t(g.trans_a),
            t(g.trans_b),
            g.in_type,
            g.d_type,
            g.epilogue.code(),
            if g.c.is_some() { " +C" } else { "" }
        );
        (name, 2.0 * g.m as f64 * g.n as f64 * g.k as f64)
    });
    let h = lt_for(dev)?;
    let mut lt_guard = h.lock().unwrap_or_else(|e| e.into_inner());
    let align = alignment(g);
    let key: AlgoKey = (
        g.m as u64,
        g.n as u64,
        g.k as u64,
        g.trans_a,
        g.trans_b,
        g.lda as i64,
        g.ldb as i64,
        g.ldd as i64,
        g.in_type as u8,
        g.d_type as u8,
        g.epilogue.code(),
        (
            g.c.is_some(),
            align,
            g.scales.map(|s| (s.a_mode.code(), s.b_mode.code())),
        ),
    );
    if !lt_guard.plans.contains_key(&key) {
        let p = plan(lt_guard.handle, g, align)?;
        lt_guard.plans.insert(key, p);
    }
    let lt_ref = &*lt_guard;
    let p = &lt_ref.plans[&key];
    set_pointers(&p.desc, g)?;
    let alpha = 1f32;
    let beta = if g.c.is_some() { 1f32 } else { 0f32 };
    let c = g.c.unwrap_or(g.d);
    let (ws, _ws_record) = lt_ref.workspace.device_ptr(&lt_ref.stream);
    // SAFETY: the caller's contract on the pointers; descriptors alive; the workspace is ours.
    unsafe {
        lt::matmul(
            lt_ref.handle,
            p.desc.0,
            &alpha as *const f32 as _,
            &beta as *const f32 as _,
            g.a as *const c_void,
            p.a.0,
            g.b as *const c_void,
            p.b.0,
            c as *const c_void,
            p.d.0,
            g.d as *mut c_void,
            p.d.0,
            &p.algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            lt_ref.stream.cu_stream() as _,
        )
    }
    .map_err(lt_error)
}
