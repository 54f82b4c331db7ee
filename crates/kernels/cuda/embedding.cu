// embedding.cu: token + position embedding, forward and deterministic backward.
// bf16 storage, f32 math. Size letters: B batch, T positions, N = B*T rows, C channels, V vocab.
// Every row is C bf16 = C/8 16-byte vectors: the launcher requires C % 8 == 0 and 16-byte
// aligned pointers (else it runs the candle reference).
// Measured at gpt350m's shape (`trainer bench --profile`, embedding family, H200, 2026-12-03):
// forward 0.11 ms, backward 0.29 ms a step, spans that include the GPU's wait for the host's read
// of the ids (forward) and the CSR's upload (backward): under 0.6% of the step, so the kernels'
// share of the copy was not measured apart.
#include "common.cuh"
static_assert(PRECISION == PRECISION_BF16, "embedding.cu: bf16 only: it adds bf16x2 words");

#ifndef EMB_WARPS
#define EMB_WARPS 8  // rows (one warp each) per CTA of the forward
#endif

// Adds two bf16x2 words in f32, rounding once.
__device__ __forceinline__ u32 add_bf16x2(u32 a, u32 b) {
    return pack_bf16x2(bf16x2_lo(a) + bf16x2_lo(b), bf16x2_hi(a) + bf16x2_hi(b));
}

// out (N, C) = wte[tokens] + wpe[t], row n = b*T + t.
// Bound: bytes. Reads a wte row and a wpe row and writes an out row per position (wpe rows are
// L2 hits after the first batch row); ~6 bytes per element, no math to speak of.
// Launch: grid ceil(N / EMB_WARPS), block 32*EMB_WARPS; warp w of CTA k does row k*EMB_WARPS + w,
// lane l its vectors l, l+32, ...
// A token id >= V reads nothing and writes a row of NaN: the loss turns NaN, so bad data shows
// at once instead of reading past wte (the CPU reference returns an index error instead).
extern "C" __global__ void __launch_bounds__(32 * EMB_WARPS)
    embedding_forward(act_t* __restrict__ out, const u32* __restrict__ tokens,
                      const act_t* __restrict__ wte, const act_t* __restrict__ wpe, int N, int T,
                      int C, int V) {
    const int row = blockIdx.x * EMB_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const u32 tok = tokens[row];
    const int t = row % T;
    const int nv = C / 8;
    uint4* o = reinterpret_cast<uint4*>(out + (i64)row * C);
    if (tok >= (u32)V) {
        const u32 nan2 = 0x7fc07fc0u;
        for (int i = lane; i < nv; i += 32) o[i] = make_uint4(nan2, nan2, nan2, nan2);
        return;
    }
    const uint4* a = reinterpret_cast<const uint4*>(wte + (i64)tok * C);
    const uint4* p = reinterpret_cast<const uint4*>(wpe + (i64)t * C);
    for (int i = lane; i < nv; i += 32) {
        const uint4 x = a[i], y = p[i];
        o[i] = make_uint4(add_bf16x2(x.x, y.x), add_bf16x2(x.y, y.y), add_bf16x2(x.z, y.z),
                          add_bf16x2(x.w, y.w));
    }
}

// Adds the 8 bf16 of v to acc[0..8] in f32.
__device__ __forceinline__ void acc_bf16x8(float* acc, uint4 v) {
    acc[0] += bf16x2_lo(v.x);
    acc[1] += bf16x2_hi(v.x);
    acc[2] += bf16x2_lo(v.y);
    acc[3] += bf16x2_hi(v.y);
    acc[4] += bf16x2_lo(v.z);
    acc[5] += bf16x2_hi(v.z);
    acc[6] += bf16x2_lo(v.w);
    acc[7] += bf16x2_hi(v.w);
}

__device__ __forceinline__ uint4 pack_bf16x8(const float* a) {
    return make_uint4(pack_bf16x2(a[0], a[1]), pack_bf16x2(a[2], a[3]), pack_bf16x2(a[4], a[5]),
                      pack_bf16x2(a[6], a[7]));
}

// dwte rows of the distinct tokens: dwte[tok_d] = sum over j in [off_d, off_{d+1}) of
// dout[pos_j], in f32, in increasing j (= increasing flat position: the launcher's CSR is
// stable), rounded once. Deterministic: no atomics, fixed order. Rows of tokens absent from
// the batch are not touched (the launcher zeroes dwte first). With onto (nonzero), dwte holds
// another gradient of the table (a tied LM head's) and the row sum, rounded, is added to it
// in f32 and rounded again: what adding the two (V, C) gradients gives (a row of -0.0 the sum
// does not touch stays -0.0, where adding a zero row gives +0.0), with no zeroed table and no
// pass over both.
// csr (u32): [tok_0 .. tok_{nd-1} | off_0 .. off_nd | pos_0 .. pos_{N-1}].
// Bound: bytes (reads dout once, N*C*2 bytes; writes nd rows). A very frequent token makes one
// CTA walk a long chain; loads of the chain are independent (unrolled) so they stay in flight.
// Launch: grid nd, block ~C/8 threads rounded up to a warp (max 256), a thread per vector
// (looping when C/8 > blockDim).
extern "C" __global__ void __launch_bounds__(256)
    embedding_backward_wte(act_t* __restrict__ dwte, const act_t* __restrict__ dout,
                           const u32* __restrict__ csr, int nd, int C, int onto) {
    const int d = blockIdx.x;
    const u32 tok = csr[d];
    const u32 beg = csr[nd + d], end = csr[nd + d + 1];
    const u32* pos = csr + 2 * nd + 1;
    const int nv = C / 8;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
        for (u32 j = beg; j < end; ++j) {
            const uint4 v = reinterpret_cast<const uint4*>(dout + (i64)pos[j] * C)[i];
            acc_bf16x8(acc, v);
        }
        uint4* row = reinterpret_cast<uint4*>(dwte + (i64)tok * C);
        const uint4 sum = pack_bf16x8(acc);
        if (onto) {
            const uint4 o = row[i];
            row[i] = make_uint4(add_bf16x2(o.x, sum.x), add_bf16x2(o.y, sum.y),
                                add_bf16x2(o.z, sum.z), add_bf16x2(o.w, sum.w));
        } else {
            row[i] = sum;
        }
    }
}

// dwpe (max_t, C): row t < T is sum over b = 0, 1, ... of dout[b, t] in f32 (fixed order),
// rows t >= T are zero. Writes every row.
// Bound: bytes (reads dout once, writes max_t rows).
// Launch: grid max_t, block ~C/8 threads rounded up to a warp (max 256).
extern "C" __global__ void __launch_bounds__(256)
    embedding_backward_wpe(act_t* __restrict__ dwpe, const act_t* __restrict__ dout, int B, int T,
                           int C) {
    const int t = blockIdx.x;
    const int nv = C / 8;
    uint4* o = reinterpret_cast<uint4*>(dwpe + (i64)t * C);
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (t < T) {
#pragma unroll 4
            for (int b = 0; b < B; ++b) {
                const uint4 v = reinterpret_cast<const uint4*>(dout + ((i64)b * T + t) * C)[i];
                acc_bf16x8(acc, v);
            }
        }
        o[i] = pack_bf16x8(acc);
    }
}
