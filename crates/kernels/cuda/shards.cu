// shards.cu: the ZeRO engine's own passes over a unit (zero::copies): casting the fp32 master
// shard to the compute dtype for a gather, casting a unit's bf16 gradient to fp32 with the
// partition's zero padding for the reduction, and accumulating a reduced slice into the fp32
// gradient shard. Memory-bound; each thread moves 8 elements (16-byte bf16 / 2 x 16-byte f32
// accesses), grid-stride; launch: 256-thread CTAs, at most GRID of them.
#include "common.cuh"

#ifndef GRID
#define GRID 2048
#endif

// out[i] = bf16(x[i]), i < n (n % 8 == 0, 16-byte aligned).
extern "C" __global__ void __launch_bounds__(256) cast_f32_bf16(
    const float* __restrict__ x, bf16* __restrict__ out, long long n) {
    const long long n8 = n / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n8; i += (long long)GRID * 256) {
        const float4 a = reinterpret_cast<const float4*>(x)[2 * i];
        const float4 b = reinterpret_cast<const float4*>(x)[2 * i + 1];
        uint4 o;
        o.x = pack_bf16x2(a.x, a.y);
        o.y = pack_bf16x2(a.z, a.w);
        o.z = pack_bf16x2(b.x, b.y);
        o.w = pack_bf16x2(b.z, b.w);
        reinterpret_cast<uint4*>(out)[i] = o;
    }
}

// out[i] = f32(x[i]) for i < n, 0 for n <= i < padded (n % 8 == 0, padded % 8 == 0, aligned).
extern "C" __global__ void __launch_bounds__(256) cast_pad_bf16_f32(
    const bf16* __restrict__ x, long long n, float* __restrict__ out, long long padded) {
    const long long n8 = n / 8, p8 = padded / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < p8; i += (long long)GRID * 256) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (i < n8) {
            const uint4 v = reinterpret_cast<const uint4*>(x)[i];
            a = make_float4(bf16x2_lo(v.x), bf16x2_hi(v.x), bf16x2_lo(v.y), bf16x2_hi(v.y));
            b = make_float4(bf16x2_lo(v.z), bf16x2_hi(v.z), bf16x2_lo(v.w), bf16x2_hi(v.w));
        }
        reinterpret_cast<float4*>(out)[2 * i] = a;
        reinterpret_cast<float4*>(out)[2 * i + 1] = b;
    }
}

// out[i] = acc[i] + coef * x[i] (n % 8 == 0, aligned); one rounding for coef == 1 (x + acc),
// as the reference's add.
extern "C" __global__ void __launch_bounds__(256) accumulate_f32(
    const float* __restrict__ acc, const float* __restrict__ x, float coef,
    float* __restrict__ out, long long n) {
    const long long n4 = n / 4;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n4; i += (long long)GRID * 256) {
        const float4 a = reinterpret_cast<const float4*>(acc)[i];
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        float4 o;
        o.x = a.x + __fmul_rn(coef, v.x);
        o.y = a.y + __fmul_rn(coef, v.y);
        o.z = a.z + __fmul_rn(coef, v.z);
        o.w = a.w + __fmul_rn(coef, v.w);
        reinterpret_cast<float4*>(out)[i] = o;
    }
}
