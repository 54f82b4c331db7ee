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

// bf16 as its 16 bits. Widening is exact; narrowing rounds to nearest even (NaN stays NaN),
// the rule of the `half` crate that the CPU references use.
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
