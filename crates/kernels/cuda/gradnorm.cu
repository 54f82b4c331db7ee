// gradnorm.cu: the sum of squares of an f32 buffer in f64, the per-rank part of the global
// gradient norm (zero::sum_of_squares).
//
// Two stages, deterministic: each CTA of a fixed grid sums a grid-stride share of the buffer
// in f64 (each thread in element order, then a fixed shuffle tree) into partials[blockIdx.x];
// the caller sums the GRID partials. Memory-bound: 4 bytes read an element, 16-byte loads.
// Launch: GRID CTAs of 256 threads (GRID a define; the launcher passes a few CTAs a SM).
#include "common.cuh"

#ifndef GRID
#define GRID 1024
#endif

extern "C" __global__ void __launch_bounds__(256) sum_squares_f64(
    const float* __restrict__ x, long long n, double* __restrict__ partials) {
    double acc = 0.0;
    const long long stride = (long long)GRID * 256;
    const long long n4 = n / 4;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n4; i += stride) {
        const float4 v = x4[i];
        acc = fma((double)v.x, (double)v.x, acc);
        acc = fma((double)v.y, (double)v.y, acc);
        acc = fma((double)v.z, (double)v.z, acc);
        acc = fma((double)v.w, (double)v.w, acc);
    }
    // The tail (n % 4 elements) by the first CTA.
    if (blockIdx.x == 0 && threadIdx.x < (n & 3)) {
        const double v = (double)x[n4 * 4 + threadIdx.x];
        acc = fma(v, v, acc);
    }
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
