//! GEMMs on the GPU through cuBLASLt (feature `cuda`), in row-major terms, with the epilogues
//! the layers use: a bias added to every row, and a residual matrix added (`D = A B + bias + C`
//! with C and D distinct). bf16 inputs, f32 accumulation and scaling, bf16 or f32 output. No
//! transpose is ever copied: a row-major `(R, S)` matrix is cuBLAS's column-major `(S, R)`, so
//! every product here is one cuBLASLt call with the right transpose flags.
//!
//! One cuBLASLt handle and a 32 MiB workspace per CUDA stream, made at first use. The algorithm
//! is cuBLASLt's first heuristic pick for the shape, kept per (shape, flags) for the process.

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
}

// SAFETY: the handle is only used with its own stream; cuBLASLt handles may be shared between
// threads when calls on them are not concurrent, which the per-stream mutex below ensures.
unsafe impl Send for Lt {}

fn lt_error(e: impl std::fmt::Debug) -> ModelError {
    ModelError::Candle(candle_core::Error::Msg(format!("cuBLASLt: {e:?}")))
}

/// Key of an algorithm choice: every argument of the heuristic query.
type AlgoKey = (u64, u64, u64, bool, bool, i64, i64, i64, u8, u8, bool, bool);

fn handles() -> &'static Mutex<HashMap<usize, Arc<Mutex<Lt>>>> {
    static H: OnceLock<Mutex<HashMap<usize, Arc<Mutex<Lt>>>>> = OnceLock::new();
    H.get_or_init(Default::default)
}

fn algos() -> &'static Mutex<HashMap<AlgoKey, sys::cublasLtMatmulAlgo_t>> {
    static A: OnceLock<Mutex<HashMap<AlgoKey, sys::cublasLtMatmulAlgo_t>>> = OnceLock::new();
    A.get_or_init(Default::default)
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
    }));
    map.insert(key, h.clone());
    Ok(h)
}

fn cuda_type(d: DType) -> Result<sys::cudaDataType> {
    match d {
        DType::BF16 => Ok(sys::cudaDataType::CUDA_R_16BF),
        DType::F32 => Ok(sys::cudaDataType::CUDA_R_32F),
        d => Err(candle_core::Error::UnsupportedDTypeForOp(d, "gemm").into()),
    }
}

/// A column-major product `D (m, n) = op(A) op(B) [+ bias (m)] [+ C (m, n)]` (cuBLAS terms).
/// Pointers are device addresses; `a_type`/`b_type` are the inputs' dtypes (bf16), `d_type`
/// the output's (bf16 or f32; C has D's type and leading dimension).
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
    /// Added to every column of D (one value per row `i < m`), D's type.
    pub bias: Option<u64>,
    /// `beta = 1` with this C.
    pub c: Option<u64>,
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

/// # Safety (of the arguments)
/// Every pointer must address a matrix of the stated shape and leading dimension on `dev`.
pub(crate) fn run(dev: &CudaDevice, g: &Gemm) -> Result<()> {
    let _span = kernels::profile::scope_cuda(dev, kernels::profile::Family::Gemm);
    let h = lt_for(dev)?;
    let lt_guard = h.lock().unwrap_or_else(|e| e.into_inner());
    let in_t = cuda_type(g.in_type)?;
    let d_t = cuda_type(g.d_type)?;
    let desc = Desc(
        lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_error)?,
    );
    let set = |attr, ptr: *const c_void, size: usize| -> Result<()> {
        // SAFETY: attribute values of the documented types and sizes.
        unsafe { lt::set_matmul_desc_attribute(desc.0, attr, ptr, size) }.map_err(lt_error)
    };
    use candle_core::cuda_backend::cudarc::cublas::sys::cublasOperation_t as Op;
    use sys::cublasLtMatmulDescAttributes_t as A;
    let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
    let (ta, tb) = (op(g.trans_a), op(g.trans_b));
    set(
        A::CUBLASLT_MATMUL_DESC_TRANSA,
        &ta as *const _ as _,
        size_of_val(&ta),
    )?;
    set(
        A::CUBLASLT_MATMUL_DESC_TRANSB,
        &tb as *const _ as _,
        size_of_val(&tb),
    )?;
    let epilogue = if g.bias.is_some() {
        sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
    } else {
        sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT
    };
    set(
        A::CUBLASLT_MATMUL_DESC_EPILOGUE,
        &epilogue as *const _ as _,
        size_of_val(&epilogue),
    )?;
    if let Some(bias) = &g.bias {
        set(
            A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            bias as *const u64 as _,
            size_of::<u64>(),
        )?;
    }
    let (a_rows, a_cols) = if g.trans_a { (g.k, g.m) } else { (g.m, g.k) };
    let (b_rows, b_cols) = if g.trans_b { (g.n, g.k) } else { (g.k, g.n) };
    let a_l = layout(in_t, a_rows, a_cols, g.lda)?;
    let b_l = layout(in_t, b_rows, b_cols, g.ldb)?;
    let d_l = layout(d_t, g.m, g.n, g.ldd)?;
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
        g.bias.is_some(),
        g.c.is_some(),
    );
    let cached = algos()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .copied();
    let algo = match cached {
        Some(a) => a,
        None => {
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
            // SAFETY: every descriptor above is alive.
            let h = unsafe {
                lt::get_matmul_algo_heuristic(
                    lt_guard.handle,
                    desc.0,
                    a_l.0,
                    b_l.0,
                    d_l.0,
                    d_l.0,
                    pref.0,
                )
            }
            .map_err(lt_error)?;
            algos()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, h.algo);
            h.algo
        }
    };
    let alpha = 1f32;
    let beta = if g.c.is_some() { 1f32 } else { 0f32 };
    let c = g.c.unwrap_or(g.d);
    let (ws, _ws_record) = lt_guard.workspace.device_ptr(&lt_guard.stream);
    // SAFETY: the caller's contract on the pointers; descriptors alive; the workspace is ours.
    unsafe {
        lt::matmul(
            lt_guard.handle,
            desc.0,
            &alpha as *const f32 as _,
            &beta as *const f32 as _,
            g.a as *const c_void,
            a_l.0,
            g.b as *const c_void,
            b_l.0,
            c as *const c_void,
            d_l.0,
            g.d as *mut c_void,
            d_l.0,
            &algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            lt_guard.stream.cu_stream() as _,
        )
    }
    .map_err(lt_error)
}
