// fp8.cu: the FP8 E4M3 quantisers of the FP8 linear layers (issue 40; model/src/layers/
// fp8_linear.rs has the recipe and the launchers, docs/kernels.md "FP8 compute" the layouts).
// Each writes codes and f32 scales in the layouts cuBLASLt's block-scaled FP8 GEMMs read on
// Hopper (CUDA 12.9+), for an operand stored K-contiguous (cuBLAS's TN form) with K the
// contraction:
//   VEC128_32F     one scale a 128 elements along K; scale of (outer o, K block kb) at
//                  kb * OUTER + o (outer index fastest).
//   BLK128x128_32F one scale a 128 x 128 tile; scale of (outer block ob, K block kb) at
//                  ob * round_up(KB, 4) + kb.
//   OUTER_VEC_32F  one scale a row of the operand (the whole of K); scale of outer o at o.
// fp8_quantize_act: x (R, S) read once -> codes (R, S) in 1 x 128 blocks along S (VEC128,
//   outer R), and/or the codes of x^T (S, R) in 128 x 1 blocks of x (VEC128, outer S): the
//   forward's and input gradient's left operands, the weight gradient's two operands (the
//   backward asks for both orientations of dout in one pass). Or x^T's codes with one scale a
//   whole column of x (OUTER_VEC) from the columns' absmax given, which the same kernel
//   reduces in a pass of its own: the down projection's weight gradient, whose GEMM runs at
//   1345-1362 TFLOP/s with both operands so against 850-1040 in 128 x 1 blocks (Llama 3.2
//   1B's shapes, H100; cuBLASLt takes OUTER_VEC only on both operands). Or x^T's codes with
//   one scale a 128 x 128 tile (BLK128x128): the other weight gradients' input operand, beside
//   dout^T in 128 x 1 blocks (1279-1298 TFLOP/s against 1027-1043 with both in blocks; the
//   norms' and GELU's quantisers below write their x^T so too).
// fp8_quantize_tiles: w (IN, OUT) -> codes (IN, OUT) and codes^T (OUT, IN), one 128 x 128 tile
//   scale in both BLK128x128 layouts: the input gradient reads w's codes (K = OUT), the
//   forward w^T's (K = IN; Hopper's FP8 MMA is TN-only, so the forward needs them transposed).
//   One launch takes a packed projection's weights (q|k|v, gate|up) together, so that the
//   small ones do not run alone on a few SMs.
// fp8_transpose_tiles: the same transposition of codes and scales FP8 qwZ gathered.
// fp8_quantize_swiglu, fp8_quantize_swiglu_grad: fp8_quantize_act of SwiGLU's output and of
//   its gradient, computed in the kernel from what SwiGLU reads (the cast fused into the
//   producer: no bf16 act or dgu under FP8). The forward reduces act's columns' absmax instead
//   of writing act^T's codes; the backward, which reads gate and up anyway, writes act^T's
//   codes with those whole columns' scales for down's weight gradient.
// fp8_quantize_gelu: fp8_quantize_act of GELU of an FP8 layer's output (no bf16 gelu(h) under
//   FP8); fp8_quantize_gelu_grad: of GELU's gradient, with the column sums of the layer's bias
//   gradient.
// fp8_quantize_rmsnorm, fp8_quantize_layernorm: fp8_quantize_act of a norm's output, computed
//   from the norm's input and the row statistics its forward wrote without its output (no
//   bf16 normalised rows under FP8).
// Every code and scale equals quant::quantize_fp8_e4m3_tiles bitwise (the block's absmax, the
// multiplier 448 / a and the scale a / 448 as IEEE f32 divisions, one f32 product, then the
// saturating round to nearest even of cvt.rn.satfinite.e4m3x2; a block holding an inf or NaN
// gets scale NaN and codes 0), which tests/gpu/fp8.rs asserts. Compiled for compute_90 (the
// e4m3x2 conversion needs sm_89) in the fast flavour: every operation whose rounding matters
// is written out (__fdiv_rn, __fmul_rn), so contraction cannot change it, and nothing flushes.
// Bound by memory bandwidth: 2 bytes read and 1 written an element a orientation. How close,
// on an H100 (3.35 TB/s) at 16,384 tokens (2026-12-06, the tile kept in registers, 8 rows a
// thread: 64 registers, 4 CTAs an SM; timed beside the earlier kernel, which staged the tile
// through shared memory at 78-128 registers, bit for bit equal): fp8_quantize_act both ways
// 2.35-2.47 TB/s at 2048-8192 columns (70-74%; ncu: DRAM 74%, half the warps waiting on
// loads), 2.17 at 1024; the row blocks alone 2.68 TB/s (80%); the column blocks alone 2.38;
// fp8_quantize_swiglu_grad 2.17 TB/s of dact and gate|up read and codes written (its arithmetic
// now shares the issue slots: ncu's SM throughput 64%), fp8_quantize_swiglu 2.37,
// fp8_quantize_rmsnorm 2.09 (1.14-1.38x the earlier kernels). fp8_quantize_tiles (the
// weights, laid out the same way, 64 registers) both orientations 2.26 TB/s at gate|up's
// (2048, 16,384), 2.11 at down's (8192, 2048), 2.18 at q|k|v's (2048, 3072) (1.28-1.48x the
// earlier kernel, which staged the codes through shared memory at 86 registers; bit for bit).
// Whole columns (2026-12-06, twelfth session, an H100): fp8_quantize_act's absmax pass then
// both orientations 0.088 ms at (16,384, 2048) against 0.057 in blocks; fp8_quantize_swiglu's
// row blocks with act's absmax 0.280 ms against 0.347 both ways; fp8_quantize_swiglu_grad with
// act^T 0.965 ms against 0.625 when it read gate and up again (from DRAM), and less with act's
// tile parked in shared memory (not timed alone; the 1B step's quantisation 30.09 ms against
// 32.24).
// The fused quantisers (SwiGLU's, the norms', GELU's) move fp8_quantize_act's
// bytes both ways plus what they read to make their tile (SwiGLU: gate and up; a norm: its
// input, its weight (and bias) vector a thread and its statistics a row; GELU: the layer's
// output, written back with its bias).
#include "common.cuh"
#include "swiglu.cuh"
#include "rmsnorm.cuh"
#include "layernorm.cuh"
#include "gelu.cuh"

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

// The codes of 8 values (lo byte first) with one multiplier, as two words.
__device__ __forceinline__ uint2 fp8_pack8(const float* v, float mult) {
    return make_uint2(fp8_pair(v[0], v[1], mult) | fp8_pair(v[2], v[3], mult) << 16,
                      fp8_pair(v[4], v[5], mult) | fp8_pair(v[6], v[7], mult) << 16);
}

// 8 codes (q's bytes, the low word's first) at out, of which the first `left` are inside the
// matrix: one 8-byte store where all 8 are and `aligned` (the row stride a multiple of 8),
// else byte by byte.
__device__ __forceinline__ void fp8_store8(u8* out, uint2 q, int left, bool aligned) {
    if (left >= 8 && aligned) {
        *reinterpret_cast<uint2*>(out) = q;
    } else {
        const u32 p[2] = {q.x, q.y};
        for (int b = 0; b < 8 && b < left; ++b) out[b] = (u8)(p[b / 4] >> (8 * (b % 4)));
    }
}

__device__ __forceinline__ void fp8_unpack8(uint4 raw, float* v) {
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// The absolute values of a bf16x2 word's halves (the sign bits cleared), the larger of each
// half of two such words (one instruction on sm_90: as unsigned 16-bit integers, the order of
// the absolute values, with inf above every finite value and NaN above inf), and the f32 bits
// of a word's larger half: a block's absmax in the f32 bits fp8_scale takes.
__device__ __forceinline__ u32 fp8_abs2(u32 w) { return w & 0x7fff7fffu; }
__device__ __forceinline__ u32 fp8_max2(u32 a, u32 b) {
    u32 r;
    asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 fp8_wider(u32 m2) { return fp8_umax(m2 << 16, m2 & 0xffff0000u); }
__device__ __forceinline__ u32 fp8_abs_max4(uint4 v) {
    return fp8_max2(fp8_max2(fp8_abs2(v.x), fp8_abs2(v.y)), fp8_max2(fp8_abs2(v.z), fp8_abs2(v.w)));
}
__device__ __forceinline__ u32 fp8_word(uint4 v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}
// Column k (0..7) of 8 rows of 8 bf16 columns (raw[i] row i), as f32.
__device__ __forceinline__ void fp8_column8(const uint4 raw[8], int k, float v[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 w = fp8_word(raw[i], k >> 1);
        v[i] = __uint_as_float((k & 1) ? (w & 0xffff0000u) : (w << 16));
    }
}

// An activation or gradient x (rows, cols) bf16 at row stride ldx (a view: its first element
// and ldx on 16 bytes, cols a multiple of 8), read once, quantised in either or both blocks:
//   codes (rows, cols) row stride cols in 1 x 128 blocks, scales [ceil(cols / 128)][rows]
//     (the forward's and the input gradient's left operand: VEC128, outer R);
//   codes_t (cols, rows) row stride rows, x^T's codes, in 128 x 1 blocks of x, scales_t
//     [ceil(rows / 128)][cols] (the weight gradient's dout operand: VEC128, outer S), or with
//     col_tiles one scale a 128 x 128 tile, scales_t [ceil(cols / 128)][round_up(ceil(rows /
//     128), 4)] (its input operand: BLK128x128, which cuBLASLt multiplies with VEC128 at
//     1.24-1.29x the speed of VEC128 on both sides at Llama 3.2 1B's shapes, and 2.2x at
//     gpt350m's c_attn: scripts/fp8bench/gemm_modes.cu).
// A null codes pointer skips that orientation. A CTA of 256 threads a 128 x 128 tile; grid
// (ceil(cols / 128), ceil(rows / 128)). Thread t holds 8 consecutive rows ((t / 16) * 8 on) of
// the 8 columns (t % 16) * 8 on, loaded in 16-byte vectors and kept in registers: a row's 16
// threads are 16 lanes of a warp (its absmax a shuffle), and a column's 8 codes of x^T are
// consecutive bytes, so both orientations leave from registers and no tile passes through
// shared memory (only the columns' maxima and multipliers, 2.5 KB).
// fp8_quantize_tile is that quantisation of one tile (tile_row, tile_col) from the rows this
// thread loaded: raw[i] is row tile_row * 128 + (t / 16) * 8 + i, columns tile_col * 128 +
// (t % 16) * 8 to + 7 (bf16 bits, zeros outside the matrix). ld is the row stride of codes and
// scales_t: cols, or more where the matrix is a block of columns of a wider one (SwiGLU's
// gradient writes its halves side by side). Every thread of the CTA calls it once.
__device__ __forceinline__ void fp8_quantize_tile(const uint4 raw[8], int tile_row, int tile_col,
                                                  u8* __restrict__ codes,
                                                  float* __restrict__ scales,
                                                  u8* __restrict__ codes_t,
                                                  float* __restrict__ scales_t, int rows,
                                                  int cols, int ld,
                                                  u32* __restrict__ col_reduce = nullptr,
                                                  const u32* __restrict__ col_given = nullptr,
                                                  bool col_tiles = false) {
    __shared__ __align__(16) u32 warp_cols[8][64];  // each warp's column maxima, 2 a word
    __shared__ __align__(16) float col_mult[128];   // NaN: the column's block is not finite
    __shared__ u32 tile_max[4];                     // col_tiles: 32 columns' maxima each
    const int t = threadIdx.x, lane = t & 31;
    const int c = tile_col * 128 + (t & 15) * 8;
    const int rb = tile_row * 128 + (t >> 4) * 8;  // this thread's first row
    if (codes != nullptr) {
        // Row rb + i's absmax in every one of its 16 lanes; lane k of them (k < 8) works out the
        // scale of row rb + k and hands its multiplier to the others.
        u32 m[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            u32 w = fp8_abs_max4(raw[i]);
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) w = fp8_max2(w, __shfl_xor_sync(0xffffffffu, w, o));
            m[i] = fp8_wider(w);
        }
        const int k = t & 7;
        u32 mine = m[0];
#pragma unroll
        for (int i = 1; i < 8; ++i) mine = k == i ? m[i] : mine;
        const Fp8Scale s = fp8_scale(mine);
        if ((t & 15) < 8 && rb + k < rows) scales[(i64)tile_col * rows + rb + k] = s.scale;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float mult = __shfl_sync(0xffffffffu, s.mult, (lane & 16) | i);
            if (rb + i >= rows || c >= cols) continue;
            float v[8];
            fp8_unpack8(raw[i], v);
            const uint2 q = m[i] >= FP8_NON_FINITE ? make_uint2(0, 0) : fp8_pack8(v, mult);
            *reinterpret_cast<uint2*>(codes + (i64)(rb + i) * ld + c) = q;
        }
    }
    if (codes_t == nullptr && col_reduce == nullptr) return;
    if (col_given != nullptr) {
        // One scale a whole column (OUTER_VEC), from its absmax reduced before this launch;
        // the CTAs of the first tile row write it.
        if (t < 128) {
            const int col = tile_col * 128 + t;
            const u32 m = col < cols ? col_given[col] : 0u;
            const Fp8Scale s = fp8_scale(m);
            if (tile_row == 0 && col < cols) scales_t[col] = s.scale;
            col_mult[t] = m >= FP8_NON_FINITE ? __uint_as_float(0x7fc00000u) : s.mult;
        }
    } else {
        // The columns' maxima: over this thread's 8 rows, the warp's 16 (the other half-warp
        // holds the next 8 rows of the same columns), then the 8 warps' through shared memory;
        // thread t < 128 works out column t's scale, and adds its maximum to the whole
        // column's where col_reduce is given.
        u32 cw[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            u32 w = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) w = fp8_max2(w, fp8_abs2(fp8_word(raw[i], j)));
            cw[j] = fp8_max2(w, __shfl_xor_sync(0xffffffffu, w, 16));
        }
        if ((lane & 16) == 0)
            *reinterpret_cast<uint4*>(&warp_cols[t >> 5][(t & 15) * 4]) =
                make_uint4(cw[0], cw[1], cw[2], cw[3]);
        __syncthreads();
        if (t < 128) {
            u32 w = 0;
#pragma unroll
            for (int k = 0; k < 8; ++k) w = fp8_max2(w, warp_cols[k][t >> 1]);
            const u32 m = (t & 1) ? (w & 0xffff0000u) : (w << 16);
            const int col = tile_col * 128 + t;
            if (col_reduce != nullptr && col < cols && m != 0) atomicMax(col_reduce + col, m);
            if (codes_t != nullptr && !col_tiles) {
                const Fp8Scale s = fp8_scale(m);
                if (col < cols) scales_t[(i64)tile_row * ld + col] = s.scale;
                col_mult[t] = m >= FP8_NON_FINITE ? __uint_as_float(0x7fc00000u) : s.mult;
            }
            if (codes_t != nullptr && col_tiles) {
                u32 w = m;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) w = fp8_umax(w, __shfl_xor_sync(0xffffffffu, w, o));
                if (lane == 0) tile_max[t >> 5] = w;
            }
        }
        if (codes_t != nullptr && col_tiles) {
            // One scale the whole 128 x 128 tile (x^T's BLK128x128: the tile is x^T's tile
            // (tile_col, tile_row), its scale at [tile_col][round_up(ceil(rows / 128), 4)]; the
            // last tile row's CTAs write the padding of their scale row, zeros).
            __syncthreads();
            if (t < 128) {
                const u32 m = fp8_umax(fp8_umax(tile_max[0], tile_max[1]),
                                       fp8_umax(tile_max[2], tile_max[3]));
                const Fp8Scale s = fp8_scale(m);
                col_mult[t] = m >= FP8_NON_FINITE ? __uint_as_float(0x7fc00000u) : s.mult;
                const int nrb = (rows + 127) / 128, ldt = (nrb + 3) & ~3;
                float* row = scales_t + (i64)tile_col * ldt;
                if (t == 0) row[tile_row] = s.scale;
                if (tile_row == nrb - 1 && t >= 1 && nrb + t - 1 < ldt) row[nrb + t - 1] = 0.0f;
            }
        }
    }
    if (codes_t == nullptr) return;
    __syncthreads();
    if (c >= cols || rb >= rows) return;
    const float4 ma = *reinterpret_cast<const float4*>(&col_mult[(t & 15) * 8]);
    const float4 mb = *reinterpret_cast<const float4*>(&col_mult[(t & 15) * 8 + 4]);
    const float mult[8] = {ma.x, ma.y, ma.z, ma.w, mb.x, mb.y, mb.z, mb.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        if (c + k >= cols) break;
        float v[8];
        fp8_column8(raw, k, v);
        const uint2 q = mult[k] != mult[k] ? make_uint2(0, 0) : fp8_pack8(v, mult[k]);
        fp8_store8(codes_t + (i64)(c + k) * rows + rb, q, rows - rb, (rows & 7) == 0);
    }
}

// The column of the 8-vector this thread loads in a tile quantiser (grid (column tiles, row
// tiles), 16 threads a row), and the first of its 8 rows.
__device__ __forceinline__ int fp8_vector_col() { return blockIdx.x * 128 + (threadIdx.x & 15) * 8; }
__device__ __forceinline__ int fp8_first_row() { return blockIdx.y * 128 + (threadIdx.x >> 4) * 8; }

// The column sums of a tile (raw as fp8_quantize_tile takes it: 8 rows of 8 columns a thread),
// in f32 in a fixed order (each thread's 8 rows in order, then the half-warp of the next 8 rows,
// then the 8 warps in order), at partials[tile_row * cols + column]: a bias gradient's partial
// sums, which bias_grad_final (elementwise.cu) adds over the tiles in order. Every thread of the
// CTA calls it.
__device__ __forceinline__ void fp8_tile_column_sums(const uint4 raw[8], float* __restrict__ partials,
                                                     int tile_row, int tile_col, int cols) {
    __shared__ float sums[8][128];  // each warp's column sums, in column order
    const int t = threadIdx.x;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        float f[8];
        unpack8(raw[i], f);
#pragma unroll
        for (int k = 0; k < 8; k++) acc[k] += f[k];
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float other = __shfl_xor_sync(0xffffffffu, acc[k], 16);
        acc[k] = (t & 16) ? other + acc[k] : acc[k] + other;
    }
    if ((t & 16) == 0)
#pragma unroll
        for (int k = 0; k < 8; k++) sums[t >> 5][(t & 15) * 8 + k] = acc[k];
    __syncthreads();
    if (t < 128 && tile_col * 128 + t < cols) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < 8; w++) sum += sums[w][t];
        partials[(i64)tile_row * cols + tile_col * 128 + t] = sum;
    }
}

// A tile quantiser's CTA: load(r, c) gives the bf16 bits of row r, columns c to c + 7 of the
// (rows, cols) matrix it quantises (called only inside it; zeros stand outside), and the tile
// goes through fp8_quantize_tile. The producers below are this with their load.
// Where partials is given, the tile's column sums go there too (fp8_tile_column_sums);
// col_reduce, col_given and col_tiles as fp8_quantize_tile takes them.
template <class Load>
__device__ __forceinline__ void fp8_quantize_loaded(Load load, u8* __restrict__ codes,
                                                    float* __restrict__ scales,
                                                    u8* __restrict__ codes_t,
                                                    float* __restrict__ scales_t, int rows,
                                                    int cols, float* __restrict__ partials = nullptr,
                                                    u32* __restrict__ col_reduce = nullptr,
                                                    const u32* __restrict__ col_given = nullptr,
                                                    bool col_tiles = false) {
    const int rb = fp8_first_row(), c = fp8_vector_col();
    uint4 raw[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
        raw[i] = rb + i < rows && c < cols ? load(rb + i, c) : make_uint4(0, 0, 0, 0);
    if (partials != nullptr) fp8_tile_column_sums(raw, partials, blockIdx.y, blockIdx.x, cols);
    fp8_quantize_tile(raw, blockIdx.y, blockIdx.x, codes, scales, codes_t, scales_t, rows, cols,
                      cols, col_reduce, col_given, col_tiles);
}

// partials (may be null): each tile's column sums of x, (ceil(rows / 128), cols) f32 (a
// layer's bias gradient, when x is its dout). col_reduce (may be null): the columns' absmax
// bits atomicMax'ed in (cols u32, zeroed by the caller; with both codes null this is the pass
// that reduces them). col_given (may be null): x^T's codes with one scale a whole column
// (OUTER_VEC, scales_t [cols]) from these absmax bits instead of 128 x 1 blocks. col_tiles
// (nonzero): x^T's codes with one scale a 128 x 128 tile instead (BLK128x128, scales_t
// [ceil(cols / 128)][round_up(ceil(rows / 128), 4)]): a weight gradient's input operand.
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_act(const bf16* __restrict__ x, i64 ldx, u8* __restrict__ codes,
                 float* __restrict__ scales, u8* __restrict__ codes_t,
                 float* __restrict__ scales_t, int rows, int cols, float* __restrict__ partials,
                 u32* __restrict__ col_reduce, const u32* __restrict__ col_given, int col_tiles) {
    fp8_quantize_loaded(
        [=](int r, int c) { return *reinterpret_cast<const uint4*>(x + (i64)r * ldx + c); },
        codes, scales, codes_t, scales_t, rows, cols, partials, col_reduce, col_given,
        col_tiles != 0);
}

// act = silu(gate) * up of row r, columns c to c + 7, of the packed gu (rows, 2F), as the bf16
// bits swiglu_forward writes.
__device__ __forceinline__ uint4 swiglu_act_load(const bf16* __restrict__ gu, int r, int c, int F) {
    float g[8], u[8], a[8];
    unpack8(ld16(gu + (i64)r * 2 * F + c), g);
    unpack8(ld16(gu + (i64)r * 2 * F + F + c), u);
    swiglu_act8(g, u, a);
    return pack8(a);
}

// SwiGLU's output act = silu(gate) * up (swiglu.cuh, rounded to bf16 as swiglu_forward rounds
// it) of the packed gu (rows, 2F) bf16, quantised as fp8_quantize_act quantises act (rows, F):
// the down projection's input in 1 x 128 blocks, without act in bf16 (swiglu_forward's write
// and the quantiser's read of it, 4 bytes an element of 10, gone), and act's columns' absmax
// (col_reduce, F u32 zeroed by the caller): down's weight gradient scales act^T a whole column
// at a time, and fp8_quantize_swiglu_grad encodes act^T with them in the backward. (codes_t,
// where given, are act^T's 128 x 1 blocks.) F % 8 == 0, gu 16-byte aligned. Grid
// (ceil(F / 128), ceil(rows / 128)).
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_swiglu(const bf16* __restrict__ gu, u8* __restrict__ codes,
                    float* __restrict__ scales, u8* __restrict__ codes_t,
                    float* __restrict__ scales_t, int rows, int F, u32* __restrict__ col_reduce) {
    fp8_quantize_loaded([=](int r, int c) { return swiglu_act_load(gu, r, c, F); }, codes, scales,
                        codes_t, scales_t, rows, F, nullptr, col_reduce);
}

// SwiGLU's gradient dgu = [dgate | dup] (swiglu.cuh, rounded to bf16 as swiglu_backward rounds
// it) from dact (rows, F) and gu (rows, 2F) bf16, quantised both ways as fp8_quantize_act
// quantises the (rows, 2F) matrix dgu: the packed gate|up projection's dout, without dgu in
// bf16 (read 6 bytes a channel pair and write 4 of codes, where swiglu_backward and the
// quantiser moved 18). codes (rows, 2F) and scales (2F / 128, rows), codes_t (2F, rows) and
// scales_t (ceil(rows / 128), 2F): dup's tiles are dgate's F columns (codes, scales_t) or F
// rows (scales, codes_t) further on. dgu is quantised as the (rows, 2F) matrix it is: CTA x
// takes tile x / 2 of dgate (x even) or of dup (x odd), so the two CTAs that read the same
// dact and gu run side by side and the second finds them in L2. F % 128 == 0 (no 1 x 128 block
// straddles the halves), dact and gu 16-byte aligned. Grid (2F / 128, ceil(rows / 128)).
// Where act_codes_t is given, the dup CTAs (which then read up too) also write down's weight
// gradient operand: act^T's codes (F, rows) row stride rows, act = swiglu_forward's bf16 act,
// each column with one scale from its absmax bits act_absmax[f] (fp8_quantize_swiglu's
// col_reduce), written by the first tile row at act_scales[f] (OUTER_VEC): no act^T kept from
// the forward, and 1 byte an element written where the forward wrote it.
// 4 CTAs an SM (64 registers, a few spilled) where act^T is asked; the bench builds it with
// FP8_SWIGLU_GRAD_CTAS=3 (80 registers, none spilled) beside it.
#ifndef FP8_SWIGLU_GRAD_CTAS
#define FP8_SWIGLU_GRAD_CTAS 4
#endif
extern "C" __global__ void __launch_bounds__(256, FP8_SWIGLU_GRAD_CTAS)
fp8_quantize_swiglu_grad(const bf16* __restrict__ dact, const bf16* __restrict__ gu,
                         u8* __restrict__ codes, float* __restrict__ scales,
                         u8* __restrict__ codes_t, float* __restrict__ scales_t, int rows,
                         int F, const u32* __restrict__ act_absmax, u8* __restrict__ act_codes_t,
                         float* __restrict__ act_scales) {
    // act's tile, as this thread computes it (its 8 rows of 8 columns, [row][thread]: the stores
    // and loads of a warp are consecutive 16 bytes), kept here while the CTA's dgu tile is
    // quantised: in registers it would take the kernel past 64 (2 CTAs an SM instead of 4),
    // and read again from gu it comes from DRAM (0.34 ms more at 1B's shape, measured).
    __shared__ uint4 act_tile[8][256];
    const int half = blockIdx.x & 1, tile = blockIdx.x >> 1;
    const int rb = fp8_first_row(), c = tile * 128 + (threadIdx.x & 15) * 8;
    // act^T goes with dup's CTA, which without it reads no up and quantises the lighter half:
    // it reads up here (mostly from L2, where dgate's CTA beside it has just brought it).
    const bool act_out = act_codes_t != nullptr && half == 1;  // the same for the whole CTA
    uint4 raw[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = rb + i;
        raw[i] = make_uint4(0, 0, 0, 0);
        uint4 a8 = make_uint4(0, 0, 0, 0);
        if (r < rows && c < F) {
            float d[8], g[8], u[8], dg[8], du[8];
            unpack8(ld16(dact + (i64)r * F + c), d);
            unpack8(ld16(gu + (i64)r * 2 * F + c), g);
            // dup = dact * silu(gate) does not read up (act does).
            const bool read_up = half == 0 || act_out;
            unpack8(read_up ? ld16(gu + (i64)r * 2 * F + F + c) : make_uint4(0, 0, 0, 0), u);
            if (act_out) {
                float a[8];
                swiglu_act8(g, u, a);
                a8 = pack8(a);
            }
            swiglu_grad8(d, g, u, dg, du);
#pragma unroll
            for (int k = 0; k < 8; ++k) dg[k] = half == 0 ? dg[k] : du[k];
            raw[i] = pack8(dg);
        }
        if (act_out) act_tile[i][threadIdx.x] = a8;
    }
    fp8_quantize_tile(raw, blockIdx.y, half * (F / 128) + tile, codes, scales, codes_t, scales_t,
                      rows, 2 * F, 2 * F);
    if (!act_out) return;
    // act's tile back (each thread its own), after the dgu tile's last read of the shared
    // column multipliers, which act's quantisation writes.
#pragma unroll
    for (int i = 0; i < 8; ++i) raw[i] = act_tile[i][threadIdx.x];
    __syncthreads();
    fp8_quantize_tile(raw, blockIdx.y, tile, nullptr, nullptr, act_codes_t, act_scales, rows, F, F,
                      nullptr, act_absmax);
}

// GELU after an FP8 layer (gelu_forward's arithmetic, gelu.cuh): g = gelu(h) of the layer's
// output h (rows, cols) bf16 (its bias added in the GEMM's epilogue), quantised as
// fp8_quantize_act quantises it with col_tiles: the next projection's input, its 1 x 128 blocks
// and x^T's 128 x 128 tiles (codes null: the tiles alone), without g in bf16 (gelu_forward's
// write of g and the quantiser's read of it, 4 bytes an element, gone). cols % 8 == 0, h
// 16-byte aligned. Grid (ceil(cols / 128), ceil(rows / 128)).
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_gelu(const bf16* __restrict__ h, u8* __restrict__ codes, float* __restrict__ scales,
                  u8* __restrict__ codes_t, float* __restrict__ scales_t, int rows, int cols,
                  float a, float s) {
    fp8_quantize_loaded(
        [=](int r, int c) {
            float v[8];
            unpack8(ld16(h + (i64)r * cols + c), v);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = gelu_f(v[k], a, s);
            return pack8(v);
        },
        codes, scales, codes_t, scales_t, rows, cols, nullptr, nullptr, nullptr, true);
}

// GELU's backward into the FP8 layer before it (gelu_backward_bias_grad_partial's arithmetic,
// gelu.cuh): dh = bf16(dg * gelu'(h)) of dg and h (rows, cols) bf16, quantised both ways as
// fp8_quantize_act quantises it (the layer's dout: GPT-2's c_fc), and each tile's column sums
// of dh (as rounded to bf16, in f32) at partials[tile row][cols], which bias_grad_final adds in
// order into the layer's bias gradient. dh is never written in bf16 (gelu_backward's write and
// the quantiser's read of it, 4 bytes an element, gone). cols % 8 == 0, dg and h 16-byte
// aligned. Grid (ceil(cols / 128), ceil(rows / 128)).
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_gelu_grad(const bf16* __restrict__ dg, const bf16* __restrict__ h,
                       float* __restrict__ partials, u8* __restrict__ codes,
                       float* __restrict__ scales, u8* __restrict__ codes_t,
                       float* __restrict__ scales_t, int rows, int cols, float a, float s) {
    fp8_quantize_loaded(
        [=](int r, int c) {
            float d[8], f[8];
            unpack8(ld16(dg + (i64)r * cols + c), d);
            unpack8(ld16(h + (i64)r * cols + c), f);
#pragma unroll
            for (int k = 0; k < 8; k++) f[k] = d[k] * gelu_grad(f[k], a, s);
            return pack8(f);
        },
        codes, scales, codes_t, scales_t, rows, cols, partials);
}

// RMSNorm's output n = bf16(bf16(h * rstd) * w) (rmsnorm.cuh: the bits rmsnorm_forward writes)
// of h (rows, cols) bf16 with each row's rstd (f32) and the norm's weight w (cols) bf16,
// quantised as fp8_quantize_act quantises n with col_tiles: the input of the projections after
// the norm, its 1 x 128 blocks and x^T's 128 x 128 tiles, without n in bf16 (the norm's write of n and the quantiser's read of it, 4
// bytes an element, gone; the norm still reads its input for the statistics, and this kernel
// reads it again). cols % 8 == 0, h and w 16-byte aligned. Grid (ceil(cols / 128),
// ceil(rows / 128)).
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_rmsnorm(const bf16* __restrict__ h, const float* __restrict__ rstd,
                     const bf16* __restrict__ w, u8* __restrict__ codes,
                     float* __restrict__ scales, u8* __restrict__ codes_t,
                     float* __restrict__ scales_t, int rows, int cols) {
    const int col = fp8_vector_col();
    const uint4 wv = col < cols ? ld16(w + col) : make_uint4(0, 0, 0, 0);
    fp8_quantize_loaded(
        [=](int r, int c) { return rms_out8(ld16(h + (i64)r * cols + c), wv, rstd[r]); },
        codes, scales, codes_t, scales_t, rows, cols, nullptr, nullptr, nullptr, true);
}

// LayerNorm's output n = (x - mean) * rstd * w + b (layernorm.cuh: the bits layernorm_forward
// writes) of x (rows, cols) bf16 with each row's mean and rstd (f32) and the norm's weight and
// bias (cols) bf16, quantised as fp8_quantize_act quantises n with col_tiles: GPT-2's
// projections' input after a norm, without n in bf16. cols % 8 == 0, x, w and b 16-byte aligned.
// Grid (ceil(cols / 128), ceil(rows / 128)).
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_layernorm(const bf16* __restrict__ x, const float* __restrict__ mean,
                       const float* __restrict__ rstd, const bf16* __restrict__ w,
                       const bf16* __restrict__ b, u8* __restrict__ codes,
                       float* __restrict__ scales, u8* __restrict__ codes_t,
                       float* __restrict__ scales_t, int rows, int cols) {
    const int col = fp8_vector_col();
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint4 wv = col < cols ? ld16(w + col) : zero, bv = col < cols ? ld16(b + col) : zero;
    fp8_quantize_loaded(
        [=](int r, int c) {
            return ln_out8(ld16(x + (i64)r * cols + c), wv, bv, mean[r], rstd[r]);
        },
        codes, scales, codes_t, scales_t, rows, cols, nullptr, nullptr, nullptr, true);
}

// The transpose of a 128 x 128 tile of codes q (shared memory, the tile at (r0, c0) of a
// (rows, cols) matrix) into codes_t (cols, rows) row stride rows: piece k (of 1024, four a
// thread) is column k % 128's bytes of tile rows (k / 128) * 16 to + 15, a lane a column (reads
// of q free of bank conflicts), stored in 16 bytes where rows allows, else byte by byte.
__device__ __forceinline__ void fp8_store_tile_t(u8 (*q)[144], u8* __restrict__ codes_t,
                                                 int r0, int c0, int rows, int cols) {
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int k = t + 256 * j, cc = k & 127, rs = (k >> 7) * 16, col = c0 + cc;
        if (col >= cols || r0 + rs >= rows) continue;
        u32 p[4];
#pragma unroll
        for (int b = 0; b < 4; ++b)
            p[b] = (u32)q[rs + 4 * b][cc] | (u32)q[rs + 4 * b + 1][cc] << 8 |
                   (u32)q[rs + 4 * b + 2][cc] << 16 | (u32)q[rs + 4 * b + 3][cc] << 24;
        u8* out = codes_t + (i64)col * rows + r0 + rs;
        if (r0 + rs + 16 <= rows && (rows & 15) == 0) {
            *reinterpret_cast<uint4*>(out) = make_uint4(p[0], p[1], p[2], p[3]);
        } else {
            for (int b = 0; b < 16 && r0 + rs + b < rows; ++b) out[b] = (u8)(p[b / 4] >> (8 * (b % 4)));
        }
    }
}

// w (rows = IN, cols = OUT) bf16, row stride ldw -> codes (IN, OUT) row stride OUT, codes_t
// (OUT, IN) row stride IN (either may be null: not written), and each 128 x 128 tile's scale at
// scales_fwd[ob * ld_fwd + ib] (w^T's BLK128x128 layout, ld_fwd = round_up(ceil(IN / 128), 4))
// and scales_bwd[ib * ld_bwd + ob] (w's, ld_bwd = round_up(ceil(OUT / 128), 4)). A CTA of 256
// threads a tile (fp8_quantize_tiles runs the grid of every weight's tiles), laid out as the
// activations' tile quantiser lays it out: thread t holds 8 consecutive rows ((t / 16) * 8 on)
// of the 8 columns (t % 16) * 8 on in registers, loaded in 16-byte vectors where w, ldw and OUT
// allow (else element by element), so a row's 8 codes of w and a column's 8 codes of w^T are
// consecutive bytes, stored from registers (8 bytes at once where the sides allow); only the
// tile's absmax passes through shared memory (8 words).
// fp8_weight_tile is one CTA's tile (ib, ob) of the nib x nob; every thread of the CTA calls it.
__device__ __forceinline__ void fp8_weight_tile(const bf16* __restrict__ w, i64 ldw,
                                                u8* __restrict__ codes, u8* __restrict__ codes_t,
                                                float* __restrict__ scales_fwd,
                                                float* __restrict__ scales_bwd, int rows,
                                                int cols, int ld_fwd, int ld_bwd, int ib, int ob,
                                                int nib, int nob) {
    __shared__ u32 red[8];
    const int t = threadIdx.x;
    const int rb = ib * 128 + (t >> 4) * 8, c = ob * 128 + (t & 15) * 8;
    const bool vec = (cols & 7) == 0 && (ldw & 7) == 0 && ((u64)w & 15) == 0;
    uint4 raw[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = rb + i;
        if (vec) {
            raw[i] = r < rows && c < cols ? *reinterpret_cast<const uint4*>(w + (i64)r * ldw + c)
                                          : make_uint4(0, 0, 0, 0);
        } else {
            u32 h[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) h[k] = r < rows && c + k < cols ? w[(i64)r * ldw + c + k] : 0;
            raw[i] = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16,
                                h[6] | h[7] << 16);
        }
    }
    u32 m2 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m2 = fp8_max2(m2, fp8_abs_max4(raw[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m2 = fp8_max2(m2, __shfl_xor_sync(0xffffffffu, m2, o));
    if ((t & 31) == 0) red[t >> 5] = m2;
    __syncthreads();
    m2 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m2 = fp8_max2(m2, red[i]);
    const u32 m = fp8_wider(m2);
    const Fp8Scale s = fp8_scale(m);
    if (t == 0) {
        scales_fwd[(i64)ob * ld_fwd + ib] = s.scale;
        scales_bwd[(i64)ib * ld_bwd + ob] = s.scale;
        // The last tile of each scale row writes the row's padding (zeros: nothing undefined
        // reaches cuBLASLt), so the scales need no fill of their own.
        if (ib == nib - 1)
            for (int k = ib + 1; k < ld_fwd; ++k) scales_fwd[(i64)ob * ld_fwd + k] = 0.0f;
        if (ob == nob - 1)
            for (int k = ob + 1; k < ld_bwd; ++k) scales_bwd[(i64)ib * ld_bwd + k] = 0.0f;
    }
    if (c >= cols || rb >= rows) return;
    const bool bad = m >= FP8_NON_FINITE;
    if (codes != nullptr)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (rb + i >= rows) break;
            float v[8];
            fp8_unpack8(raw[i], v);
            const uint2 q = bad ? make_uint2(0, 0) : fp8_pack8(v, s.mult);
            fp8_store8(codes + (i64)(rb + i) * cols + c, q, cols - c, (cols & 7) == 0);
        }
    if (codes_t != nullptr)
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            if (c + k >= cols) break;
            float v[8];
            fp8_column8(raw, k, v);
            const uint2 q = bad ? make_uint2(0, 0) : fp8_pack8(v, s.mult);
            fp8_store8(codes_t + (i64)(c + k) * rows + rb, q, rows - rb, (rows & 7) == 0);
        }
}

// One to four weights of the same IN (a packed projection's: q|k|v, gate|up), each as
// fp8_weight_tile takes it, in one launch: k and v of a Llama block are 16 to 64 tiles each,
// too few CTAs to fill the GPU alone (a launch a weight reached 0.44 TB/s on q|k|v, 2 TB/s on
// gate|up). Passed by value; its layout is the Rust launcher's (fp8_linear/cuda/weights.rs,
// TileBatch), which asserts the same size.
#define FP8_TILE_BATCH 4
struct Fp8TileBatch {
    const bf16* w[FP8_TILE_BATCH];
    u8* codes[FP8_TILE_BATCH];
    u8* codes_t[FP8_TILE_BATCH];
    float* scales_fwd[FP8_TILE_BATCH];
    float* scales_bwd[FP8_TILE_BATCH];
    i64 ldw[FP8_TILE_BATCH];
    int cols[FP8_TILE_BATCH];
    int ld_bwd[FP8_TILE_BATCH];
    int first_ob[FP8_TILE_BATCH];  // the launch's first column of tiles that is weight j's
    int count;
    int pad;
};
static_assert(sizeof(Fp8TileBatch) == 248, "Fp8TileBatch: the Rust launcher's TileBatch layout");

// Grid (the weights' column tiles together, ceil(IN / 128)): CTA x belongs to the last weight
// whose first_ob is at most x.
extern "C" __global__ void __launch_bounds__(256)
fp8_quantize_tiles(const Fp8TileBatch b, int rows, int ld_fwd) {
    int j = 0;
#pragma unroll
    for (int k = 1; k < FP8_TILE_BATCH; ++k)
        if (k < b.count && b.first_ob[k] <= (int)blockIdx.x) j = k;
    const int nob = (b.cols[j] + 127) / 128;
    fp8_weight_tile(b.w[j], b.ldw[j], b.codes[j], b.codes_t[j], b.scales_fwd[j],
                    b.scales_bwd[j], rows, b.cols[j], ld_fwd, b.ld_bwd[j], blockIdx.y,
                    blockIdx.x - b.first_ob[j], gridDim.y, nob);
}

// FP8 qwZ's gathered weight as the forward's operand: its codes (rows = IN, cols = OUT) row
// stride cols and tile scales [ceil(rows / 128)][ceil(cols / 128)] (dense, as the codec lays
// them out) -> codes_t (OUT, IN) row stride IN and scales_t[ob * ld_t + ib] (w^T's BLK128x128
// layout, ld_t = round_up(ceil(IN / 128), 4), the padding zero): the bytes fp8_quantize_tiles
// writes for the dense weight, moved, not recomputed. Grid (ceil(OUT / 128), ceil(IN / 128)),
// 256 threads a tile: loaded in 16-byte pieces where codes and cols allow (else byte by byte),
// through shared memory, and stored as fp8_quantize_tiles stores w^T's codes. Bound by memory
// bandwidth: 1 byte read and 1 written an element. It replaces a strided byte copy (candle's
// transpose) and three small copies of the scales for each GEMM of a gathered weight.
extern "C" __global__ void __launch_bounds__(256)
fp8_transpose_tiles(const u8* __restrict__ codes, const float* __restrict__ scales,
                    u8* __restrict__ codes_t, float* __restrict__ scales_t, int rows, int cols,
                    int ld_t) {
    __shared__ __align__(16) u8 q[128][144];
    const int t = threadIdx.x;
    const int ib = blockIdx.y, ob = blockIdx.x;
    const int r0 = ib * 128, c0 = ob * 128;
    const bool vec = (cols & 15) == 0 && ((u64)codes & 15) == 0;
    // Piece k is row k / 8's bytes (k % 8) * 16 to + 15 (zeros outside the matrix).
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int k = t + 256 * j, rr = k >> 3, cc = (k & 7) * 16, r = r0 + rr;
        uint4 p = make_uint4(0, 0, 0, 0);
        if (r < rows && c0 + cc < cols) {
            const u8* in = codes + (i64)r * cols + c0 + cc;
            if (vec) {
                p = *reinterpret_cast<const uint4*>(in);
            } else {
                u32 w[4] = {0, 0, 0, 0};
                for (int b = 0; b < 16 && c0 + cc + b < cols; ++b) w[b / 4] |= (u32)in[b] << (8 * (b % 4));
                p = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
        *reinterpret_cast<uint4*>(&q[rr][cc]) = p;
    }
    if (t == 0) {
        scales_t[(i64)ob * ld_t + ib] = scales[(i64)ib * gridDim.x + ob];
        if (ib == (int)gridDim.y - 1)
            for (int k = ib + 1; k < ld_t; ++k) scales_t[(i64)ob * ld_t + k] = 0.0f;
    }
    __syncthreads();
    fp8_store_tile_t(q, codes_t, r0, c0, rows, cols);
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
