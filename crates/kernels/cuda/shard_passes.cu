// shard_passes.cu: the ZeRO engine's own passes over a unit (zero::shard_passes), queued on the compute
// stream or on the communication stream inside a job: the fp32 master shard cast to bf16 into
// its slot of the gathered buffer, a unit's gradient cast to fp32 (or bf16: zero.reduce_dtype),
// scaled and zero-padded for the reduction, a reduced slice (f32 or bf16) widened or added into
// the fp32 gradient shard, and qgZ's error (a difference) for its error feedback.
// Memory-bound (a copy's bytes: 6 or 8 an element read + written); each thread moves 8
// elements (16-byte bf16 / 2 x 16-byte f32 accesses) or 4 (f32), grid-stride; launch:
// 256-thread CTAs, at most GRID of them. Compiled fast; the arithmetic is one IEEE multiply and
// one add, so the results equal the CPU's (candle) bitwise.
// Measured (`trainer bench --profile`, shard_passes family, W = 1, H200, 2026-12-03;
// docs/results.md): the cast-scale-pad of a unit's bf16 gradient into its f32 shard (6 bytes a parameter) took
// 0.9 ms a gpt350m step and 2.9 ms at the Llama 1B shape, about 2.4 and 2.6 TB/s, 55-60% of the
// 4.3 TB/s copy. At W = 1 it no longer runs (zero::GradShard); at W > 1 these passes run on the
// communication stream, off the compute stream's profile.
#include "common.cuh"

#ifndef GRID
#define GRID 2048
#endif

// out[i] = bf16(x[i]), i < n (n % 8 == 0, both 16-byte aligned).
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

// out[i] = coef * f32(x[i]) for i < n, 0 for n <= i < padded (any n; padded % 8 == 0; both
// 16-byte aligned). Groups of 8 that straddle n are done element by element.
extern "C" __global__ void __launch_bounds__(256) scale_pad_bf16_f32(
    const bf16* __restrict__ x, long long n, float coef, float* __restrict__ out,
    long long padded) {
    const long long n8 = n / 8, p8 = padded / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < p8; i += (long long)GRID * 256) {
        float f[8];
        if (i < n8) {
            unpack8(ld16(x + 8 * i), f);
#pragma unroll
            for (int k = 0; k < 8; ++k) f[k] = __fmul_rn(coef, f[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const long long e = 8 * i + k;
                f[k] = e < n ? __fmul_rn(coef, bf16_to_f32(x[e])) : 0.f;
            }
        }
        reinterpret_cast<float4*>(out)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(out)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

// The same for an f32 gradient: out[i] = coef * x[i], i < n; 0 up to padded (padded % 4 == 0).
extern "C" __global__ void __launch_bounds__(256) scale_pad_f32_f32(
    const float* __restrict__ x, long long n, float coef, float* __restrict__ out,
    long long padded) {
    const long long n4 = n / 4, p4 = padded / 4;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < p4; i += (long long)GRID * 256) {
        float f[4];
        if (i < n4) {
            const float4 v = reinterpret_cast<const float4*>(x)[i];
            f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
#pragma unroll
            for (int k = 0; k < 4; ++k) f[k] = __fmul_rn(coef, f[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const long long e = 4 * i + k;
                f[k] = e < n ? __fmul_rn(coef, x[e]) : 0.f;
            }
        }
        reinterpret_cast<float4*>(out)[i] = make_float4(f[0], f[1], f[2], f[3]);
    }
}

// The same into a bf16 buffer (zero.reduce_dtype = "bf16"): out[i] = bf16(coef * f32(x[i])),
// one rounding after the f32 multiply, as the CPU (padded % 8 == 0; both 16-byte aligned).
extern "C" __global__ void __launch_bounds__(256) scale_pad_bf16_bf16(
    const bf16* __restrict__ x, long long n, float coef, bf16* __restrict__ out,
    long long padded) {
    const long long n8 = n / 8, p8 = padded / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < p8; i += (long long)GRID * 256) {
        float f[8];
        if (i < n8) {
            unpack8(ld16(x + 8 * i), f);
#pragma unroll
            for (int k = 0; k < 8; ++k) f[k] = __fmul_rn(coef, f[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const long long e = 8 * i + k;
                f[k] = e < n ? __fmul_rn(coef, bf16_to_f32(x[e])) : 0.f;
            }
        }
        st16(out + 8 * i, pack8(f));
    }
}

// An f32 gradient into a bf16 buffer: out[i] = bf16(coef * x[i]), i < n; 0 up to padded
// (padded % 8 == 0; both 16-byte aligned).
extern "C" __global__ void __launch_bounds__(256) scale_pad_f32_bf16(
    const float* __restrict__ x, long long n, float coef, bf16* __restrict__ out,
    long long padded) {
    const long long n8 = n / 8, p8 = padded / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < p8; i += (long long)GRID * 256) {
        float f[8];
        if (i < n8) {
            const float4 a = reinterpret_cast<const float4*>(x)[2 * i];
            const float4 b = reinterpret_cast<const float4*>(x)[2 * i + 1];
            f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
            f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
#pragma unroll
            for (int k = 0; k < 8; ++k) f[k] = __fmul_rn(coef, f[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const long long e = 8 * i + k;
                f[k] = e < n ? __fmul_rn(coef, x[e]) : 0.f;
            }
        }
        st16(out + 8 * i, pack8(f));
    }
}

// out[i] = f32(x[i]) (n % 8 == 0, both 16-byte aligned): a bf16-reduced slice as a new fp32
// gradient shard. Widening is exact.
extern "C" __global__ void __launch_bounds__(256) cast_bf16_f32(
    const bf16* __restrict__ x, float* __restrict__ out, long long n) {
    const long long n8 = n / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n8; i += (long long)GRID * 256) {
        float f[8];
        unpack8(ld16(x + 8 * i), f);
        reinterpret_cast<float4*>(out)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(out)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
}

// acc[i] += f32(x[i]) (n % 8 == 0, both 16-byte aligned), in place: a bf16-reduced slice added
// into the fp32 gradient shard.
extern "C" __global__ void __launch_bounds__(256) add_bf16_f32(
    float* __restrict__ acc, const bf16* __restrict__ x, long long n) {
    const long long n8 = n / 8;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n8; i += (long long)GRID * 256) {
        float f[8];
        unpack8(ld16(x + 8 * i), f);
        float4 a = reinterpret_cast<float4*>(acc)[2 * i];
        float4 b = reinterpret_cast<float4*>(acc)[2 * i + 1];
        a.x = __fadd_rn(a.x, f[0]); a.y = __fadd_rn(a.y, f[1]);
        a.z = __fadd_rn(a.z, f[2]); a.w = __fadd_rn(a.w, f[3]);
        b.x = __fadd_rn(b.x, f[4]); b.y = __fadd_rn(b.y, f[5]);
        b.z = __fadd_rn(b.z, f[6]); b.w = __fadd_rn(b.w, f[7]);
        reinterpret_cast<float4*>(acc)[2 * i] = a;
        reinterpret_cast<float4*>(acc)[2 * i + 1] = b;
    }
}

// acc[i] += x[i] (n % 4 == 0, both 16-byte aligned), in place.
extern "C" __global__ void __launch_bounds__(256) add_f32(
    float* __restrict__ acc, const float* __restrict__ x, long long n) {
    const long long n4 = n / 4;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n4; i += (long long)GRID * 256) {
        float4 a = reinterpret_cast<float4*>(acc)[i];
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        a.x = __fadd_rn(a.x, v.x);
        a.y = __fadd_rn(a.y, v.y);
        a.z = __fadd_rn(a.z, v.z);
        a.w = __fadd_rn(a.w, v.w);
        reinterpret_cast<float4*>(acc)[i] = a;
    }
}

// out[i] = x[i] - y[i] (n % 4 == 0, all 16-byte aligned): what a quantiser dropped (qgZ's error
// feedback: the compensated gradient less its dequantised INT4). out may alias x or y.
extern "C" __global__ void __launch_bounds__(256) sub_f32(
    const float* x, const float* y, float* out, long long n) {
    const long long n4 = n / 4;
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n4; i += (long long)GRID * 256) {
        const float4 a = reinterpret_cast<const float4*>(x)[i];
        const float4 b = reinterpret_cast<const float4*>(y)[i];
        float4 o;
        o.x = __fsub_rn(a.x, b.x);
        o.y = __fsub_rn(a.y, b.y);
        o.z = __fsub_rn(a.z, b.z);
        o.w = __fsub_rn(a.w, b.w);
        reinterpret_cast<float4*>(out)[i] = o;
    }
}
