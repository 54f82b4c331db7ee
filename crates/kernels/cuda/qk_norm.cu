// qk_norm.cu: Qwen3's q/k norm, an RMSNorm of each query head and each key head over its HS
// channels, in place on the packed projection `qkv (N, W)`, W = (NH + 2 KV) * HS: columns
// [q heads | k heads | v heads]. One weight `wq (HS)` for every query head, `wk (HS)` for every
// key head; the v heads are not touched. Launchers: model/src/layers/qk_norm.rs (`mod cuda`).
//
// Size letters: N rows (positions), NH query heads, KV key/value heads, HQK = NH + KV heads
// normalised a row, HS channels a head (HS a #define, HS % 8 == 0, HS <= 256). A head row is
// (n, h), h < HQK, numbered r = n * HQK + h.
//
// Forward, for each head row: rstd = 1 / sqrt(mean(x^2) + eps) in f32; x <- bf16(bf16(x * rstd)
// * w), w = wq for h < NH, else wk: the normalised head is rounded to bf16 before the weight
// multiplies it, as the CPU reference (rmsnorm.rs) and Hugging Face's Qwen3RMSNorm do
// (`weight * hidden_states.to(input_dtype)`). It saves what the backward reads: the heads before
// the norm, `x (N, HQK * HS)` bf16 (a copy, bit for bit), and `rstd (N, HQK)` f32.
// Backward, in place on the packed gradient (dq, dk in; dv not touched), from the saved x and
// rstd, all in f32 and each output rounded once (rmsnorm.cu's backward, head by head):
//   xhat = x * rstd, dnorm = w * dy, dx = rstd * (dnorm - xhat * mean(dnorm * xhat)),
//   dwq[i] = sum over rows and query heads of dy_i * xhat_i, dwk over key heads.
// dw is deterministic: each CTA sums its heads' products in a fixed order into its own slice of
// `partials (grid, 2 HS)` f32 (no atomics), qk_norm_backward_reduce sums the slices in CTA
// order. Against the f32 reference on the same bf16 inputs (tests/gpu/qk_norm.rs) the outputs
// differ by their bf16 roundings: the forward by two (the normalised head, then the product
// with w: within 2^-8 of the output's size each, so within 1e-2 of max |y|), dx and dw by one
// (dw's f32 sums run in another order than the reference's: ~1e-6, far under the rounding);
// rstd within 2e-5 (another summation order of mean(x^2): at most HS f32 roundings of positive
// terms, 7.6e-6 relative at HS = 128, half that in rstd); the saved x equals the input bit for
// bit, and v is untouched.
//
// Bounds (both memory-bound; a few FMAs a byte): the forward reads the q and k heads (2 N HQK HS
// bytes) and writes them in place and their saved copy (4 N HQK HS), plus rstd (4 N HQK); the
// backward reads dy and x (4 N HQK HS) and rstd, and writes dx (2 N HQK HS). Both 6 N HQK HS +
// 4 N HQK bytes; w is an L1 hit. v is neither read nor written. With the rotary embedding fused
// (cos_t not null; rope.cuh's arithmetic, partners by shuffles) the bytes are the same, and
// rope.cu's pass over q and k (4 N HQK HS bytes each way) is gone: not measured yet.
// Measured: not yet (tests/gpu/qk_norm.rs, qk_norm_against_the_copy, prints both at Qwen3 1.7B's
// N = 16384 (B 8 x T 2048), NH 16, KV 8, HS 128: 304 MB a pass, ~95 us at the 3.2 TB/s copy).
//
// Launch: a head row is LANES lanes (HS / 8 rounded up to a power of two), one 16-byte vector a
// lane, so a warp holds 32 / LANES consecutive heads (two at HS = 128: 512 contiguous bytes) and
// a CTA of 256 threads GROUPS = 256 / LANES of them. Forward: grid ceil(N HQK / GROUPS), one head
// row a group. Backward: a persistent grid (at most the CTAs the SMs hold at once) whose groups
// stride over the head rows, then qk_norm_backward_reduce: grid ceil(2 HS / 32), block (32, 8).

#include "common.cuh"
#include "rope.cuh"
// rms_out8: a head's out = bf16(bf16(x * rstd) * w), the bits of rmsnorm.cu.
#include "rmsnorm.cuh"
static_assert(PRECISION == PRECISION_BF16, "qk_norm.cu: bf16 only: its heads are vectors of 8 (unpack8, pack8)");

#ifndef HS
#define HS 128
#endif
static_assert(HS % 8 == 0 && HS > 0 && HS <= 256, "HS must be a positive multiple of 8, at most 256");

constexpr int NV = HS / 8;  // 16-byte vectors a head
// Lanes a head: NV rounded up to a power of two, so that a head's lanes are an aligned part of
// the warp and a butterfly over them stays inside it. Lanes past NV hold zeros.
constexpr int LANES = NV <= 1 ? 1 : NV <= 2 ? 2 : NV <= 4 ? 4 : NV <= 8 ? 8 : NV <= 16 ? 16 : 32;
constexpr int THREADS = 256;
constexpr int GROUPS = THREADS / LANES;  // heads a CTA holds at once

// Sum over the LANES lanes of a head (every lane of the warp takes part; each gets its head's).
__device__ __forceinline__ float head_sum(float v) {
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float sum_sq8(uint4 v) {
    float f[8], q = 0.f;
    unpack8(v, f);
#pragma unroll
    for (int k = 0; k < 8; k++) q += f[k] * f[k];
    return q;
}


// The rotary embedding of a head's channels sub * 8 to + 7 (bf16 bits v) at position t, by
// sign times the angle (rope.cuh; rope.cu's rotation, the same bits): the pair partners of a
// lane's channels are in the lane HS / 16 away, fetched by shuffles, so every lane of the warp
// calls it (a lane past the head's NV with zeros, returned as they are). HS % 16 == 0 (the
// launcher's condition for the fused rotation); cos_t, sin_t (>= T, HS) bf16, 16-byte aligned.
__device__ __forceinline__ uint4 rope8(uint4 v, int sub, int t, const act_t* __restrict__ cos_t,
                                       const act_t* __restrict__ sin_t, float sign) {
    constexpr int H8 = HS / 16;  // lanes between a channel and its partner
    const bool lower = sub < H8;
    const int lane = threadIdx.x & 31;
    const int src = sub < NV ? (lower ? lane + H8 : lane - H8) : lane;
    uint4 p;
    p.x = __shfl_sync(0xffffffffu, v.x, src);
    p.y = __shfl_sync(0xffffffffu, v.y, src);
    p.z = __shfl_sync(0xffffffffu, v.z, src);
    p.w = __shfl_sync(0xffffffffu, v.w, src);
    if (sub >= NV) return v;
    const int i = (lower ? sub : sub - H8) * 8;  // the pair's lower channel: the tables' column
    float f[8], q[8], c[8], sn[8];
    unpack8(v, f);
    unpack8(p, q);
    unpack8(ld16(cos_t + (i64)t * HS + i), c);
    unpack8(ld16(sin_t + (i64)t * HS + i), sn);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float sk = sign * sn[k];
        f[k] = lower ? rope_lower(f[k], q[k], c[k], sk) : rope_upper(f[k], q[k], c[k], sk);
    }
    return pack8(f);
}

// qkv (N, W) bf16, its first HQK heads normalised in place; x_out (N, HQK * HS) bf16: those
// heads before the norm; rstd_out (N, HQK) f32; wq, wk (HS) bf16. Heads h < NH take wq. With
// cos_t not null the normalised heads are also turned by the rotary embedding of position n % T
// (rope8: the bits of rope.cu after this kernel, one pass fewer over q and k).
// Block: THREADS, grid ceil(N * HQK / GROUPS). Lanes of a head row past the last take part in
// the sum and the rotation's shuffles (with zeros) and store nothing: no lane returns before.
extern "C" __global__ void __launch_bounds__(THREADS) qk_norm_forward(
    act_t* __restrict__ qkv, act_t* __restrict__ x_out, float* __restrict__ rstd_out,
    const act_t* __restrict__ wq, const act_t* __restrict__ wk, const act_t* __restrict__ cos_t,
    const act_t* __restrict__ sin_t, int T, int N, int W, int NH, int HQK, float eps) {
    const int sub = threadIdx.x & (LANES - 1);
    const int r = blockIdx.x * GROUPS + threadIdx.x / LANES;  // N * HQK < 2^31 (the launcher's)
    const bool live = r < N * HQK && sub < NV;
    const int n = r / HQK, h = r - n * HQK;
    act_t* xr = qkv + (i64)n * W + h * HS + sub * 8;
    const uint4 zero = uint4{0u, 0u, 0u, 0u};
    const uint4 xv = live ? ld16(xr) : zero;
    const float rstd = 1.f / sqrtf(head_sum(sum_sq8(xv)) * (1.f / HS) + eps);
    uint4 out = live ? rms_out8(xv, ld16((h < NH ? wq : wk) + sub * 8), rstd) : zero;
    if (cos_t != nullptr) out = rope8(out, sub, n % T, cos_t, sin_t, 1.f);
    if (!live) return;
    st16(x_out + (i64)r * HS + sub * 8, xv);
    st16(xr, out);
    if (sub == 0) rstd_out[r] = rstd;
}

// dqkv (N, W) bf16: dy in its first HQK heads, replaced in place by dx; x (N, HQK * HS) bf16 and
// rstd (N, HQK) f32: the forward's saved heads and statistics; wq, wk (HS) bf16 -> partials
// (gridDim.x, 2 HS) f32: this CTA's sums of dy * xhat over its query heads (columns 0..HS) and
// its key heads (HS..2 HS).
// Block: THREADS; a persistent grid whose groups take head rows blockIdx.x * GROUPS + group,
// then a grid's worth of rows further, ... Every group of a CTA makes the same trips (the bound
// is the CTA's), so each head's shuffles see all its lanes. Each lane sums its 8 channels' dw
// in registers (one set for q heads, one for k), then the CTA adds its groups in order.
// With cos_t not null dy first turns back by the rotary embedding of position n % T (rope8 by
// minus the angle, rounded to bf16: the bits rope.cu's backward writes before this kernel).
extern "C" __global__ void __launch_bounds__(THREADS) qk_norm_backward(
    act_t* __restrict__ dqkv, float* __restrict__ partials, const act_t* __restrict__ x,
    const float* __restrict__ rstd, const act_t* __restrict__ wq, const act_t* __restrict__ wk,
    const act_t* __restrict__ cos_t, const act_t* __restrict__ sin_t, int T, int N, int W,
    int NH, int HQK) {
    __shared__ float sh[GROUPS][2 * HS];  // at most 16 KB (GROUPS * HS <= 8 * THREADS)
    const int sub = threadIdx.x & (LANES - 1), grp = threadIdx.x / LANES;
    const int rows = N * HQK;  // < 2^31 - GROUPS * gridDim.x (the launcher's)
    float aq[8], ak[8];
#pragma unroll
    for (int k = 0; k < 8; k++) aq[k] = ak[k] = 0.f;

    for (int base = blockIdx.x * GROUPS; base < rows; base += gridDim.x * GROUPS) {
        const int r = base + grp;
        const bool live = r < rows && sub < NV;
        const int n = r / HQK, h = r - n * HQK;
        const bool is_q = h < NH;
        act_t* dr = dqkv + (i64)n * W + h * HS + sub * 8;
        uint4 dv = live ? ld16(dr) : uint4{0u, 0u, 0u, 0u};
        if (cos_t != nullptr) dv = rope8(dv, sub, n % T, cos_t, sin_t, -1.f);
        float d[8], xf[8], wf[8];
        float rs = 0.f;
        if (live) {
            unpack8(dv, d);
            unpack8(ld16(x + (i64)r * HS + sub * 8), xf);
            unpack8(ld16((is_q ? wq : wk) + sub * 8), wf);
            rs = rstd[r];
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) d[k] = xf[k] = wf[k] = 0.f;
        }
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float xh = xf[k] * rs;
            s += d[k] * wf[k] * xh;
            const float p = d[k] * xh;  // zero on a lane that is not live
            aq[k] += is_q ? p : 0.f;
            ak[k] += is_q ? 0.f : p;
        }
        const float m = head_sum(s) * (1.f / HS);
        if (live) {
            float o[8];
#pragma unroll
            for (int k = 0; k < 8; k++) o[k] = rs * (d[k] * wf[k] - xf[k] * rs * m);
            st16(dr, pack8(o));
        }
    }
    if (sub < NV) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            sh[grp][sub * 8 + k] = aq[k];
            sh[grp][HS + sub * 8 + k] = ak[k];
        }
    }
    __syncthreads();
    // The CTA's partial sums, groups added in order 0, 1, ... (fixed order: deterministic).
    for (int c = threadIdx.x; c < 2 * HS; c += THREADS) {
        float s = 0.f;
#pragma unroll 8
        for (int g = 0; g < GROUPS; g++) s += sh[g][c];
        partials[(i64)blockIdx.x * 2 * HS + c] = s;
    }
}

// partials (G, 2 HS) f32 -> dwq (HS), dwk (HS) bf16: column sums in a fixed order (rmsnorm.cu's
// reduce over 2 HS columns, the first HS to dwq, the rest to dwk). Block (32, 8): threadIdx.x
// picks the column, threadIdx.y sums partial rows y, y + 8, ... in order, then row 0 of the
// block adds the 8 sums in order. Grid ceil(2 HS / 32).
extern "C" __global__ void __launch_bounds__(256) qk_norm_backward_reduce(
    act_t* __restrict__ dwq, act_t* __restrict__ dwk, const float* __restrict__ partials, int G) {
    __shared__ float part[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (c < 2 * HS)
#pragma unroll 4
        for (int g = threadIdx.y; g < G; g += 8) s += partials[(i64)g * 2 * HS + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < 2 * HS) {
        float total = 0.f;
#pragma unroll
        for (int y = 0; y < 8; y++) total += part[y][threadIdx.x];
        if (c < HS)
            dwq[c] = f32_to_act(total);
        else
            dwk[c - HS] = f32_to_act(total);
    }
}
