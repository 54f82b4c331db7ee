// swiglu.cuh: SwiGLU's arithmetic on 8 channels, shared by swiglu.cu (the bf16 kernels) and
// fp8.cu (the quantisers that take SwiGLU's output or its gradient straight into FP8), so that
// a fused kernel computes the very bits of the unfused one: the same expressions, compiled
// with the same flavour (Fast). Include after common.cuh; it includes nothing itself (the
// loader pastes it, kernels::HEADERS).
//
// Rounding, as the CPU reference (and PyTorch's bf16 silu) does it: silu(g) = g / (1 + exp(-g))
// in f32 rounded to bf16 once, then the product with up rounded once (by the caller's pack8).
// Backward in f32 from the bf16 inputs: dup = dact * silu(g), dgate = dact * up * silu'(g),
// silu'(g) = s * (1 + g * (1 - s)), s = sigmoid(g); each output rounded once by the caller.
#pragma once

__device__ __forceinline__ float sigmoid_f(float g) { return 1.f / (1.f + __expf(-g)); }

// act[k] = bf16(silu(g[k])) * u[k] in f32 (the caller rounds it once to bf16).
__device__ __forceinline__ void swiglu_act8(const float g[8], const float u[8], float act[8]) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float s = act_to_f32(f32_to_act(g[k] * sigmoid_f(g[k])));
        act[k] = s * u[k];
    }
}

// dg[k], du[k]: the gradients of act = silu(g) * u for dact d (f32; the caller rounds them).
__device__ __forceinline__ void swiglu_grad8(const float d[8], const float g[8], const float u[8],
                                             float dg[8], float du[8]) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float s = sigmoid_f(g[k]);
        du[k] = d[k] * g[k] * s;
        dg[k] = d[k] * u[k] * (s * (1.f + g[k] * (1.f - s)));
    }
}
