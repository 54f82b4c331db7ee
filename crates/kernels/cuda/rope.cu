// rope.cu: rotary position embedding (Hugging Face's rotate-half convention) applied in place to
// the query and key heads of the packed projection `qkv (N, W)`, W = (NH + 2 KV) * hs: columns
// [q heads | k heads | v heads], row n at position t = n % T. The v heads are not touched.
// Launchers: model/src/layers/rope.rs (`mod cuda`).
//
// Each head's pairs (i, i + hs/2), i < hs/2, turn by the angle of position t and frequency i:
//   out_i        = x_i * cos - sign * x_{i+hs/2} * sin
//   out_{i+hs/2} = x_{i+hs/2} * cos + sign * x_i * sin
// sign = +1 is the forward (x * cos + rotate_half(x) * sin); sign = -1 the backward (the
// transpose: the turn by minus the angle), applied to dq and dk where the attention's backward
// wrote them. cos and sin are the reference's bf16 tables `(>= T, hs)` (their halves are equal);
// the math is f32 (rope.cuh's, shared with qk_norm.cu's fused rotation) and each output is
// rounded once.
//
// Bound: bytes. Reads and writes the q and k columns once (4 N (NH + KV) hs bytes) and reads the
// tables (L2 hits). One thread turns two adjacent pairs (i, i+1) with 4-byte accesses.
// Measured on the H200 at Llama 3.2 1B's shape (N = 16384, 32 + 8 heads of 64): 69 us, 2.4 TB/s,
// 76% of a device copy's 3.2 TB/s in the same test (tests/gpu/llama_layers.rs).
// Launch: grid ceil(N * (NH + KV) * hs / 4 / 256), block 256.

#include "common.cuh"
#include "rope.cuh"
static_assert(PRECISION == PRECISION_BF16, "rope.cu: bf16 only: it turns bf16x2 words");

// qkv (N, W) bf16, in place; cos, sin (>= T, HS) bf16; HQK = NH + KV heads turned.
extern "C" __global__ void __launch_bounds__(256) rope_qk(act_t* __restrict__ qkv,
                                                         const act_t* __restrict__ cos_t,
                                                         const act_t* __restrict__ sin_t, int N,
                                                         int T, int W, int HQK, int HS,
                                                         float sign) {
    const int half = HS / 2, quads = half / 2;  // thread items a head: pairs of pairs
    const i64 item = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 per_row = (i64)HQK * quads;
    if (item >= (i64)N * per_row) return;
    const i64 n = item / per_row;
    const int rem = (int)(item - n * per_row);
    const int head = rem / quads, i = (rem - head * quads) * 2;
    const int t = (int)(n % T);
    act_t* x = qkv + n * W + (i64)head * HS;
    const u32 lo = *reinterpret_cast<const u32*>(x + i);
    const u32 hi = *reinterpret_cast<const u32*>(x + i + half);
    const u32 cw = *reinterpret_cast<const u32*>(cos_t + (i64)t * HS + i);
    const u32 sw = *reinterpret_cast<const u32*>(sin_t + (i64)t * HS + i);
    const float x1a = bf16x2_lo(lo), x1b = bf16x2_hi(lo);
    const float x2a = bf16x2_lo(hi), x2b = bf16x2_hi(hi);
    const float ca = bf16x2_lo(cw), cb = bf16x2_hi(cw);
    const float sa = sign * bf16x2_lo(sw), sb = sign * bf16x2_hi(sw);
    *reinterpret_cast<u32*>(x + i) =
        pack_bf16x2(rope_lower(x1a, x2a, ca, sa), rope_lower(x1b, x2b, cb, sb));
    *reinterpret_cast<u32*>(x + i + half) =
        pack_bf16x2(rope_upper(x2a, x1a, ca, sa), rope_upper(x2b, x1b, cb, sb));
}
