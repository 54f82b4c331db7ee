// attention.cu: causal flash attention (FlashAttention-2 scheme) on bf16 tensor cores, forward and
// backward, reading q/k/v where the QKV GEMM wrote them and writing heads merged (no permutes).
//
// Size letters: B batch, T sequence, NH heads, HS head size, C = NH*HS. Layouts (bf16 unless said):
//   qkv (B, T, 3C): q[b,t,h,d] = qkv[b,t,h*HS+d], k at +C, v at +2C (row stride 3C)
//   y   (B, T, C):  y[b,t,h*HS+d]        lse (B, NH, T) f32: ln sum_s exp(scale * q.k_s)
//   dy  (B, T, C) -> dqkv (B, T, 3C) in qkv's layout.
// Scale = 1/sqrt(HS); causal: key s <= query t. Arithmetic: bf16 operands, f32 accumulation,
// softmax in f32 with exp2 (scores pre-multiplied by scale*log2(e)).
//
// Defines (from the launcher; defaults let the file compile alone):
//   HS    head size, 16, 32, 64 or 128 (one module per head size)
//   BLOCK query rows = key rows of a tile, 64 (or 128); BLOCK/16 warps a CTA, 16 rows a warp.
//   BKEYS keys a backward CTA, BLOCK or 2*BLOCK (BKEYS/16 warps; 2*BLOCK needs HS >= 32).
//   BWD_EARLY_P backward order, 0 or 1 (see the kernel).
//
// Kernels and launch shapes:
//   attention_forward_kernel   grid (B*NH, ceil(T/BLOCK)), block 2*BLOCK threads,
//       dynamic smem 5 tiles of BLOCK x (HS+8) bf16 (Q, 2x K, 2x V) = 46 KiB at HS=64.
//       One CTA = one query block of one head; loops over key blocks from the diagonal (the only
//       masked tile) down to 0, K/V double-buffered with cp.async. The heaviest query blocks
//       (last ones) are launched first (blockIdx.y reversed).
//   attention_backward_preprocess  grid ceil(B*T*C/8 / 256), block 256: D[b,h,t] = sum_d dy*y,
//       and zeroes the f32 dq accumulator (B, T, C).
//   attention_backward_kernel  grid (B*NH, ceil(T/BKEYS)), block 2*BKEYS threads,
//       dynamic smem K, V (BKEYS rows), 2x Q, 2x dO (BLOCK rows), dS^T (BKEYS x BLOCK+8 bf16),
//       lse/D: 91 KiB at HS=64, BKEYS=128 (one CTA of 8 warps a SM at 244 registers).
//       One CTA = one key block of one head; each warp owns 16 keys (its dK, dV rows in
//       registers) and loops over BLOCK-row query blocks from the diagonal to the end, Q/dO/lse/D
//       double-buffered (cp.async of block qb+1 issued before block qb's math). Warps whose keys
//       all lie after a query block skip its mma. dQ += dS K (warps split over the query rows
//       and HS columns) goes to the f32 accumulator with red.global.add.v4.f32 (lane pairs
//       swap halves so each lane holds 4 adjacent columns), so dq's summation order over key
//       blocks is NOT deterministic (dk, dv are). The launcher picks (BKEYS, BWD_EARLY_P) by
//       HS: 16 (64, 0), 32 (64, 0), 64 (128, 0), 128 (128, 1).
//   attention_backward_dq      grid ceil(B*T*C/8 / 256), block 256: dqkv[:, :, :C] = bf16(acc).
//
// Bound: tensor-core FLOPs (causal: forward 2*B*NH*T*T*HS, backward 2.5x that); K/V (Q/dO) tiles
// come from L2 once per CTA. The FA2 references on the H200 at (B, NH, T, HS) = (16, 16, 1024, 64):
// ~194 TFLOP/s forward, ~141 backward (cuDNN 228).
// Measured on the H200 at that shape (attention_timing_h200_shape in tests/gpu/attention.rs:
// `gpu-tests --test-threads=1 --nocapture attention`, whole backward = pre-pass + main + dq
// conversion, mean of 20): forward 170-177 us = 194-202 TFLOP/s; backward 592-612 us =
// 140-145 TFLOP/s (BKEYS 128, BWD_EARLY_P 0), of which the pre-pass and the dq conversion
// alone take 91.5 us (the next lever: fuse them). Before: 859 us = 100 TFLOP/s (BKEYS 64,
// scalar f32 atomics for dQ); BKEYS 64 with the vector reductions: 672-690 us. Other HS at C 1024:
// HS 32 713-732 us at BKEYS 64 or 128; HS 128 559 us (BKEYS 128, BWD_EARLY_P 1) against 829 us at
// BKEYS 64 (spills). BWD_EARLY_P 1 costs ~2% at HS 64 (615 us) though it frees 16 registers.
// A second dS^T buffer to save one barrier a query block measured no gain (not kept).
//
// Registers (nvcc -arch=sm_90 -Xptxas -v, spill bytes in brackets): forward (BLOCK 64)
// 96/116/166/239 at HS 16/32/64/128; backward at the launcher's picks 148/200/244/255 (0/0/0/0),
// at BKEYS 64: 148/200/250/255 (0/0/0/44).
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 fragments (PTX ISA, "Matrix Fragments for
// mma.m16n8k16"), g = lane>>2, c = lane&3, each register two bf16 (lower column in the low half):
//   A 16x16 row-major: a0 (g, 2c..2c+1)  a1 (g+8, 2c..)  a2 (g, 2c+8..)  a3 (g+8, 2c+8..)
//   B 16x8 (k x n):    b0 (k=2c..2c+1, n=g)  b1 (k=2c+8.., n=g)
//   C 16x8 f32:        c0,c1 (g, 2c..2c+1)   c2,c3 (g+8, 2c..2c+1)
// ldmatrix.x4 loads four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i and
// register i of lane L holds matrix i's (row L>>2, cols 2(L&3)..+1) (with .trans: its transpose),
// which is exactly one register of the fragments above. The frag_* helpers below pick the rows.
#include "common.cuh"
static_assert(PRECISION == PRECISION_BF16, "attention.cu: bf16 only: its MMA is m16n8k16 on bf16, its tiles bf16x2 words");
#ifndef HS
#define HS 64
#endif
#ifndef BLOCK
#define BLOCK 64
#endif
// Keys a backward CTA (BKEYS/16 warps, 16 keys a warp); its query tiles have BLOCK rows.
#ifndef BKEYS
#define BKEYS BLOCK
#endif
// Backward order: 1 = dV += P^T dO right after P^T, which then stays as bf16 fragments (dS^T
// uses the bf16 P^T); 0 = S^T and dP^T both in f32 registers, then dV and dK together.
#ifndef BWD_EARLY_P
#define BWD_EARLY_P 0
#endif

static_assert(HS == 16 || HS == 32 || HS == 64 || HS == 128, "HS must be 16, 32, 64 or 128");
static_assert(BLOCK == 64 || BLOCK == 128, "BLOCK must be 64 or 128");
static_assert(BKEYS == BLOCK || BKEYS == 2 * BLOCK, "BKEYS must be BLOCK or 2 BLOCK");

#define NWARPS (BLOCK / 16)
// CTAs a SM the register allocation aims for (__launch_bounds__ minimum). BLOCK 64: forward 3
// (<= 170 registers; its 46 KiB of tiles fit 3 times) or 2 at HS 128, backward 2 (<= 255) or 1 at
// HS 128. BLOCK 128 (8 warps, 255 registers): meant for the forward; the backward spills there.
#define FWD_MIN_CTAS (BLOCK == 64 ? (HS <= 64 ? 3 : 2) : 1)
#define BWD_MIN_CTAS (BKEYS == 64 && HS <= 64 ? 2 : 1)
#define NTHREADS (NWARPS * 32)
#define BWD_WARPS (BKEYS / 16)
#define BWD_THREADS (BWD_WARPS * 32)
// Padded shared row: HS + 8 bf16, so the 8 rows one ldmatrix phase reads sit in 8 distinct
// 16-byte bank groups (row stride = 16 bytes mod 128 for every HS here): no bank conflicts.
#define SROW (HS + 8)
#define TILE_BYTES (BLOCK * SROW * 2)
#define KTILE_BYTES (BKEYS * SROW * 2)
// dS^T tile (keys x queries) in the backward, padded the same way.
#define SDS (BLOCK + 8)
#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000)

// ---------------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------------

// Shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared, asynchronous; zero-filled when !valid (src must still be a valid
// address: the callers clamp it).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a * b for one 16x8x16 tile (layouts in the header).
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------------------------------------
// Fragment loads from a padded shared tile (base address `s`, row stride SROW or SDS elements).
// ---------------------------------------------------------------------------------------------

// A fragment of the 16x16 block at (m0, k0) of a tile stored [m][k] (k contiguous).
// Matrices: 0 = rows m0..+7 cols k0..+7 (a0), 1 = rows +8 (a1), 2 = cols +8 (a2), 3 = both (a3):
// lane L addresses row m0 + (L & 15), col k0 + (L >> 4) * 8.
__device__ __forceinline__ void frag_a(u32 (&r)[4], u32 s, int stride, int m0, int k0, int lane) {
    ldmatrix_x4(r, s + ((m0 + (lane & 15)) * stride + k0 + (lane >> 4) * 8) * 2);
}

// A fragment of the 16x16 block (m0, k0) of A when the tile stores A^T, i.e. [k][m] (m
// contiguous): .trans. Matrix 0 = tile rows k0..+7 cols m0..+7 (a0: (m=g, k=2c)), 1 = cols m0+8
// (a1: m+8), 2 = rows k0+8 (a2: k+8), 3 = both (a3): lane L addresses row
// k0 + ((L >> 4) << 3) + (L & 7), col m0 + ((L >> 3) & 1) * 8.
__device__ __forceinline__ void frag_a_trans(u32 (&r)[4], u32 s, int stride, int m0, int k0,
                                             int lane) {
    ldmatrix_x4_trans(
        r, s + ((k0 + ((lane >> 4) << 3) + (lane & 7)) * stride + m0 + ((lane >> 3) & 1) * 8) * 2);
}

// B fragments of the two 8-column n-tiles n0..n0+7 and n0+8..n0+15 at k-step k0, from a tile
// stored [n][k] (k contiguous, e.g. K for S = Q K^T): r[0], r[1] = b0, b1 of n-tile 0 and
// r[2], r[3] = b0, b1 of n-tile 1. Matrix 0 = rows n0..+7 cols k0..+7, 1 = cols k0+8,
// 2 = rows n0+8, 3 = both: lane L addresses row n0 + ((L >> 4) << 3) + (L & 7),
// col k0 + ((L >> 3) & 1) * 8.
__device__ __forceinline__ void frag_b_nk(u32 (&r)[4], u32 s, int stride, int n0, int k0,
                                          int lane) {
    ldmatrix_x4(
        r, s + ((n0 + ((lane >> 4) << 3) + (lane & 7)) * stride + k0 + ((lane >> 3) & 1) * 8) * 2);
}

// The same two n-tiles from a tile stored [k][n] (n contiguous, e.g. V for O = P V): .trans.
// Matrix 0 = rows k0..+7 cols n0..+7 (b0 of n-tile 0), 1 = rows k0+8 (b1), 2 = cols n0+8
// (b0 of n-tile 1), 3 = both (b1): lane L addresses row k0 + (L & 15), col n0 + (L >> 4) * 8.
__device__ __forceinline__ void frag_b_kn(u32 (&r)[4], u32 s, int stride, int k0, int n0,
                                          int lane) {
    ldmatrix_x4_trans(r, s + ((k0 + (lane & 15)) * stride + n0 + (lane >> 4) * 8) * 2);
}

// An f32 accumulator pair of n-tiles (2j, 2j+1) covering 16 columns, re-packed to bf16: the A
// fragment of those 16 columns as the k dimension (the FA2 register trick: c0,c1 of tile 2j =
// (g, 2c..) = a0; c2,c3 = (g+8, 2c..) = a1; tile 2j+1 gives the k+8 half, a2 and a3).
__device__ __forceinline__ void acc_to_a(u32 (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack_bf16x2(lo[0], lo[1]);
    a[1] = pack_bf16x2(lo[2], lo[3]);
    a[2] = pack_bf16x2(hi[0], hi[1]);
    a[3] = pack_bf16x2(hi[2], hi[3]);
}

// Rows row0..row0+BLOCK-1 of one head's HS columns, element (r, d) at g[r * ld + d], into a
// padded tile at s; rows >= nrows are zero-filled (so masked scores times them stay finite).
// (ROWS rows, THREADS threads loading.)
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_rows(u32 s, const act_t* g, long long ld, int row0, int nrows,
                                          int tid) {
    constexpr int CPR = HS / 8;  // 16-byte chunks a row
#pragma unroll
    for (int it = 0; it < (ROWS * CPR + THREADS - 1) / THREADS; ++it) {
        const int i = it * THREADS + tid;
        if ((ROWS * CPR) % THREADS != 0 && i >= ROWS * CPR) break;
        const int r = i / CPR, ch = i % CPR;
        const bool ok = row0 + r < nrows;
        const act_t* src = g + (long long)(ok ? row0 + r : 0) * ld + ch * 8;
        cp_async16(s + (r * SROW + ch * 8) * 2, src, ok);
    }
}
__device__ __forceinline__ void load_tile(u32 s, const act_t* g, long long ld, int row0, int nrows,
                                          int tid) {
    load_rows<BLOCK, NTHREADS>(s, g, ld, row0, nrows, tid);
}

// dst[0..3] += v (f32, 16-byte aligned), one vector reduction (sm_90).
__device__ __forceinline__ void red_add_v4(float* dst, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b),
                 "f"(c), "f"(d)
                 : "memory");
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

// y (B, T, C), lse (B, NH, T) <- qkv (B, T, 3C). scale_log2 = log2(e)/sqrt(HS), scale = 1/sqrt(HS).
extern "C" __global__ void __launch_bounds__(NTHREADS, FWD_MIN_CTAS)
    attention_forward_kernel(act_t* __restrict__ y, float* __restrict__ lse,
                             const act_t* __restrict__ qkv, int T, int NH, float scale_log2,
                             float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int C = NH * HS;
    const long long ld = 3LL * C;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int qb = gridDim.y - 1 - blockIdx.y;  // heaviest (last) query blocks first
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;

    const act_t* qg = qkv + (long long)b * T * ld + h * HS;
    const act_t* kg = qg + C;
    const act_t* vg = qg + 2 * C;
    const u32 sQ = smem_u32(smem);
    // K of buffer i at sQ + (1 + 2i) tiles, V at sQ + (2 + 2i) tiles.
    auto sK = [&](int i) { return sQ + (u32)TILE_BYTES * (1 + 2 * i); };
    auto sV = [&](int i) { return sQ + (u32)TILE_BYTES * (2 + 2 * i); };

    load_tile(sQ, qg, ld, qb * BLOCK, T, tid);
    load_tile(sK(0), kg, ld, qb * BLOCK, T, tid);
    load_tile(sV(0), vg, ld, qb * BLOCK, T, tid);
    cp_async_commit();

    // This thread's rows: query t_lo (c0, c1 of every tile) and t_lo + 8 (c2, c3).
    const int t_lo = qb * BLOCK + warp * 16 + g;
    float o[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF};  // running row max of the raw scores q.k
    float l[2] = {0.f, 0.f};          // this thread's part of the row sum of exp2
    u32 qf[HS / 16][4];               // the warp's 16 query rows as A fragments

    for (int kb = qb, it = 0; kb >= 0; --kb, ++it) {
        const int buf = it & 1;
        cp_async_wait_all();
        __syncthreads();  // tile kb landed; every warp is done with buffer buf^1 (tile kb+1)
        if (kb > 0) {
            load_tile(sK(buf ^ 1), kg, ld, (kb - 1) * BLOCK, T, tid);
            load_tile(sV(buf ^ 1), vg, ld, (kb - 1) * BLOCK, T, tid);
            cp_async_commit();
        }
        if (kb == qb) {
#pragma unroll
            for (int kk = 0; kk < HS / 16; ++kk) frag_a(qf[kk], sQ, SROW, warp * 16, kk * 16, lane);
        }

        // S = Q K^T: 16 x BLOCK per warp.
        float s[BLOCK / 8][4];
#pragma unroll
        for (int i = 0; i < BLOCK / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < BLOCK / 16; ++np) {
                u32 kf[4];
                frag_b_nk(kf, sK(buf), SROW, np * 16, kk * 16, lane);
                mma16816(s[2 * np], qf[kk], kf[0], kf[1]);
                mma16816(s[2 * np + 1], qf[kk], kf[2], kf[3]);
            }
        }
        // Causal mask, diagonal tile only (it also masks keys >= T for every query < T).
        if (kb == qb) {
#pragma unroll
            for (int nt = 0; nt < BLOCK / 8; ++nt)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int key = kb * BLOCK + nt * 8 + 2 * c + (j & 1);
                    if (key > t_lo + (j >> 1) * 8) s[nt][j] = NEG_INF;
                }
        }

        // Online softmax. Every row has an unmasked key in the diagonal tile (processed first),
        // so the max is finite from the first tile on.
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < BLOCK / 8; ++nt) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
        }
        float corr[2], msc[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            corr[r] = ex2((m[r] - mx[r]) * scale_log2);  // 0 on the first tile (m = -inf)
            m[r] = mx[r];
            msc[r] = mx[r] * scale_log2;
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < BLOCK / 8; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float p = ex2(fmaf(s[nt][j], scale_log2, -msc[j >> 1]));  // masked: 0
                s[nt][j] = p;
                rs[j >> 1] += p;
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + rs[r];
#pragma unroll
        for (int dt = 0; dt < HS / 8; ++dt) {
            o[dt][0] *= corr[0];
            o[dt][1] *= corr[0];
            o[dt][2] *= corr[1];
            o[dt][3] *= corr[1];
        }

        // O += P V: P from the S registers (k = key), V fragments with .trans.
#pragma unroll
        for (int j = 0; j < BLOCK / 16; ++j) {
            u32 pa[4];
            acc_to_a(pa, s[2 * j], s[2 * j + 1]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; ++dp) {
                u32 vf[4];
                frag_b_kn(vf, sV(buf), SROW, j * 16, dp * 16, lane);
                mma16816(o[2 * dp], pa, vf[0], vf[1]);
                mma16816(o[2 * dp + 1], pa, vf[2], vf[3]);
            }
        }
    }

    // Normalise and write y (heads merged) and lse.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int t = t_lo + 8 * r;
        if (t < T) {
            const float inv = 1.f / l[r];
            u32* yr = (u32*)(y + ((long long)b * T + t) * C + h * HS + 2 * c);
#pragma unroll
            for (int dt = 0; dt < HS / 8; ++dt)
                yr[dt * 4] = pack_bf16x2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
            if (c == 0) lse[(long long)bh * T + t] = m[r] * scale + logf(l[r]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

// A 16-byte chunk of 8 bf16 / 4 f32.
struct alignas(16) V4 {
    u32 x, y, z, w;
};

// D[b,h,t] = sum_d dy[b,t,h*HS+d] * y[b,t,h*HS+d] (f32 (B, NH, T)); dq_acc (B, T, C) f32 = 0.
// One thread per 8 columns of a row; the HS/8 threads of a head (adjacent lanes, HS/8 divides
// 32) reduce with shuffles.
extern "C" __global__ void attention_backward_preprocess(float* __restrict__ dsum,
                                                         float* __restrict__ dq_acc,
                                                         const act_t* __restrict__ dy,
                                                         const act_t* __restrict__ y, int BT,
                                                         int T, int NH) {
    constexpr int GROUP = HS / 8;
    const int C = NH * HS, cpr = C / 8;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool ok = i < (long long)BT * cpr;
    const long long row = ok ? i / cpr : 0;
    const int ch = ok ? (int)(i % cpr) : 0;
    float s = 0.f;
    if (ok) {
        const V4 a = *(const V4*)(dy + row * C + ch * 8);
        const V4 e = *(const V4*)(y + row * C + ch * 8);
        const u32 aw[4] = {a.x, a.y, a.z, a.w}, ew[4] = {e.x, e.y, e.z, e.w};
#pragma unroll
        for (int k = 0; k < 4; ++k)
            s += bf16x2_lo(aw[k]) * bf16x2_lo(ew[k]) + bf16x2_hi(aw[k]) * bf16x2_hi(ew[k]);
        V4* z = (V4*)(dq_acc + row * C + ch * 8);
        z[0] = V4{0u, 0u, 0u, 0u};
        z[1] = V4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int o = GROUP / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (ok && ch % GROUP == 0) {
        const long long b = row / T, t = row % T;
        dsum[(b * NH + ch / GROUP) * T + t] = s;
    }
}

// dqkv (B, T, 3C): k and v columns <- dK, dV; dq_acc (B, T, C) f32 += dQ / scale.
// Reads qkv (B, T, 3C), dy (B, T, C), lse and dsum (B, NH, T).
extern "C" __global__ void __launch_bounds__(BWD_THREADS, BWD_MIN_CTAS)
    attention_backward_kernel(act_t* __restrict__ dqkv, float* __restrict__ dq_acc,
                              const act_t* __restrict__ qkv, const act_t* __restrict__ dy,
                              const float* __restrict__ lse, const float* __restrict__ dsum,
                              int T, int NH, float scale_log2, float scale) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int C = NH * HS;
    const long long ld = 3LL * C;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int kb = blockIdx.y;  // key block; the first ones have the most query blocks
    const int nqb = (T + BLOCK - 1) / BLOCK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;

    const act_t* qg = qkv + (long long)b * T * ld + h * HS;
    const act_t* kg = qg + C;
    const act_t* vg = qg + 2 * C;
    const act_t* dog = dy + (long long)b * T * C + h * HS;
    const float* lseg = lse + (long long)bh * T;
    const float* dsg = dsum + (long long)bh * T;

    // Shared: K, V, Q[2], dO[2] tiles, then dS^T (BKEYS x SDS bf16), then lse[2], D[2] (f32).
    // K and V have BKEYS rows, Q and dO BLOCK.
    const u32 sK = smem_u32(smem);
    const u32 sV = sK + KTILE_BYTES;
    auto sQ = [&](int i) { return sK + 2u * KTILE_BYTES + (u32)TILE_BYTES * i; };
    auto sdO = [&](int i) { return sK + 2u * KTILE_BYTES + (u32)TILE_BYTES * (2 + i); };
    constexpr int DS_OFF = 2 * KTILE_BYTES + 4 * TILE_BYTES;
    const u32 sdS = sK + DS_OFF;
    u32* dsw = (u32*)(smem + DS_OFF);
    float* sL = (float*)(smem + DS_OFF + BKEYS * SDS * 2);  // [2][BLOCK]
    float* sD = sL + 2 * BLOCK;                             // [2][BLOCK]

    // Query block qbl's Q, dO, lse, D into buffer i (threads 0..BLOCK-1 lse, the rest D).
    auto load_qblock = [&](int i, int qbl) {
        load_rows<BLOCK, BWD_THREADS>(sQ(i), qg, ld, qbl * BLOCK, T, tid);
        load_rows<BLOCK, BWD_THREADS>(sdO(i), dog, C, qbl * BLOCK, T, tid);
        if (tid < 2 * BLOCK) {
            const int r = tid % BLOCK, t = qbl * BLOCK + r;
            const bool ok = t < T;
            const float* src = (tid < BLOCK ? lseg : dsg) + (ok ? t : 0);
            float* dst = (tid < BLOCK ? sL : sD) + i * BLOCK + r;
            cp_async4(smem_u32(dst), src, ok);
        }
    };

    const int qb0 = kb * (BKEYS / BLOCK);  // first query block with a query >= a key of ours
    load_rows<BKEYS, BWD_THREADS>(sK, kg, ld, kb * BKEYS, T, tid);
    load_rows<BKEYS, BWD_THREADS>(sV, vg, ld, kb * BKEYS, T, tid);
    load_qblock(0, qb0);
    cp_async_commit();

    // This thread's keys: s_lo (c0, c1 of every tile) and s_lo + 8 (c2, c3).
    const int s_lo = kb * BKEYS + warp * 16 + g;
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) dk[i][j] = dv[i][j] = 0.f;

    // dQ of query block qbl += dS K over the CTA's BKEYS keys, dS^T from the shared buffer sdSb:
    // warp w takes queries (w % RG)*16..+15 of the block and HSW of the HS columns (BKEYS/BLOCK
    // warps a row group), in column chunks of at most 64 to bound registers. f32 vector
    // reductions into dq_acc: lane pairs (c, c^1) swap halves so that each lane holds 4
    // adjacent columns of one row (even c: row g, odd c: row g+8).
    auto dq_block = [&](int qbl, u32 sdSb) {
        constexpr int RG = BLOCK / 16, HSW = HS * RG / BWD_WARPS;
        constexpr int DQC = HSW < 64 ? HSW : 64;
        static_assert(HSW >= 16, "dQ column slices of at least 16");
        const int rg = warp % RG, col0 = (warp / RG) * HSW;
        const int odd = c & 1;
        const int t_dq = qbl * BLOCK + rg * 16 + g + 8 * odd;
#pragma unroll
        for (int dc = 0; dc < HSW / DQC; ++dc) {
            float dq[DQC / 8][4];
#pragma unroll
            for (int i = 0; i < DQC / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < BKEYS / 16; ++ks) {
                u32 a[4];
                frag_a_trans(a, sdSb, SDS, rg * 16, ks * 16, lane);
#pragma unroll
                for (int dp = 0; dp < DQC / 16; ++dp) {
                    u32 f[4];
                    frag_b_kn(f, sK, SROW, ks * 16, col0 + dc * DQC + dp * 16, lane);
                    mma16816(dq[2 * dp], a, f[0], f[1]);
                    mma16816(dq[2 * dp + 1], a, f[2], f[3]);
                }
            }
            float* dst = dq_acc + ((long long)b * T + t_dq) * C + h * HS + col0 + dc * DQC +
                         2 * (c & ~1);
#pragma unroll
            for (int dt = 0; dt < DQC / 8; ++dt) {
                // even c sends its row g+8 pair, odd c its row g pair.
                const float s0 = odd ? dq[dt][0] : dq[dt][2];
                const float s1 = odd ? dq[dt][1] : dq[dt][3];
                const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
                const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
                if (t_dq < T) {
                    if (odd)
                        red_add_v4(dst + dt * 8, r0, r1, dq[dt][2], dq[dt][3]);
                    else
                        red_add_v4(dst + dt * 8, dq[dt][0], dq[dt][1], r0, r1);
                }
            }
        }
    };

    for (int qb = qb0, it = 0; qb < nqb; ++qb, ++it) {
        const int buf = it & 1;
        cp_async_wait_all();
        __syncthreads();  // block qb landed; every warp is done with buffer buf^1 and with dS^T
        if (qb + 1 < nqb) {
            load_qblock(buf ^ 1, qb + 1);
            cp_async_commit();
        }
        const u32 sQb = sQ(buf), sdOb = sdO(buf);
        const float* sLb = sL + buf * BLOCK;
        const float* sDb = sD + buf * BLOCK;
        // With 2 query blocks a key block, the upper warps see only queries before their keys in
        // the first one (all masked): they skip the mma (warp-uniform) and write dS^T = 0 for dQ.
        const bool live = qb * BLOCK + BLOCK > kb * BKEYS + warp * 16;
        // P^T = 0 where query < key or query >= T: needed on the diagonal and last blocks.
        const bool mask = qb * BLOCK < (kb + 1) * BKEYS || (qb + 1) * BLOCK > T;
        const int r0 = warp * 16 + g;  // this thread's dS^T rows in the block: r0, r0 + 8

        // S^T = K Q^T: 16 keys (this warp's) x BLOCK queries.
        float st[BLOCK / 8][4];
#pragma unroll
        for (int i = 0; i < BLOCK / 8; ++i) st[i][0] = st[i][1] = st[i][2] = st[i][3] = 0.f;
        if (live) {
#pragma unroll
            for (int kk = 0; kk < HS / 16; ++kk) {
                u32 ka[4];
                frag_a(ka, sK, SROW, warp * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < BLOCK / 16; ++np) {
                    u32 qf[4];
                    frag_b_nk(qf, sQb, SROW, np * 16, kk * 16, lane);
                    mma16816(st[2 * np], ka, qf[0], qf[1]);
                    mma16816(st[2 * np + 1], ka, qf[2], qf[3]);
                }
            }
        }
        // P^T = exp(scale * S^T - lse) (the forward's softmax), masked.
#pragma unroll
        for (int nt = 0; nt < BLOCK / 8; ++nt)
#pragma unroll
            for (int jc = 0; jc < 2; ++jc) {
                const int qc = nt * 8 + 2 * c + jc;  // query column within the block
                const int t = qb * BLOCK + qc;
                const float nl = -sLb[qc] * LOG2E;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int j = 2 * r + jc;
                    float p = ex2(fmaf(st[nt][j], scale_log2, nl));
                    if (mask && (t < s_lo + 8 * r || t >= T)) p = 0.f;
                    st[nt][j] = p;
                }
            }
#if BWD_EARLY_P
        // P^T to bf16 A fragments (k = query), dV += P^T dO now, so that the f32 P^T is dead
        // before dP^T is live; dS^T below uses the bf16 P^T.
        u32 pa[BLOCK / 16][4];
#pragma unroll
        for (int j = 0; j < BLOCK / 16; ++j) acc_to_a(pa[j], st[2 * j], st[2 * j + 1]);
        if (live) {
#pragma unroll
            for (int j = 0; j < BLOCK / 16; ++j)
#pragma unroll
                for (int dp = 0; dp < HS / 16; ++dp) {
                    u32 f[4];
                    frag_b_kn(f, sdOb, SROW, j * 16, dp * 16, lane);
                    mma16816(dv[2 * dp], pa[j], f[0], f[1]);
                    mma16816(dv[2 * dp + 1], pa[j], f[2], f[3]);
                }
        }
#endif
        // dP^T = V dO^T.
        float dpt[BLOCK / 8][4];
#pragma unroll
        for (int i = 0; i < BLOCK / 8; ++i) dpt[i][0] = dpt[i][1] = dpt[i][2] = dpt[i][3] = 0.f;
        if (live) {
#pragma unroll
            for (int kk = 0; kk < HS / 16; ++kk) {
                u32 va[4];
                frag_a(va, sV, SROW, warp * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < BLOCK / 16; ++np) {
                    u32 df[4];
                    frag_b_nk(df, sdOb, SROW, np * 16, kk * 16, lane);
                    mma16816(dpt[2 * np], va, df[0], df[1]);
                    mma16816(dpt[2 * np + 1], va, df[2], df[3]);
                }
            }
        }
        // dS^T = P^T * (dP^T - D).
#pragma unroll
        for (int nt = 0; nt < BLOCK / 8; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float dd = sDb[nt * 8 + 2 * c + (j & 1)];
#if BWD_EARLY_P
                // st[nt][j] is half (j & 1) of pa[nt / 2][(nt & 1) * 2 + (j >> 1)].
                const u32 w = pa[nt >> 1][(nt & 1) * 2 + (j >> 1)];
                const float p = (j & 1) ? bf16x2_hi(w) : bf16x2_lo(w);
#else
                const float p = st[nt][j];
#endif
                dpt[nt][j] = p * (dpt[nt][j] - dd);
            }

        // dK += dS^T Q (and dV += P^T dO unless done above): k = query, the accumulator
        // registers are the A fragments; dS^T also goes to shared (bf16, as the mma uses it).
#pragma unroll
        for (int j = 0; j < BLOCK / 16; ++j) {
            u32 da[4];
            acc_to_a(da, dpt[2 * j], dpt[2 * j + 1]);
            // (key row, query col) of da[i]: (g, 2c), (g+8, 2c), (g, 2c+8), (g+8, 2c+8).
            const int c0 = j * 16 + 2 * c;
            dsw[(r0 * SDS + c0) / 2] = da[0];
            dsw[((r0 + 8) * SDS + c0) / 2] = da[1];
            dsw[(r0 * SDS + c0 + 8) / 2] = da[2];
            dsw[((r0 + 8) * SDS + c0 + 8) / 2] = da[3];
            if (!live) continue;
#if !BWD_EARLY_P
            u32 pa[4];
            acc_to_a(pa, st[2 * j], st[2 * j + 1]);
#endif
#pragma unroll
            for (int dp = 0; dp < HS / 16; ++dp) {
                u32 f[4];
#if !BWD_EARLY_P
                frag_b_kn(f, sdOb, SROW, j * 16, dp * 16, lane);
                mma16816(dv[2 * dp], pa, f[0], f[1]);
                mma16816(dv[2 * dp + 1], pa, f[2], f[3]);
#endif
                frag_b_kn(f, sQb, SROW, j * 16, dp * 16, lane);
                mma16816(dk[2 * dp], da, f[0], f[1]);
                mma16816(dk[2 * dp + 1], da, f[2], f[3]);
            }
        }
        __syncthreads();  // dS^T of all warps in shared
        dq_block(qb, sdS);
    }

    // dK = scale * dS^T Q, dV = P^T dO, rows of keys < T, into dqkv's k and v columns.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int s = s_lo + 8 * r;
        if (s < T) {
            act_t* row = dqkv + ((long long)b * T + s) * ld + h * HS + 2 * c;
            u32* dkr = (u32*)(row + C);
            u32* dvr = (u32*)(row + 2 * C);
#pragma unroll
            for (int dt = 0; dt < HS / 8; ++dt) {
                dkr[dt * 4] = pack_bf16x2(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
                dvr[dt * 4] = pack_bf16x2(dv[dt][2 * r], dv[dt][2 * r + 1]);
            }
        }
    }
}

// dqkv[:, :, 0:C] = bf16(scale * dq_acc), 8 columns a thread.
extern "C" __global__ void attention_backward_dq(act_t* __restrict__ dqkv,
                                                 const float* __restrict__ dq_acc, int BT,
                                                 int NH, float scale) {
    const int C = NH * HS, cpr = C / 8;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)BT * cpr) return;
    const long long row = i / cpr;
    const int ch = (int)(i % cpr);
    const float* src = dq_acc + row * C + ch * 8;
    const V4 lo = *(const V4*)src, hi = *(const V4*)(src + 4);
    V4 out;
    out.x = pack_bf16x2(__uint_as_float(lo.x) * scale, __uint_as_float(lo.y) * scale);
    out.y = pack_bf16x2(__uint_as_float(lo.z) * scale, __uint_as_float(lo.w) * scale);
    out.z = pack_bf16x2(__uint_as_float(hi.x) * scale, __uint_as_float(hi.y) * scale);
    out.w = pack_bf16x2(__uint_as_float(hi.z) * scale, __uint_as_float(hi.w) * scale);
    *(V4*)(dqkv + row * 3 * C + ch * 8) = out;
}
