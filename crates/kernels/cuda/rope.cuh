// rope.cuh: the rotation of one channel pair of rotary position embedding, shared by rope.cu
// (the rotation on its own) and qk_norm.cu (Qwen3's q/k norm with the rotation after it in the
// same pass), so that both compute the same bits: the products and the sum written out
// (__fmul_rn, __fmaf_rn), so that FMA contraction cannot differ between the files. Include after
// common.cuh; it includes nothing itself (the loader pastes it, kernels::HEADERS).
//
// A head's pair (i, i + hs/2) turns by the angle of its position and frequency i:
//   out_i        = x_i * cos - x_{i+hs/2} * s
//   out_{i+hs/2} = x_{i+hs/2} * cos + x_i * s,     s = sign * sin
// sign = +1 the forward, -1 the backward (the turn by minus the angle).
#pragma once

// The lower channel's output from itself (x), its partner (p) and the pair's cos and s.
__device__ __forceinline__ float rope_lower(float x, float p, float c, float s) {
    return __fmaf_rn(x, c, -__fmul_rn(p, s));
}
// The upper channel's output from itself (x), its partner (p) and the pair's cos and s.
__device__ __forceinline__ float rope_upper(float x, float p, float c, float s) {
    return __fmaf_rn(x, c, __fmul_rn(p, s));
}
