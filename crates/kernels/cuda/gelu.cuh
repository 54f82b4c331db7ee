// gelu.cuh: GELU's arithmetic, forward and backward (elementwise.cu's header comment derives
// it), shared by elementwise.cu (the GELU kernels and the FP8 layers' bias add) and fp8.cu
// (fp8_quantize_bias_gelu, which takes GELU's output straight into FP8, and
// fp8_quantize_gelu_grad, its gradient), so that a fused kernel quantises the very bits the
// unfused kernels write: the same expressions (one explicit fma,
// the approximations in asm, nothing left to contract), compiled with the same flavour.
// Include after common.cuh (ex2); it includes nothing itself (the loader pastes it,
// kernels::HEADERS).
#pragma once

// rcp.approx: 1 ulp; rcp(+inf) = +0.
__device__ __forceinline__ float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// g = sigmoid(2 s (h + a h^3)) = 0.5 (1 + tanh(s (h + a h^3))).
__device__ __forceinline__ float gelu_gate(float h, float a, float s) {
    const float u = s * fmaf(a * h, h * h, h);
    return rcp_approx(1.f + ex2(-2.8853900817779268f * u));  // 2 log2(e)
}
__device__ __forceinline__ float gelu_f(float h, float a, float s) { return h * gelu_gate(h, a, s); }
// gelu'(h) = g + 2 h g (1 - g) s (1 + 3 a h^2) (elementwise.cu's header derives it).
__device__ __forceinline__ float gelu_grad(float h, float a, float s) {
    const float g = gelu_gate(h, a, s);
    return fmaf(2.f * h * g * (1.f - g), s * fmaf(3.f * a, h * h, 1.f), g);
}
