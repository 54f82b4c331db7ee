// fp8.cu: the FP8 E4M3 quantisers of the FP8 linear layers (issue 40; model/src/layers/
// fp8_linear.rs has the recipe and the launchers, docs/kernels.md "FP8 compute" the layouts).
// Each writes codes and f32 scales in the layouts cuBLASLt's block-scaled FP8 GEMMs read on
// Hopper (CUDA 12.9+), for an operand stored K-contiguous (cuBLAS's TN form) with K the
// contraction:
//   VEC128_32F     one scale a 128 elements along K; scale of (outer o, K block kb) at
//                  kb * OUTER + o (outer index fastest).
//   BLK128x128_32F one scale a 128 x 128 tile; scale of (outer block ob, K block kb) at
//                  ob * round_up(KB, 4) + kb.
// fp8_quantize_rows: x (R, S) -> codes (R, S), 1 x 128 blocks along S (VEC128, outer R).
// fp8_quantize_cols_t: x (R, S) -> codes of x^T (S, R), 128 x 1 blocks of x (VEC128, outer S):
//   the weight gradient's two operands, contracted over the tokens.
// fp8_quantize_tiles: w (IN, OUT) -> codes (IN, OUT) and codes^T (OUT, IN), one 128 x 128 tile
//   scale in both BLK128x128 layouts: the input gradient reads w's codes (K = OUT), the
//   forward w^T's (K = IN; Hopper's FP8 MMA is TN-only, so the forward needs them transposed).
// Every code and scale equals quant::quantize_fp8_e4m3_tiles bitwise (the block's absmax, the
// multiplier 448 / a and the scale a / 448 as IEEE f32 divisions, one f32 product, then the
// saturating round to nearest even of cvt.rn.satfinite.e4m3x2; a block holding an inf or NaN
// gets scale NaN and codes 0), which tests/gpu/fp8.rs asserts. Compiled for compute_90 (the
// e4m3x2 conversion needs sm_89) in the fast flavour: every operation whose rounding matters
// is written out (__fdiv_rn, __fmul_rn), so contraction cannot change it, and nothing flushes.
// Bound by memory bandwidth: 2 bytes read and 1 written an element (the tiles 2 written, both
// orientations). How close they get is not measured yet: none of this has run on a GPU (no
// device was lent when it was written, 2026-12-05); tests/gpu/fp8.rs's Llama-shape timing
// (`gpu-tests fp8_gemms --nocapture`) prints each FP8 layer, quantisers included, beside bf16.
#include "common.cuh"

#define FP8_ABS_MASK 0x7fffffffu
#define FP8_NON_FINITE 0x7f800000u
#define FP8_F32_MAX 3.40282346638528859812e+38f
#define E4M3_MAX 448.0f
// torchao's floor on amax (quant/src/fp8.rs AMAX_MIN) and the scale and multiplier of a block
// below it, each the f64 quotient rounded once to f32, as the CPU's constants are.
#define AMAX_MIN 1e-12
#define MIN_SCALE ((float)(AMAX_MIN / 448.0))
#define MIN_MULT ((float)(448.0 / AMAX_MIN))

__device__ __forceinline__ u32 fp8_absbits(float v) { return __float_as_uint(v) & FP8_ABS_MASK; }
__device__ __forceinline__ u32 fp8_umax(u32 a, u32 b) { return a > b ? a : b; }

// quant/src/fp8.rs fp8_e4m3_scale: (scale, multiplier) of a block of absmax bits m.
struct Fp8Scale {
    float scale;
    float mult;
};
__device__ __forceinline__ Fp8Scale fp8_scale(u32 m) {
    Fp8Scale r;
    if (m >= FP8_NON_FINITE) {
        r.scale = __uint_as_float(0x7fc00000u);
        r.mult = 0.0f;  // unused: the codes of such a block are 0
        return r;
    }
    const float a = __uint_as_float(m);
    if ((double)a < AMAX_MIN) {
        r.scale = MIN_SCALE;
        r.mult = MIN_MULT;
        return r;
    }
    float s = __fdiv_rn(a, E4M3_MAX);
    if (__fmul_rn(s, E4M3_MAX) > FP8_F32_MAX) s = __uint_as_float(__float_as_uint(s) - 1u);
    r.scale = s;
    r.mult = __fdiv_rn(E4M3_MAX, a);
    return r;
}

// The codes of lo and hi (lo in the low byte): e4m3_encode(fl32(v * mult)), saturating.
__device__ __forceinline__ u32 fp8_pair(float lo, float hi, float mult) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
        : "=h"(r)
        : "f"(__fmul_rn(hi, mult)), "f"(__fmul_rn(lo, mult)));
    return r;
}

// x (rows, cols) bf16, row stride ldx -> codes (rows, cols) row stride cols, scales
// [ceil(cols / 128)][rows]. A warp a 1 x 128 block, 4 elements a lane.
extern "C" __global__ void fp8_quantize_rows(const bf16* __restrict__ x, i64 ldx,
                                             u8* __restrict__ codes, float* __restrict__ scales,
                                             int rows, int cols) {
    const int blocks = (cols + 127) / 128;
    const i64 warp = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (warp >= (i64)rows * blocks) return;  // whole warps: the shuffles below stay full
    const int r = (int)(warp / blocks), b = (int)(warp % blocks);
    const int c0 = b * 128 + lane * 4;
    const bf16* p = x + (i64)r * ldx + c0;
    float v[4];
    u32 m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = c0 + i < cols ? bf16_to_f32(p[i]) : 0.0f;
        m = fp8_umax(m, fp8_absbits(v[i]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fp8_umax(m, __shfl_xor_sync(0xffffffffu, m, o));
    const Fp8Scale s = fp8_scale(m);
    if (lane == 0) scales[(i64)b * rows + r] = s.scale;
    const u32 q = m >= FP8_NON_FINITE ? 0u
                                      : fp8_pair(v[0], v[1], s.mult) | fp8_pair(v[2], v[3], s.mult) << 16;
    u8* out = codes + (i64)r * cols + c0;
    if (c0 + 3 < cols && (cols & 3) == 0) {
        *reinterpret_cast<u32*>(out) = q;
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (c0 + i < cols) out[i] = (u8)(q >> (8 * i));
    }
}

// x (rows, cols) bf16, row stride ldx -> codes_t (cols, rows) row stride rows (x^T's codes),
// scales [ceil(rows / 128)][cols]: 128 x 1 blocks of x. A CTA of 256 threads a 128 x 32 piece
// through shared memory; grid (ceil(cols / 32), ceil(rows / 128)).
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_cols_t(const bf16* __restrict__ x, i64 ldx, u8* __restrict__ codes_t,
                    float* __restrict__ scales, int rows, int cols) {
    __shared__ float tile[128][33];
    const int t = threadIdx.x;
    const int r0 = blockIdx.y * 128, c0 = blockIdx.x * 32;
    {
        const int c = c0 + (t & 31);
#pragma unroll 4
        for (int i = 0; i < 16; ++i) {
            const int rr = (t >> 5) + 8 * i, r = r0 + rr;
            tile[rr][t & 31] = r < rows && c < cols ? bf16_to_f32(x[(i64)r * ldx + c]) : 0.0f;
        }
    }
    __syncthreads();
    // 8 consecutive lanes a column, 16 rows each.
    const int col = t >> 3, part = t & 7;
    float v[16];
    u32 m = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        v[i] = tile[part * 16 + i][col];
        m = fp8_umax(m, fp8_absbits(v[i]));
    }
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) m = fp8_umax(m, __shfl_xor_sync(0xffffffffu, m, o));
    const int c = c0 + col;
    if (c >= cols) return;
    const Fp8Scale s = fp8_scale(m);
    if (part == 0) scales[(i64)blockIdx.y * cols + c] = s.scale;
    u32 q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        q[i] = m >= FP8_NON_FINITE ? 0u
                                   : fp8_pair(v[4 * i], v[4 * i + 1], s.mult) |
                                         fp8_pair(v[4 * i + 2], v[4 * i + 3], s.mult) << 16;
    const int rs = r0 + part * 16;
    u8* out = codes_t + (i64)c * rows + rs;
    if (rs + 16 <= rows && (rows & 15) == 0) {
        *reinterpret_cast<uint4*>(out) = make_uint4(q[0], q[1], q[2], q[3]);
    } else {
        for (int i = 0; i < 16 && rs + i < rows; ++i) out[i] = (u8)(q[i / 4] >> (8 * (i % 4)));
    }
}

// w (rows = IN, cols = OUT) bf16, row stride ldw -> codes (IN, OUT) row stride OUT, codes_t
// (OUT, IN) row stride IN (either may be null: not written), and each 128 x 128 tile's scale at scales_fwd[ob * ld_fwd + ib]
// (w^T's BLK128x128 layout, ld_fwd = round_up(ceil(IN / 128), 4)) and scales_bwd[ib * ld_bwd +
// ob] (w's, ld_bwd = round_up(ceil(OUT / 128), 4)). A CTA of 256 threads a tile; grid
// (ceil(OUT / 128), ceil(IN / 128)).
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_tiles(const bf16* __restrict__ w, i64 ldw, u8* __restrict__ codes,
                   u8* __restrict__ codes_t, float* __restrict__ scales_fwd,
                   float* __restrict__ scales_bwd, int rows, int cols, int ld_fwd, int ld_bwd) {
    __shared__ u8 q[128][132];
    __shared__ u32 red[8];
    const int t = threadIdx.x;
    const int ib = blockIdx.y, ob = blockIdx.x;
    const int r0 = ib * 128, c0 = ob * 128;
    // Element k of the tile (row k / 128, column k % 128) is thread k % 256's (k / 256)-th.
    float v[64];
    u32 m = 0;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        const int k = t + 256 * i, r = r0 + k / 128, c = c0 + k % 128;
        v[i] = r < rows && c < cols ? bf16_to_f32(w[(i64)r * ldw + c]) : 0.0f;
        m = fp8_umax(m, fp8_absbits(v[i]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fp8_umax(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((t & 31) == 0) red[t >> 5] = m;
    __syncthreads();
    m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fp8_umax(m, red[i]);
    const Fp8Scale s = fp8_scale(m);
    if (t == 0) {
        scales_fwd[(i64)ob * ld_fwd + ib] = s.scale;
        scales_bwd[(i64)ib * ld_bwd + ob] = s.scale;
    }
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
        // Elements i and i + 1 of this thread are 256 apart: two rows, same column.
        const u32 pair = m >= FP8_NON_FINITE ? 0u : fp8_pair(v[i], v[i + 1], s.mult);
        const int k = t + 256 * i, rr = k / 128, cc = k % 128;
        q[rr][cc] = (u8)pair;
        q[rr + 2][cc] = (u8)(pair >> 8);
    }
    __syncthreads();
    // Row-major codes, then the transposed ones, a byte a thread, consecutive threads on
    // consecutive addresses; a null pointer skips its orientation (a pass reads only one).
    if (codes != nullptr)
        for (int k = t; k < 128 * 128; k += 256) {
            const int rr = k / 128, cc = k % 128, r = r0 + rr, c = c0 + cc;
            if (r < rows && c < cols) codes[(i64)r * cols + c] = q[rr][cc];
        }
    if (codes_t != nullptr)
        for (int k = t; k < 128 * 128; k += 256) {
            const int cc = k / 128, rr = k % 128, r = r0 + rr, c = c0 + cc;
            if (r < rows && c < cols) codes_t[(i64)c * rows + r] = q[rr][cc];
        }
}

// ---- FP8 qwZ (zero/src/codec/fp8.rs, its `cuda` module the launchers) ----------------------
// A gather job's steps on the communication stream: a rank's partial absmax of the 128 x 128
// tiles its shard touches, the resolution of the gathered slots, the encoding of its shard with
// the common scales, and the tiles' scales. Each equals the codec's CPU step bitwise (an absmax
// is the max of |x| as u32 bits, NaN counted as inf; a scale is fp8_scale's; a code
// fp8_pair's), which tests/gpu/fp8_qwz.rs asserts.
// A weight (rows, cols) lies at unit offset `off`; x is my shard in bf16, element 0 at unit
// offset `at`; the kernels see the weight's elements in [lo, hi), inside both. A warp a
// segment: one row's elements in one 128-column tile, 4 a lane, over rows (lo - off) / cols to
// (hi - 1 - off) / cols. Bound by memory bandwidth, 2 bytes read an element (the encoding 1
// more written); these are scalar accesses because a shard starts anywhere in a row.

__device__ __forceinline__ void fp8_segment(i64 off, i64 lo, i64 hi, int cols, int tile_cols,
                                            i64 seg, i64* row, int* tcol) {
    const i64 r0 = (lo - off) / cols;
    *row = r0 + seg / tile_cols;
    *tcol = (int)(seg % tile_cols);
}

// amax[tile - tile0] = max(amax[...], |x| bits) for the tiles of my elements (amax zeroed by
// the caller; tile0 the first tile of my slot, minus the weight's first tile).
extern "C" __global__ void fp8_gather_absmax(const bf16* __restrict__ x, i64 at, i64 off, i64 lo,
                                             i64 hi, int cols, int tile_cols, i64 segs,
                                             i64 tile0, u32* __restrict__ amax) {
    const i64 seg = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (seg >= segs) return;  // whole warps
    i64 r;
    int j;
    fp8_segment(off, lo, hi, cols, tile_cols, seg, &r, &j);
    u32 m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = j * 128 + lane * 4 + i;
        const i64 e = off + r * cols + c;
        if (c < cols && e >= lo && e < hi)
            m = fp8_umax(m, min(fp8_absbits(bf16_to_f32(x[e - at])), FP8_NON_FINITE));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fp8_umax(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0 && m != 0) atomicMax(amax + tile0 + (r / 128) * tile_cols + j, m);
}

// codes[e - at] = the code of x[e - at] with its tile's multiplier (amax: every tile's resolved
// absmax bits, tile0 the weight's first tile); 0 in a tile holding an inf or NaN.
extern "C" __global__ void fp8_gather_encode(const bf16* __restrict__ x, i64 at, i64 off, i64 lo,
                                             i64 hi, int cols, int tile_cols, i64 segs,
                                             i64 tile0, const u32* __restrict__ amax,
                                             u8* __restrict__ codes) {
    const i64 seg = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (seg >= segs) return;
    i64 r;
    int j;
    fp8_segment(off, lo, hi, cols, tile_cols, seg, &r, &j);
    const u32 m = amax[tile0 + (r / 128) * tile_cols + j];
    const Fp8Scale s = fp8_scale(m);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = j * 128 + lane * 4 + i;
        const i64 e = off + r * cols + c;
        if (c < cols && e >= lo && e < hi)
            codes[e - at] = m >= FP8_NON_FINITE ? 0 : (u8)fp8_pair(bf16_to_f32(x[e - at]), 0.0f, s.mult);
    }
}

// The gathered slots resolved: map[i] is where slot word i goes (-1: nowhere); below `tiles`
// it is a tile's absmax, the max of the ranks' (resolved zeroed by the caller), else a norm or
// bias element, copied.
extern "C" __global__ void fp8_gather_resolve(const u32* __restrict__ headers,
                                              const int* __restrict__ map, i64 n, int tiles,
                                              u32* __restrict__ resolved) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const int d = map[i];
        if (d < 0) continue;
        if (d < tiles) {
            if (headers[i] != 0) atomicMax(resolved + d, headers[i]);
        } else {
            resolved[d] = headers[i];
        }
    }
}

// scales[i] = the scale of absmax bits amax[i] (NaN for an inf or NaN).
extern "C" __global__ void fp8_gather_scales(const u32* __restrict__ amax, i64 n,
                                             float* __restrict__ scales) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        scales[i] = fp8_scale(amax[i]).scale;
}

// y = x widened (bf16 -> f32), and y = x narrowed (f32 -> bf16, nearest even): a unit's norm
// and bias elements into and out of the f32 slots.
extern "C" __global__ void fp8_gather_widen(const bf16* __restrict__ x, i64 n, float* __restrict__ y) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        y[i] = bf16_to_f32(x[i]);
}
extern "C" __global__ void fp8_gather_narrow(const float* __restrict__ x, i64 n, bf16* __restrict__ y) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        y[i] = f32_to_bf16(x[i]);
}
