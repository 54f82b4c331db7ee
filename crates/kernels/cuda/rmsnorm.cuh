// rmsnorm.cuh: RMSNorm's output arithmetic on 8 channels, shared by rmsnorm.cu (the norm's
// kernels) and fp8.cu (fp8_quantize_rmsnorm, which takes the normalised rows straight into
// FP8), so that the fused kernel quantises the very bits the norm writes: the same expression,
// compiled with the same flavour (Fast; two products, each rounded, nothing to contract).
// Include after common.cuh; it includes nothing itself (the loader pastes it,
// kernels::HEADERS).
#pragma once

// out = bf16(bf16(h * rstd) * w) for one vector: normed rounded to bf16 before the weight
// multiplies it (HF's order: `weight * hidden_states.to(input_dtype)`).
__device__ __forceinline__ uint4 rms_out8(uint4 hv, uint4 wv, float rstd) {
    float f[8], wf[8];
    unpack8(hv, f);
    unpack8(wv, wf);
#pragma unroll
    for (int k = 0; k < 8; k++) f[k] = act_to_f32(f32_to_act(f[k] * rstd)) * wf[k];
    return pack8(f);
}
