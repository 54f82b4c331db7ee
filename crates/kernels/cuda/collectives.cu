// collectives.cu: the local backend's reductions on a GPU's communication stream (W ranks
// sharing one GPU): out[i] = p[0][i] + p[1][i] + ... + p[count-1][i], added in piece
// (group-rank) order one rounding at a time, exactly as the CPU backend's `sum_in_order` (in
// f32, or in bf16 with every partial sum rounded to bf16 as candle's bf16 add does); with
// `accumulate`, out[i] is the first term (a group of more than MAX_PIECES members is summed
// MAX_PIECES pieces a launch, in order).
// Memory-bound: count + 1 loads and one store of 4 bytes an element, coalesced; grid-stride,
// 256-thread CTAs, at most GRID of them. Compiled exact (no FMA contraction; adds only).
// Not timed on its own: it runs on the communication stream, inside the local backend's
// collectives, whose whole worlds docs/results.md measures (issue 16).
#include "common.cuh"

#ifndef MAX_PIECES
#define MAX_PIECES 16
#endif
#ifndef GRID
#define GRID 2048
#endif

struct Pieces {
    const void* p[MAX_PIECES];
    int count;
};

extern "C" __global__ void __launch_bounds__(256) sum_pieces_f32(
    Pieces pieces, float* __restrict__ out, long long n, int accumulate) {
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n; i += (long long)GRID * 256) {
        int j = 0;
        float s;
        if (accumulate) {
            s = out[i];
        } else {
            s = static_cast<const float*>(pieces.p[0])[i];
            j = 1;
        }
        for (; j < pieces.count; ++j) s = __fadd_rn(s, static_cast<const float*>(pieces.p[j])[i]);
        out[i] = s;
    }
}

extern "C" __global__ void __launch_bounds__(256) sum_pieces_bf16(
    Pieces pieces, bf16* __restrict__ out, long long n, int accumulate) {
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n; i += (long long)GRID * 256) {
        int j = 0;
        bf16 s;
        if (accumulate) {
            s = out[i];
        } else {
            s = static_cast<const bf16*>(pieces.p[0])[i];
            j = 1;
        }
        for (; j < pieces.count; ++j)
            s = f32_to_bf16(__fadd_rn(bf16_to_f32(s), bf16_to_f32(static_cast<const bf16*>(pieces.p[j])[i])));
        out[i] = s;
    }
}
