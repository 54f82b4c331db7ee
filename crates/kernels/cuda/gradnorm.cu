// gradnorm.cu: the sum of squares of a gradient shard in f64, the per-rank part of the global
// gradient norm (zero::sum_of_squares). The shard is `scale * x`, x f32 (the reduced shard) or
// bf16 (the unit's gradient as the backward wrote it, at W = 1); each value is scaled in f32
// (one IEEE multiply, as AdamW scales it) and squared and summed in f64.
//
// Two stages, deterministic: each CTA of a fixed grid sums a grid-stride share of the buffer
// in f64 (each thread in element order, then a fixed shuffle tree) into partials[blockIdx.x];
// the caller sums the GRID partials. Memory-bound: 4 or 2 bytes read an element, 16-byte loads.
// Launch: GRID CTAs of 256 threads (GRID a define; the launcher passes a few CTAs a SM).
// Measured only with AdamW, in the optimizer family of `trainer bench --profile`: adamw.cu's
// figure (10.33 ms at the Llama 1B shape, 84% of a device copy) includes this read.
#include "common.cuh"

#ifndef GRID
#define GRID 1024
#endif

__device__ __forceinline__ double square_of(float x, float scale, double acc) {
    const double g = (double)__fmul_rn(x, scale);
    return fma(g, g, acc);
}

// The CTA's sum of its threads' `acc` into partials[blockIdx.x].
__device__ __forceinline__ void cta_sum(double acc, double* __restrict__ partials) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ double warps[8];
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
#pragma unroll
        for (int w = 0; w < 8; ++w) total += warps[w];
        partials[blockIdx.x] = total;
    }
}

// x: n f32 at a 16-byte aligned address.
extern "C" __global__ void __launch_bounds__(256) sum_squares_f64(
    const float* __restrict__ x, long long n, float scale, double* __restrict__ partials) {
    double acc = 0.0;
    const long long stride = (long long)GRID * 256;
    const long long n4 = n / 4;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n4; i += stride) {
        const float4 v = x4[i];
        acc = square_of(v.x, scale, acc);
        acc = square_of(v.y, scale, acc);
        acc = square_of(v.z, scale, acc);
        acc = square_of(v.w, scale, acc);
    }
    // The tail (n % 4 elements) by the first CTA.
    if (blockIdx.x == 0 && threadIdx.x < (n & 3)) acc = square_of(x[n4 * 4 + threadIdx.x], scale, acc);
    cta_sum(acc, partials);
}

// x: n bf16 at a 16-byte aligned address.
extern "C" __global__ void __launch_bounds__(256) sum_squares_bf16_f64(
    const bf16* __restrict__ x, long long n, float scale, double* __restrict__ partials) {
    double acc = 0.0;
    const long long stride = (long long)GRID * 256;
    const long long n8 = n / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n8; i += stride) {
        float f[8];
        unpack8(ld16(x + 8 * i), f);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc = square_of(f[k], scale, acc);
    }
    // The tail (n % 8 elements) by the first CTA.
    if (blockIdx.x == 0 && threadIdx.x < (n & 7))
        acc = square_of(bf16_to_f32(x[n8 * 8 + threadIdx.x]), scale, acc);
    cta_sum(acc, partials);
}
