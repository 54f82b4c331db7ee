// common.cuh: what every zeropp kernel file shares. The loader pastes it where a .cu file says
// `#include "common.cuh"` (NVRTC sees one text; `#line` keeps error positions true), and an
// editor or nvcc finds it through the same include, so a .cu file compiles on its own too:
//   nvcc -arch=sm_90 -std=c++17 --ptx -Icrates/kernels/cuda crates/kernels/cuda/FILE.cu
// No CUDA headers: NVRTC has none on its include path, so bf16 is handled as raw bits here.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// bf16 as its 16 bits: a storage format in its own right (the engine's bf16 gradients and
// reductions, the AdamW copy), and the model's element type at PRECISION_BF16 below. Widening
// is exact; narrowing rounds to nearest even (NaN stays NaN), the rule of the `half` crate that
// the CPU references use.
typedef u16 bf16;

__device__ __forceinline__ float bf16_to_f32(bf16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// Two floats to a bf16x2 word (lo in the low half), round to nearest even, one instruction.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf16x2_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16x2_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// 16-byte vectors of 8 bf16: load, store, and their values as floats in memory order.
__device__ __forceinline__ uint4 ld16(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void st16(bf16* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }
__device__ __forceinline__ void unpack8(uint4 v, float f[8]) {
    f[0] = bf16x2_lo(v.x); f[1] = bf16x2_hi(v.x);
    f[2] = bf16x2_lo(v.y); f[3] = bf16x2_hi(v.y);
    f[4] = bf16x2_lo(v.z); f[5] = bf16x2_hi(v.z);
    f[6] = bf16x2_lo(v.w); f[7] = bf16x2_hi(v.w);
}
__device__ __forceinline__ uint4 pack8(const float f[8]) {
    uint4 v;
    v.x = pack_bf16x2(f[0], f[1]);
    v.y = pack_bf16x2(f[2], f[3]);
    v.z = pack_bf16x2(f[4], f[5]);
    v.w = pack_bf16x2(f[6], f[7]);
    return v;
}

// The model's element type `act_t` (activations, weights and their gradients): an axis of the
// typed kernel families (norms, rotary, SwiGLU, elementwise, attention, embedding,
// cross-entropy). Their launchers compile one module a precision, `-D PRECISION=<code>`
// (kernels::Precision::define); kernel names are the same in each. A file compiled on its own
// gets bf16. FP8 adds a code here with its `act_t`, conversions and vector width, and lifts
// the `static_assert` on PRECISION of each family written for it.
#define PRECISION_BF16 1
#ifndef PRECISION
#define PRECISION PRECISION_BF16
#endif
#if PRECISION == PRECISION_BF16
typedef bf16 act_t;
#define ACT_VEC 8  // elements a 16-byte vector (ld16, unpack8, pack8)
__device__ __forceinline__ float act_to_f32(act_t h) { return bf16_to_f32(h); }
__device__ __forceinline__ act_t f32_to_act(float f) { return f32_to_bf16(f); }
#else
#error "common.cuh: no element type for this PRECISION (kernels::Precision lists the codes)"
#endif

// 2^x on the SFU, results below 2^-126 flushed to zero; exp2f without fast-math adds denormal
// handling around the same instruction.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Sum and max over a warp (every lane gets the result).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
