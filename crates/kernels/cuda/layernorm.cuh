// layernorm.cuh: LayerNorm's output arithmetic on 8 channels, shared by layernorm.cu (the
// norm's kernels) and fp8.cu (fp8_quantize_layernorm, which takes the normalised rows straight
// into FP8), so that the fused kernel quantises the very bits the norm writes. The operations
// are written out (the subtraction, the product with rstd, then one fused multiply-add with
// the weight and the bias, each rounded as written), so that neither file's compilation can
// contract them differently. Include after common.cuh; it includes nothing itself (the loader
// pastes it, kernels::HEADERS).
#pragma once

// out = (x - mean) * rstd * w + b for one 16-byte vector.
__device__ __forceinline__ uint4 ln_out8(uint4 xv, uint4 wv, uint4 bv, float mean, float rstd) {
    float xf[8], wf[8], bf[8], o[8];
    unpack8(xv, xf);
    unpack8(wv, wf);
    unpack8(bv, bf);
#pragma unroll
    for (int k = 0; k < 8; k++)
        o[k] = __fmaf_rn(__fmul_rn(__fsub_rn(xf[k], mean), rstd), wf[k], bf[k]);
    return pack8(o);
}
