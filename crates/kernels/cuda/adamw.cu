// adamw.cu: the AdamW update of crates/zero/src/optimizer.rs, bitwise equal to the CPU one
// (compiled with Flavour::Exact). The arithmetic is PyTorch's fused AdamW's, in f32: each
// operation an IEEE intrinsic (`__fmul_rn`, `__fadd_rn`, `__fdiv_rn`, `__fsqrt_rn`) in the
// CPU's order, no contraction, so the bits are the CPU's.
//
// Bound by memory bandwidth: 12 bytes read (param, m, v) and 12 written (param, m, v) an
// element, the gradient's 4 (an f32 shard) or 2 (the unit's bf16 gradient as the backward wrote
// it, at W = 1), plus 2 when it also writes the new parameter in bf16 (the working copy the next
// gathers read instead of casting the master again). The f32 arithmetic (one division, one
// square root) hides under the loads. Measured on the H200 with the norm's read of the gradient
// (`trainer bench --profile`, optimizer family): 10.33 ms a step at the Llama 1B shape, 3.6 TB/s
// or 84% of a device copy's 4.3; the f64 arithmetic this kernel had before took 14.2 ms.
//
// Launch: THREADS a CTA, each thread ELEMS elements THREADS apart (coalesced, ELEMS loads in
// flight), over the elements [start, end) of a span.
#include "common.cuh"

// Decay ranges a launch carries in its parameters (zero::optimizer_cuda::MAX_RANGES).
#ifndef MAX_RANGES
#define MAX_RANGES 64
#endif
// Threads a CTA (zero::optimizer_cuda::THREADS).
#ifndef THREADS
#define THREADS 256
#endif
// Elements a thread (zero::optimizer_cuda::ELEMS).
#ifndef ELEMS
#define ELEMS 4
#endif
struct Ranges { i64 lo[MAX_RANGES]; i64 hi[MAX_RANGES]; int count; };

// The update's scalars, computed once on the host (zero::AdamW::scalars) and rounded to f32.
struct Scalars {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    float decay_factor;  // 1 - lr * weight_decay, for the elements in a decay range
    float step_size;     // lr / (1 - beta1^t)
    float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
    float clip;          // the gradient clipping coefficient (1 when not clipped)
};

__device__ __forceinline__ float grad_value(const float* g, i64 i) { return g[i]; }
__device__ __forceinline__ float grad_value(const bf16* g, i64 i) { return bf16_to_f32(g[i]); }

// Element i of the update; the gradient is scale * grad[i], zero at and past grad_len.
template <typename G>
__device__ __forceinline__ void adamw_element(
    const float* __restrict__ param, const G* __restrict__ grad, i64 grad_len, float scale,
    const float* __restrict__ m_in, const float* __restrict__ v_in,
    float* __restrict__ p_out, float* __restrict__ m_out, float* __restrict__ v_out,
    bf16* __restrict__ p_bf16, const Ranges& ranges, const Scalars& s, i64 i) {
    // Number of ranges starting at or before i; the last of them may contain i.
    int lo = 0, hi = ranges.count;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (ranges.lo[mid] <= i) lo = mid + 1; else hi = mid;
    }
    const bool decayed = lo > 0 && i < ranges.hi[lo - 1];
    const float raw = i < grad_len ? grad_value(grad, i) : 0.f;
    const float g = __fmul_rn(__fmul_rn(raw, scale), s.clip);
    const float m = __fadd_rn(__fmul_rn(s.beta1, m_in[i]), __fmul_rn(s.one_minus_beta1, g));
    const float v = __fadd_rn(__fmul_rn(s.beta2, v_in[i]),
                              __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    m_out[i] = m;
    v_out[i] = v;
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), s.inv_sqrt_bc2), s.eps);
    const float p = decayed ? __fmul_rn(param[i], s.decay_factor) : param[i];
    const float p_new = __fsub_rn(p, __fdiv_rn(__fmul_rn(s.step_size, m), denom));
    p_out[i] = p_new;
    if (p_bf16 != nullptr) p_bf16[i] = (bf16)(pack_bf16x2(p_new, 0.f) & 0xffffu);
}

// param, m, v [len] f32, grad [grad_len <= len] of type G -> p_out, m_out, v_out, and p_bf16 =
// bf16(p_out) unless null, on elements [start, end).
#define ADAMW_KERNEL(NAME, G)                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(                                 \
        const float* __restrict__ param, const G* __restrict__ grad, i64 grad_len, float scale, \
        const float* __restrict__ m_in, const float* __restrict__ v_in,                         \
        float* __restrict__ p_out, float* __restrict__ m_out, float* __restrict__ v_out,        \
        bf16* __restrict__ p_bf16, i64 start, i64 end, Ranges ranges, Scalars s) {              \
        const i64 base = start + (i64)blockIdx.x * (THREADS * ELEMS) + threadIdx.x;             \
        _Pragma("unroll") for (int k = 0; k < ELEMS; ++k) {                                     \
            const i64 i = base + (i64)k * THREADS;                                              \
            if (i < end)                                                                        \
                adamw_element(param, grad, grad_len, scale, m_in, v_in, p_out, m_out, v_out,    \
                              p_bf16, ranges, s, i);                                            \
        }                                                                                       \
    }

ADAMW_KERNEL(adamw_f32, float)
ADAMW_KERNEL(adamw_bf16, bf16)
