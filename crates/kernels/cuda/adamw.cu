// adamw.cu: the AdamW update of crates/zero/src/optimizer.rs, bitwise equal to the CPU one
// (compiled with Flavour::Exact). One thread per element, 256 a CTA; bound by memory bandwidth:
// 16 bytes read (param, grad, m, v) and 12 written (param, m, v) an element, plus 2 when it also
// writes the new parameter in bf16 (the working copy the next gathers read instead of casting
// the master again; rounded to nearest even by the same instruction as shard_passes.cu's cast).
#include "common.cuh"

// Decay ranges a launch carries in its parameters (zero::optimizer_cuda::MAX_RANGES).
#ifndef MAX_RANGES
#define MAX_RANGES 64
#endif
// Threads a CTA (zero::optimizer_cuda::THREADS).
#ifndef THREADS
#define THREADS 256
#endif
struct Ranges { i64 lo[MAX_RANGES]; i64 hi[MAX_RANGES]; int count; };

// param, grad, m, v [len] f32 -> p_out, m_out, v_out, and p_bf16 = bf16(p_out) unless null, on
// elements [start, end).
extern "C" __global__ void __launch_bounds__(THREADS) adamw_f32(
    const float* __restrict__ param, const float* __restrict__ grad,
    const float* __restrict__ m_in, const float* __restrict__ v_in,
    float* __restrict__ p_out, float* __restrict__ m_out, float* __restrict__ v_out,
    bf16* __restrict__ p_bf16, i64 start, i64 end, Ranges ranges,
    double beta1, double one_minus_beta1, double beta2, double one_minus_beta2,
    double eps, double weight_decay, double grad_coef, double lr, double bc1, double bc2) {
    const i64 i = start + (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= end) return;
    // Number of ranges starting at or before i; the last of them may contain i.
    int lo = 0, hi = ranges.count;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (ranges.lo[mid] <= i) lo = mid + 1; else hi = mid;
    }
    const double wd = (lo > 0 && i < ranges.hi[lo - 1]) ? weight_decay : 0.0;
    const double g = __dmul_rn((double)grad[i], grad_coef);
    const double m = __dadd_rn(__dmul_rn(beta1, (double)m_in[i]), __dmul_rn(one_minus_beta1, g));
    const double v = __dadd_rn(__dmul_rn(beta2, (double)v_in[i]),
                               __dmul_rn(__dmul_rn(one_minus_beta2, g), g));
    m_out[i] = __double2float_rn(m);
    v_out[i] = __double2float_rn(v);
    const double p = (double)param[i];
    const double step = __dadd_rn(
        __ddiv_rn(__ddiv_rn(m, bc1), __dadd_rn(__dsqrt_rn(__ddiv_rn(v, bc2)), eps)),
        __dmul_rn(wd, p));
    const float p_new = __double2float_rn(__dsub_rn(p, __dmul_rn(lr, step)));
    p_out[i] = p_new;
    if (p_bf16 != nullptr) p_bf16[i] = (bf16)(pack_bf16x2(p_new, 0.f) & 0xffffu);
}
