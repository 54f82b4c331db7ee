//! CUDA kernels of the quantisers (DESIGN.md section 6): CUDA C compiled at run time with
//! NVRTC, one module per block size (the block is a compile-time constant, so each lane keeps
//! its share of a block in registers and the loops unroll).
//!
//! Launch shape: one warp per quantisation block, 8 warps (256 threads) a CTA; a lane loads
//! 16 bytes at a time (float4; 4 or 8 elements a lane a step), the block's absmax is an integer
//! max over `bits & 0x7fffffff` reduced with warp shuffles, and the codes are written 4 bytes a
//! lane a step. The INT8 dequantiser gives 16 codes to a thread (one 16-byte load).
//!
//! Exactness: the arithmetic is that of `block.rs`, written with explicit IEEE intrinsics
//! (`__fdiv_rn`, `__fmul_rn`, `__fadd_rn`), compiled with `--fmad=false` and no fast-math and no
//! flush-to-zero, so every code, scale and dequantised value equals the CPU reference bitwise.
//! bf16 output is the f32 value rounded to nearest even (the `half` crate's rule).
//!
//! Non-finite input: no host synchronisation is made to look for it. A block holding an inf or
//! NaN gets a NaN scale and codes 0, so it dequantises to NaN; the engine's loss / gradient-norm
//! finiteness checks catch it. (The CPU path refuses it with `QuantError::NonFinite`.)
//!
//! Requirements on the GPU path: block % 32 == 0 (checked by `tensor.rs`); block sizes above
//! 4096 work but keep more than 128 values a lane in registers (spills).

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Storage, Tensor};

use crate::QuantError;

type Result<T> = std::result::Result<T, QuantError>;

/// Warps (= quantisation blocks) per CTA of the per-block kernels.
const WARPS: u32 = 8;
/// Threads per CTA of the elementwise kernels.
const THREADS: u32 = 256;
/// Codes per thread of the INT8 dequantiser.
const DEQ_PER_THREAD: usize = 16;

/// Kernel source shared by every block size; compiled with `#define BLOCK <block>` in front.
pub const QUANT_KERNELS: &str = r#"
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define ABS_MASK 0x7fffffffu
#define NON_FINITE 0x7f800000u
#define F32_MAX 3.40282346638528859812e+38f
#define WARPS 8
#define GROUP 4

__device__ __forceinline__ u32 warp_max(u32 m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u32 v = __shfl_xor_sync(0xffffffffu, m, o);
        m = v > m ? v : m;
    }
    return m;
}

__device__ __forceinline__ u32 absbits(float v) { return __float_as_uint(v) & ABS_MASK; }

// block.rs scale_of; a non-finite absmax gives a NaN scale (the CPU path errors instead).
__device__ __forceinline__ float scale_of(u32 m, float qmax) {
    if (m >= NON_FINITE) return __uint_as_float(0x7fc00000u);
    float s = __fdiv_rn(__uint_as_float(m), qmax);
    if (__fmul_rn(s, qmax) > F32_MAX) s = __uint_as_float(__float_as_uint(s) - 1u);
    return s;
}

// block.rs code: round_half_away(clamp(v / s, -qmax, qmax)), exact.
__device__ __forceinline__ int code(float v, float s, float qmax) {
    float y = __fdiv_rn(v, s);
    y = fminf(fmaxf(y, -qmax), qmax);
    float t = truncf(y);
    float f = __fsub_rn(y, t);
    return (int)t + (f >= 0.5f ? 1 : 0) - (f <= -0.5f ? 1 : 0);
}

__device__ __forceinline__ u32 pack4(int lo, int hi) { return ((u32)lo & 0xfu) | (((u32)hi & 0xfu) << 4); }
__device__ __forceinline__ int nib_lo(u32 b) { return ((int)(b << 28)) >> 28; }
__device__ __forceinline__ int nib_hi(u32 b) { return ((int)(b << 24)) >> 28; }

// half::bf16::from_f32: round to nearest even, NaN kept quiet.
__device__ __forceinline__ u32 f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & ABS_MASK) > NON_FINITE) return (x >> 16) | 0x40u;
    if ((x & 0x8000u) != 0 && (x & (3u * 0x8000u - 1u)) != 0) return (x >> 16) + 1u;
    return x >> 16;
}

__device__ __forceinline__ i64 warp_id() {
    return (i64)blockIdx.x * WARPS + (threadIdx.x >> 5);
}

// x [n] f32 -> codes [n] (i8 bits), scales [nblocks]. One warp per block.
extern "C" __global__ void __launch_bounds__(256) quantize_int8(
    const float* __restrict__ x, u8* __restrict__ codes, float* __restrict__ scales,
    i64 n, i64 nblocks) {
    constexpr int EPT = (BLOCK % 128 == 0) ? 4 : 1;
    constexpr int NIT = BLOCK / (32 * EPT);
    const int lane = threadIdx.x & 31;
    const i64 b = warp_id();
    if (b >= nblocks) return;
    const i64 base = b * BLOCK;
    const int blen = (n - base) < BLOCK ? (int)(n - base) : BLOCK;
    float v[NIT * EPT];
    u32 m = 0;
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
        const int e = (it * 32 + lane) * EPT;
        if (EPT == 4 && e + 4 <= blen) {
            const float4 f = *reinterpret_cast<const float4*>(x + base + e);
            v[it * EPT] = f.x;
            v[it * EPT + (EPT > 1 ? 1 : 0)] = f.y;
            v[it * EPT + (EPT > 2 ? 2 : 0)] = f.z;
            v[it * EPT + (EPT > 3 ? 3 : 0)] = f.w;
        } else {
#pragma unroll
            for (int k = 0; k < EPT; ++k) v[it * EPT + k] = (e + k < blen) ? x[base + e + k] : 0.0f;
        }
    }
#pragma unroll
    for (int i = 0; i < NIT * EPT; ++i) { u32 a = absbits(v[i]); m = a > m ? a : m; }
    m = warp_max(m);
    const float s = scale_of(m, 127.0f);
    if (lane == 0) scales[b] = s;
    const bool nz = s > 0.0f;  // false for zero and NaN scales: codes 0
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
        const int e = (it * 32 + lane) * EPT;
        int c[EPT];
#pragma unroll
        for (int k = 0; k < EPT; ++k) c[k] = nz ? code(v[it * EPT + k], s, 127.0f) : 0;
        if (EPT == 4 && e + 4 <= blen) {
            u32 w = 0;
#pragma unroll
            for (int k = 0; k < EPT; ++k) w |= ((u32)c[k] & 0xffu) << (8 * k);
            *reinterpret_cast<u32*>(codes + base + e) = w;
        } else {
#pragma unroll
            for (int k = 0; k < EPT; ++k)
                if (e + k < blen) codes[base + e + k] = (u8)((u32)c[k] & 0xffu);
        }
    }
}

// codes [n] (i8 bits), scales [ceil(n / BLOCK)] -> out [n] f32 (16 codes a thread).
extern "C" __global__ void __launch_bounds__(256) dequantize_int8_f32(
    const u8* __restrict__ codes, const float* __restrict__ scales, float* __restrict__ out, i64 n) {
    const i64 e0 = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 16;
    if (e0 >= n) return;
    const float s = scales[e0 / BLOCK];
    if (e0 + 16 <= n) {
        const uint4 q = *reinterpret_cast<const uint4*>(codes + e0);
        const u32 w[4] = {q.x, q.y, q.z, q.w};
        float4* o = reinterpret_cast<float4*>(out + e0);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float4 f;
            f.x = __fmul_rn((float)(signed char)(w[i] & 0xffu), s);
            f.y = __fmul_rn((float)(signed char)((w[i] >> 8) & 0xffu), s);
            f.z = __fmul_rn((float)(signed char)((w[i] >> 16) & 0xffu), s);
            f.w = __fmul_rn((float)(signed char)(w[i] >> 24), s);
            o[i] = f;
        }
    } else {
        for (i64 e = e0; e < n; ++e) out[e] = __fmul_rn((float)(signed char)codes[e], s);
    }
}

// As dequantize_int8_f32, output bf16 bits (round to nearest even).
extern "C" __global__ void __launch_bounds__(256) dequantize_int8_bf16(
    const u8* __restrict__ codes, const float* __restrict__ scales, u16* __restrict__ out, i64 n) {
    const i64 e0 = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 16;
    if (e0 >= n) return;
    const float s = scales[e0 / BLOCK];
    if (e0 + 16 <= n) {
        const uint4 q = *reinterpret_cast<const uint4*>(codes + e0);
        const u32 w[4] = {q.x, q.y, q.z, q.w};
        u32 h[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 b0 = f32_to_bf16(__fmul_rn((float)(signed char)(w[i] & 0xffu), s));
            const u32 b1 = f32_to_bf16(__fmul_rn((float)(signed char)((w[i] >> 8) & 0xffu), s));
            const u32 b2 = f32_to_bf16(__fmul_rn((float)(signed char)((w[i] >> 16) & 0xffu), s));
            const u32 b3 = f32_to_bf16(__fmul_rn((float)(signed char)(w[i] >> 24), s));
            h[2 * i] = b0 | (b1 << 16);
            h[2 * i + 1] = b2 | (b3 << 16);
        }
        uint4* o = reinterpret_cast<uint4*>(out + e0);
        o[0] = make_uint4(h[0], h[1], h[2], h[3]);
        o[1] = make_uint4(h[4], h[5], h[6], h[7]);
    } else {
        for (i64 e = e0; e < n; ++e)
            out[e] = (u16)f32_to_bf16(__fmul_rn((float)(signed char)codes[e], s));
    }
}

// x [W * S] f32 -> packed [W * S / 2], scales [W * S / BLOCK], slice p (bps blocks) written at
// position (p % rpn) * nodes + p / rpn. One warp per block; S % BLOCK == 0 (so n % BLOCK == 0
// too, but the tail guard is kept so that nodes = rpn = 1, bps = nblocks is plain INT4).
extern "C" __global__ void __launch_bounds__(256) quantize_int4_swizzled(
    const float* __restrict__ x, u8* __restrict__ packed, float* __restrict__ scales,
    i64 n, i64 nblocks, i64 bps, i64 nodes, i64 rpn) {
    constexpr int EPT = (BLOCK % 256 == 0) ? 8 : 2;
    constexpr int NIT = (BLOCK + 32 * EPT - 1) / (32 * EPT);
    const int lane = threadIdx.x & 31;
    const i64 b = warp_id();
    if (b >= nblocks) return;
    const i64 p = b / bps, k = b - p * bps;
    const i64 ob = ((p % rpn) * nodes + p / rpn) * bps + k;
    const i64 base = b * BLOCK, obase = ob * BLOCK;
    const int blen = (n - base) < BLOCK ? (int)(n - base) : BLOCK;
    float v[NIT * EPT];
    u32 m = 0;
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
        const int e = (it * 32 + lane) * EPT;
        if (e + EPT <= blen) {
            if (EPT == 8) {
                const float4 f0 = *reinterpret_cast<const float4*>(x + base + e);
                const float4 f1 = *reinterpret_cast<const float4*>(x + base + e + (EPT == 8 ? 4 : 0));
                const float t[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
#pragma unroll
                for (int k2 = 0; k2 < EPT; ++k2) v[it * EPT + k2] = t[k2];
            } else {
                const float2 f = *reinterpret_cast<const float2*>(x + base + e);
                v[it * EPT] = f.x;
                v[it * EPT + 1] = f.y;
            }
        } else {
#pragma unroll
            for (int k2 = 0; k2 < EPT; ++k2) v[it * EPT + k2] = (e + k2 < blen) ? x[base + e + k2] : 0.0f;
        }
    }
#pragma unroll
    for (int i = 0; i < NIT * EPT; ++i) { u32 a = absbits(v[i]); m = a > m ? a : m; }
    m = warp_max(m);
    const float s = scale_of(m, 7.0f);
    if (lane == 0) scales[ob] = s;
    const bool nz = s > 0.0f;
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
        const int e = (it * 32 + lane) * EPT;
        u32 w = 0;
#pragma unroll
        for (int k2 = 0; k2 < EPT / 2; ++k2) {
            const int lo = nz ? code(v[it * EPT + 2 * k2], s, 7.0f) : 0;
            const int hi = nz ? code(v[it * EPT + 2 * k2 + 1], s, 7.0f) : 0;
            w |= pack4(lo, hi) << (8 * k2);
        }
        u8* dst = packed + (obase + e) / 2;
        if (e + EPT <= blen) {
            if (EPT == 8) *reinterpret_cast<u32*>(dst) = w;
            else *dst = (u8)w;
        } else {
#pragma unroll
            for (int k2 = 0; k2 < EPT / 2; ++k2)
                if (e + 2 * k2 < blen) dst[k2] = (u8)((w >> (8 * k2)) & 0xffu);
        }
    }
}

// Sum (in piece order, f32) of `pieces` INT4 pieces concatenated: packed [pieces * P],
// scales [pieces * nb], nb = ceil(2P / BLOCK), into acc (this lane's share of block b).
// Loads GROUP pieces before using them, for memory-level parallelism.
template <int EPT, int NIT>
__device__ __forceinline__ void sum_pieces(
    const u8* __restrict__ packed, const float* __restrict__ scales, int pieces, i64 P, i64 nb,
    i64 b, int lane, int blen, float* acc) {
    constexpr int BPC = EPT / 2;  // packed bytes a lane a step
    const i64 base = b * BLOCK;
    const bool vec = (P % 4) == 0;  // piece starts 4-byte aligned
    for (int j0 = 0; j0 < pieces; j0 += GROUP) {
        u32 w[GROUP][NIT];
        float s[GROUP];
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const int j = j0 + g;
            s[g] = 0.0f;
#pragma unroll
            for (int it = 0; it < NIT; ++it) w[g][it] = 0;
            if (j < pieces) {
                s[g] = scales[(i64)j * nb + b];
                const u8* pj = packed + (i64)j * P + base / 2;
#pragma unroll
                for (int it = 0; it < NIT; ++it) {
                    const int e = (it * 32 + lane) * EPT;
                    if (BPC == 4 && vec && e + EPT <= blen) {
                        w[g][it] = *reinterpret_cast<const u32*>(pj + e / 2);
                    } else {
                        u32 t = 0;
#pragma unroll
                        for (int k = 0; k < BPC; ++k)
                            if (e + 2 * k < blen) t |= (u32)pj[e / 2 + k] << (8 * k);
                        w[g][it] = t;
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const int j = j0 + g;
            if (j < pieces) {
#pragma unroll
                for (int it = 0; it < NIT; ++it) {
#pragma unroll
                    for (int k = 0; k < BPC; ++k) {
                        const u32 byte = (w[g][it] >> (8 * k)) & 0xffu;
                        const float d0 = __fmul_rn((float)nib_lo(byte), s[g]);
                        const float d1 = __fmul_rn((float)nib_hi(byte), s[g]);
                        float* a = acc + it * EPT + 2 * k;
                        if (j == 0) { a[0] = d0; a[1] = d1; }
                        else { a[0] = __fadd_rn(a[0], d0); a[1] = __fadd_rn(a[1], d1); }
                    }
                }
            }
        }
    }
    // Elements past the end of a short last block take no part.
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
        const int e = (it * 32 + lane) * EPT;
#pragma unroll
        for (int k = 0; k < EPT; ++k)
            if (e + k >= blen) acc[it * EPT + k] = 0.0f;
    }
}

// Pieces (see sum_pieces) -> f32 sum [2P]. One warp per block.
extern "C" __global__ void __launch_bounds__(256) dequantize_sum_int4(
    const u8* __restrict__ packed, const float* __restrict__ scales, float* __restrict__ out,
    int pieces, i64 P, i64 nb) {
    constexpr int EPT = (BLOCK % 256 == 0) ? 8 : 2;
    constexpr int NIT = (BLOCK + 32 * EPT - 1) / (32 * EPT);
    const int lane = threadIdx.x & 31;
    const i64 b = warp_id();
    if (b >= nb) return;
    const i64 n = 2 * P, base = b * BLOCK;
    const int blen = (n - base) < BLOCK ? (int)(n - base) : BLOCK;
    float acc[NIT * EPT];
    sum_pieces<EPT, NIT>(packed, scales, pieces, P, nb, b, lane, blen, acc);
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
        const int e = (it * 32 + lane) * EPT;
        float* o = out + base + e;
        if (e + EPT <= blen) {
            if (EPT == 8) {
                reinterpret_cast<float4*>(o)[0] = make_float4(acc[it * EPT], acc[it * EPT + 1], acc[it * EPT + 2], acc[it * EPT + 3]);
                reinterpret_cast<float4*>(o)[1] = make_float4(acc[it * EPT + (EPT == 8 ? 4 : 0)], acc[it * EPT + (EPT == 8 ? 5 : 0)], acc[it * EPT + (EPT == 8 ? 6 : 0)], acc[it * EPT + (EPT == 8 ? 7 : 0)]);
            } else {
                reinterpret_cast<float2*>(o)[0] = make_float2(acc[it * EPT], acc[it * EPT + 1]);
            }
        } else {
#pragma unroll
            for (int k = 0; k < EPT; ++k)
                if (e + k < blen) o[k] = acc[it * EPT + k];
        }
    }
}

// Pieces (see sum_pieces) -> their sum requantised: packed [P], scales [nb]. One warp per block.
extern "C" __global__ void __launch_bounds__(256) dequantize_sum_requantize_int4(
    const u8* __restrict__ packed, const float* __restrict__ scales, u8* __restrict__ qout,
    float* __restrict__ qscales, int pieces, i64 P, i64 nb) {
    constexpr int EPT = (BLOCK % 256 == 0) ? 8 : 2;
    constexpr int NIT = (BLOCK + 32 * EPT - 1) / (32 * EPT);
    const int lane = threadIdx.x & 31;
    const i64 b = warp_id();
    if (b >= nb) return;
    const i64 n = 2 * P, base = b * BLOCK;
    const int blen = (n - base) < BLOCK ? (int)(n - base) : BLOCK;
    float acc[NIT * EPT];
    sum_pieces<EPT, NIT>(packed, scales, pieces, P, nb, b, lane, blen, acc);
    u32 m = 0;
#pragma unroll
    for (int i = 0; i < NIT * EPT; ++i) { u32 a = absbits(acc[i]); m = a > m ? a : m; }
    m = warp_max(m);
    const float s = scale_of(m, 7.0f);
    if (lane == 0) qscales[b] = s;
    const bool nz = s > 0.0f;
#pragma unroll
    for (int it = 0; it < NIT; ++it) {
        const int e = (it * 32 + lane) * EPT;
        u32 w = 0;
#pragma unroll
        for (int k = 0; k < EPT / 2; ++k) {
            const int lo = nz ? code(acc[it * EPT + 2 * k], s, 7.0f) : 0;
            const int hi = nz ? code(acc[it * EPT + 2 * k + 1], s, 7.0f) : 0;
            w |= pack4(lo, hi) << (8 * k);
        }
        u8* dst = qout + (base + e) / 2;
        if (e + EPT <= blen) {
            if (EPT == 8) *reinterpret_cast<u32*>(dst) = w;
            else *dst = (u8)w;
        } else {
#pragma unroll
            for (int k = 0; k < EPT / 2; ++k)
                if (e + 2 * k < blen) dst[k] = (u8)((w >> (8 * k)) & 0xffu);
        }
    }
}
"#;

/// NVRTC options: IEEE division and square root, no FMA contraction, no flush-to-zero, so the
/// kernels round exactly like the CPU reference.
pub fn exact_options() -> CompileOptions {
    CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    }
}

/// The full source of the module for one block size.
pub fn quant_source(block: usize) -> String {
    format!("#define BLOCK {block}\n{QUANT_KERNELS}")
}

/// PTX of the module for `block`, compiled at first use and kept for the process.
pub fn quant_ptx(block: usize) -> Result<&'static str> {
    static CACHE: OnceLock<Mutex<HashMap<usize, &'static str>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = map.get(&block) {
        return Ok(p);
    }
    let ptx = compile_ptx_with_opts(quant_source(block), exact_options())
        .map_err(candle_core::Error::wrap)?;
    let ptx: &'static str = Box::leak(ptx.to_src().into_boxed_str());
    map.insert(block, ptx);
    Ok(ptx)
}

/// The kernel `name` of the module for `block`, loaded on `dev` (launch it on `dev`'s stream).
fn func(dev: &CudaDevice, name: &str, block: usize) -> Result<impl Deref<Target = CudaFunction>> {
    let ptx = quant_ptx(block)?;
    Ok(dev.get_or_load_custom_func(name, &format!("zeropp_quant_b{block}"), ptx)?)
}

/// Launch shape: `units` warps (one per block) or threads, 256 threads a CTA.
fn grid(units: usize, per_cta: u32) -> LaunchConfig {
    let threads = if per_cta == WARPS {
        32 * WARPS
    } else {
        THREADS
    };
    LaunchConfig {
        grid_dim: (units.div_ceil(per_cta as usize) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Runs `f` on the device view of the 1-D contiguous CUDA tensor `t`. A view whose start is not
/// 16-byte aligned (a narrowed tensor) is first copied to a fresh buffer, so that the kernels'
/// vector loads are aligned.
fn with_input<T: CudaDType + DeviceRepr, R>(
    t: &Tensor,
    f: impl FnOnce(&CudaView<'_, T>) -> Result<R>,
) -> Result<R> {
    let (st, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else {
        unreachable!("with_input called on a non-CUDA tensor")
    };
    let s = cs.as_cuda_slice::<T>()?;
    let (o, n) = (layout.start_offset(), t.elem_count());
    let v = s.slice(o..o + n);
    if (o * std::mem::size_of::<T>()).is_multiple_of(16) {
        return f(&v);
    }
    // SAFETY: fully written by the copy below before any read (n > 0: 0 is 16-aligned).
    let mut c = unsafe { cs.device.alloc::<T>(n)? };
    cs.device.cuda_stream().memcpy_dtod(&v, &mut c).w()?;
    f(&c.slice(..))
}

fn tensor(slice: CudaStorageSlice, dev: &CudaDevice, n: usize) -> Tensor {
    let st = CudaStorage {
        slice,
        device: dev.clone(),
    };
    Tensor::from_storage(Storage::Cuda(st), n, BackpropOp::none(), false)
}

/// Fresh device buffer of `n` elements (contents undefined; the kernels write every element).
fn alloc<T: DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every caller launches a kernel that writes all n elements before any read.
    // (At least one element: a zero-byte allocation is an error of the driver.)
    Ok(unsafe { dev.alloc::<T>(n.max(1))? })
}

fn i64_of(n: usize) -> i64 {
    n as i64
}

/// GPU `quant::tensor::quantize_int8` (arguments already checked).
pub(crate) fn quantize_int8(
    dev: &CudaDevice,
    x: &Tensor,
    block: usize,
) -> Result<(Tensor, Tensor)> {
    let n = x.elem_count();
    let nb = n.div_ceil(block);
    let mut codes = alloc::<u8>(dev, n)?;
    let mut scales = alloc::<f32>(dev, nb)?;
    if nb > 0 {
        let f = func(dev, "quantize_int8", block)?;
        with_input::<f32, _>(x, |xv| {
            let (n, nb64) = (i64_of(n), i64_of(nb));
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(xv)
                .arg(&mut codes)
                .arg(&mut scales)
                .arg(&n)
                .arg(&nb64);
            // SAFETY: argument types and lengths match the kernel's signature.
            unsafe { b.launch(grid(nb, WARPS)) }.w()?;
            Ok(())
        })?;
    }
    Ok((
        tensor(CudaStorageSlice::U8(codes), dev, n),
        tensor(CudaStorageSlice::F32(scales), dev, nb),
    ))
}

/// Allocates the output through its storage variant's constructor (which names the element
/// type, so that the bf16 case needs no `half` dependency) and launches `launch` on it.
fn with_output<T: DeviceRepr>(
    dev: &CudaDevice,
    n: usize,
    wrap: fn(CudaSlice<T>) -> CudaStorageSlice,
    launch: impl FnOnce(&mut CudaSlice<T>) -> Result<()>,
) -> Result<Tensor> {
    let mut out = alloc::<T>(dev, n)?;
    if n > 0 {
        launch(&mut out)?;
    }
    Ok(tensor(wrap(out), dev, n))
}

/// GPU `quant::tensor::dequantize_int8` (arguments already checked; dtype F32 or BF16).
pub(crate) fn dequantize_int8(
    dev: &CudaDevice,
    codes: &Tensor,
    scales: &Tensor,
    block: usize,
    dtype: DType,
) -> Result<Tensor> {
    fn run<T: DeviceRepr>(
        dev: &CudaDevice,
        codes: &Tensor,
        scales: &Tensor,
        block: usize,
        name: &str,
        wrap: fn(CudaSlice<T>) -> CudaStorageSlice,
    ) -> Result<Tensor> {
        let n = codes.elem_count();
        let f = func(dev, name, block)?;
        with_output(dev, n, wrap, |out| {
            with_input::<u8, _>(codes, |cv| {
                with_input::<f32, _>(scales, |sv| {
                    let n64 = i64_of(n);
                    let stream = dev.cuda_stream();
                    let mut b = stream.launch_builder(&f);
                    b.arg(cv).arg(sv).arg(out).arg(&n64);
                    // SAFETY: argument types and lengths match the kernel's signature.
                    unsafe { b.launch(grid(n.div_ceil(DEQ_PER_THREAD), THREADS)) }.w()?;
                    Ok(())
                })
            })
        })
    }
    match dtype {
        DType::BF16 => run(
            dev,
            codes,
            scales,
            block,
            "dequantize_int8_bf16",
            CudaStorageSlice::BF16,
        ),
        _ => run(
            dev,
            codes,
            scales,
            block,
            "dequantize_int8_f32",
            CudaStorageSlice::F32,
        ),
    }
}

/// GPU `quant::tensor::quantize_int4_swizzled` (arguments already checked: x.len() = W * S,
/// S % block == 0).
pub(crate) fn quantize_int4_swizzled(
    dev: &CudaDevice,
    x: &Tensor,
    nodes: usize,
    ranks_per_node: usize,
    block: usize,
) -> Result<(Tensor, Tensor)> {
    let n = x.elem_count();
    let nb = n / block;
    let mut packed = alloc::<u8>(dev, n / 2)?;
    let mut scales = alloc::<f32>(dev, nb)?;
    if nb > 0 {
        let bps = nb / (nodes * ranks_per_node);
        let f = func(dev, "quantize_int4_swizzled", block)?;
        with_input::<f32, _>(x, |xv| {
            let a = [n, nb, bps, nodes, ranks_per_node].map(i64_of);
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(xv).arg(&mut packed).arg(&mut scales);
            for v in &a {
                b.arg(v);
            }
            // SAFETY: argument types and lengths match the kernel's signature.
            unsafe { b.launch(grid(nb, WARPS)) }.w()?;
            Ok(())
        })?;
    }
    Ok((
        tensor(CudaStorageSlice::U8(packed), dev, n / 2),
        tensor(CudaStorageSlice::F32(scales), dev, nb),
    ))
}

/// GPU fused INT4 piece sums (arguments already checked: packed [pieces * P],
/// scales [pieces * nb], nb = ceil(2P / block)). `requantize` picks the output: the INT4 of the
/// sum (packed [P], scales [nb]) or the f32 sum [2P] (second tensor None).
pub(crate) fn dequantize_sum_int4(
    dev: &CudaDevice,
    packed: &Tensor,
    scales: &Tensor,
    pieces: usize,
    block: usize,
    requantize: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let p = packed.elem_count() / pieces;
    let nb = (2 * p).div_ceil(block);
    let pieces32 = i32::try_from(pieces).map_err(|_| QuantError::BadLength {
        what: "piece count",
        got: pieces,
        expected: i32::MAX as usize,
    })?;
    let run = |name: &str, out: Out<'_>| -> Result<()> {
        if nb == 0 {
            return Ok(());
        }
        let f = func(dev, name, block)?;
        with_input::<u8, _>(packed, |pv| {
            with_input::<f32, _>(scales, |sv| {
                let (p64, nb64) = (i64_of(p), i64_of(nb));
                let stream = dev.cuda_stream();
                let mut b = stream.launch_builder(&f);
                b.arg(pv).arg(sv);
                match out {
                    Out::Sum(o) => b.arg(o),
                    Out::Requantized(q, s) => b.arg(q).arg(s),
                };
                b.arg(&pieces32).arg(&p64).arg(&nb64);
                // SAFETY: argument types and lengths match the kernel's signature.
                unsafe { b.launch(grid(nb, WARPS)) }.w()?;
                Ok(())
            })
        })
    };
    if requantize {
        let mut q = alloc::<u8>(dev, p)?;
        let mut s = alloc::<f32>(dev, nb)?;
        run(
            "dequantize_sum_requantize_int4",
            Out::Requantized(&mut q, &mut s),
        )?;
        Ok((
            tensor(CudaStorageSlice::U8(q), dev, p),
            Some(tensor(CudaStorageSlice::F32(s), dev, nb)),
        ))
    } else {
        let mut out = alloc::<f32>(dev, 2 * p)?;
        run("dequantize_sum_int4", Out::Sum(&mut out))?;
        Ok((tensor(CudaStorageSlice::F32(out), dev, 2 * p), None))
    }
}

/// Output buffers of the fused INT4 kernels.
enum Out<'a> {
    Sum(&'a mut CudaSlice<f32>),
    Requantized(&'a mut CudaSlice<u8>, &'a mut CudaSlice<f32>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the kernels for the block sizes that exercise every code path (vector and
    /// scalar lanes, partial steps). Needs only libnvrtc, no GPU:
    /// `LD_LIBRARY_PATH=$CUDA_ROOT/lib cargo test --features cuda -p quant --lib nvrtc`.
    #[test]
    fn nvrtc_compiles_every_kernel() {
        for block in [32, 64, 96, 128, 160, 256, 512, 1024, 2048, 4096] {
            let ptx = quant_ptx(block).unwrap_or_else(|e| panic!("block {block}: {e}"));
            for name in [
                "quantize_int8",
                "dequantize_int8_f32",
                "dequantize_int8_bf16",
                "quantize_int4_swizzled",
                "dequantize_sum_int4",
                "dequantize_sum_requantize_int4",
            ] {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "block {block}: no entry {name}"
                );
            }
        }
    }
}
