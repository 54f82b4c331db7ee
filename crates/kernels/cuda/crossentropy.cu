// crossentropy.cu: the fused soft-max cross-entropy of a chunk of logits (R, V) bf16: the per-row
// loss and, for backward, dlogits written over the logits, in one kernel.
// Size letters: R rows of this chunk, N rows in all (the mean's divisor), V vocabulary.
// The launcher requires V % 8 == 0 (16-byte vectors) and 16-byte aligned rows.
#include "common.cuh"
static_assert(PRECISION == PRECISION_BF16, "crossentropy.cu: bf16 only: its epilogue packs bf16x2 words");

#ifndef CE_THREADS
#define CE_THREADS 1024  // threads a CTA (a multiple of 32, at most 1024)
#endif
// Two CTAs of 1024 threads an SM: the second row's loads overlap the first row's reductions and
// exp work, and 2 * 132 rows of 100 KiB (V = 50304) in flight stay well inside the 50 MiB L2
// that serves the second read.
#define CE_MIN_BLOCKS ((2048 / CE_THREADS) < 16 ? (2048 / CE_THREADS) : 16)

#define CE_LOG2E 1.4426950408889634f

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Online soft-max statistics: (m, s) = (max, sum of exp(x - m)). Folds 8 values in, one rescale.
// A NaN logit makes s NaN (fmaxf drops it from m, ex2 keeps it in s), so the loss shows it.
__device__ __forceinline__ void fold8(float& m, float& s, uint4 v) {
    float f[8];
    unpack8(v, f);
    float lm = fmaxf(fmaxf(fmaxf(f[0], f[1]), fmaxf(f[2], f[3])),
                     fmaxf(fmaxf(f[4], f[5]), fmaxf(f[6], f[7])));
    const float mn = fmaxf(m, lm);
    const float mnl = mn * CE_LOG2E;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += ex2(fmaf(f[j], CE_LOG2E, -mnl));
    // m = -inf (nothing folded yet): ex2(-inf) = 0, s stays 0 + acc.
    s = s * ex2(fmaf(m, CE_LOG2E, -mnl)) + acc;
    m = mn;
}

// Merges (m2, s2) into (m, s); an empty side (s == 0, m == -inf) adds nothing.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    const float a = s == 0.f ? 0.f : s * ex2((m - mn) * CE_LOG2E);
    const float b = s2 == 0.f ? 0.f : s2 * ex2((m2 - mn) * CE_LOG2E);
    m = mn;
    s = a + b;
}

// Per row r of logits (R, V) bf16: loss[r] = lse_r - logits[r, targets[r]] in f32 (NaN when
// targets[r] >= V), lse_r = m + log(sum exp(logit - m)) with m the row max. When grad != 0,
// logits[r, :] is overwritten in place by dlogits = (softmax - onehot(target)) * inv_n in bf16
// (inv_n = 1/N, N the rows of the whole batch, not of this chunk).
// Bound: bytes. Reads the row from HBM once (online max/sum), reads it again from L2 and writes
// it (grad): 2 bytes + 2 bytes of HBM traffic an element; ~2 exp2 an element on the SFU.
// Measured (`trainer bench --profile`, cross_entropy family, H200; docs/results.md): 3.15 ms a
// step at the Llama 3.2 1B shape (16,384 rows of V = 128,256: 8.4 GB of that traffic), about
// 2.7 TB/s, 62% of the 4.3 TB/s copy (2026-12-03); 1.0 ms at gpt350m's 16,384 x 50,304
// (3.3 GB), about 3.3 TB/s, 77% (2026-12-01).
// Launch: grid R (one CTA a row), block CE_THREADS; thread i takes the 16-byte vectors
// i, i + CE_THREADS, ... (two loads in flight each in the first pass).
extern "C" __global__ void __launch_bounds__(CE_THREADS, CE_MIN_BLOCKS)
    crossentropy_forward_backward(act_t* logits, const u32* __restrict__ targets,
                                  float* __restrict__ losses, int V, float inv_n, int grad) {
    const int r = blockIdx.x;
    const int tid = threadIdx.x;
    const int nv = V / 8;
    uint4* row = reinterpret_cast<uint4*>(logits + (i64)r * V);
    const u32 tgt = targets[r];

    // The target's logit, read before any thread of this CTA overwrites the row (the
    // __syncthreads of the reduction below orders this read before the writes of pass 2).
    float lt = __int_as_float(0x7fc00000);  // NaN: target out of range
    if (tid == 0 && tgt < (u32)V) lt = act_to_f32(logits[(i64)r * V + tgt]);

    // Pass 1: thread-local online max / sum over the thread's vectors, two loads in flight.
    float m = neg_inf(), s = 0.f;
    for (int i = tid; i < nv; i += 2 * CE_THREADS) {
        const uint4 a = row[i];
        const int i2 = i + CE_THREADS;
        const u32 ninf2 = 0xff80ff80u;  // -inf: folds in as nothing
        const uint4 b = i2 < nv ? row[i2] : make_uint4(ninf2, ninf2, ninf2, ninf2);
        fold8(m, s, a);
        fold8(m, s, b);
    }

    // Block reduction: each warp folds its lanes, then every warp folds the warps' results in
    // the same order (so all threads hold the same (M, S) after one barrier).
    __shared__ float sh_m[32], sh_s[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        merge(m, s, m2, s2);
    }
    const int lane = tid % 32, warp = tid / 32;
    if (lane == 0) {
        sh_m[warp] = m;
        sh_s[warp] = s;
    }
    __syncthreads();
    m = lane < CE_THREADS / 32 ? sh_m[lane] : neg_inf();
    s = lane < CE_THREADS / 32 ? sh_s[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        merge(m, s, m2, s2);
    }
    if (tid == 0) losses[r] = m + logf(s) - lt;
    if (!grad) return;

    // Pass 2: dlogits = (exp(x - M) / S - [j == target]) / N, over the row again (L2 hits).
    const float ml = m * CE_LOG2E;
    const float scale = inv_n / s;
    for (int i = tid; i < nv; i += CE_THREADS) {
        float f[8];
        unpack8(row[i], f);
        const u32 j0 = (u32)i * 8u;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            f[j] = ex2(fmaf(f[j], CE_LOG2E, -ml)) * scale;
            if (j0 + j == tgt) f[j] -= inv_n;
        }
        row[i] = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]),
                            pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
    }
}
