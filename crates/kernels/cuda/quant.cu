// quant.cu: the quantisers and dequantisers of crates/quant (docs/design.md section 6; launch
// shapes and the exactness argument in crates/quant/src/cuda.rs and docs/kernels.md). Compiled
// with Flavour::Exact (no FMA contraction, IEEE division, no flush-to-zero), one module per
// block size BLOCK; NT, DEQ_UNROLL, BF16_UNROLL, FULL_PIECES and FULL8_PIECES come from the
// launcher's constants (the defaults below are theirs). Bound by memory bandwidth (bytes of
// input, codes, scales and output), the fused INT4 requantisers by instruction issue.
// Measured against a device copy in the same run (`trainer bench --kernels --mib 256,1024,4096`,
// H200, 2026-11-29; docs/results.md): the quantisers and dequantisers 88-104% of the copy's
// bandwidth, dequantize_sum_requantize_int4 84-96% over 4 pieces and 85-90% over 8.
#include "common.cuh"

// Quantisation block size (elements), a multiple of 32.
#ifndef BLOCK
#define BLOCK 512
#endif

#define ABS_MASK 0x7fffffffu
#define NON_FINITE 0x7f800000u
#define F32_MAX 3.40282346638528859812e+38f
// Threads a CTA, every kernel (quant::cuda::NT).
#ifndef NT
#define NT 256
#endif

// Threads given to one quantisation block of `units` vector units: the largest power of two
// that divides `units`, at most NT and at most units / 2 (two units or more a thread).
__device__ constexpr int tpb_of(int units) {
    const int p = (units & -units) == units ? units / 2 : (units & -units);
    return p < NT ? p : NT;
}

__device__ __forceinline__ u32 umax(u32 a, u32 b) { return a > b ? a : b; }
__device__ __forceinline__ u32 absbits(float v) { return __float_as_uint(v) & ABS_MASK; }

// Max of m over the TPB threads of each group (groups are aligned runs of TPB threads of the
// CTA). Every thread of the CTA must call it (shuffles over full warps, __syncthreads).
template <int TPB>
__device__ __forceinline__ u32 group_max(u32 m, u32* red) {
#pragma unroll
    for (int o = (TPB < 32 ? TPB : 32) / 2; o > 0; o >>= 1) m = umax(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (TPB > 32) {
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
        __syncthreads();
        const int w0 = (threadIdx.x / TPB) * (TPB / 32);
        m = 0;
#pragma unroll
        for (int i = 0; i < TPB / 32; ++i) m = umax(m, red[w0 + i]);
        __syncthreads();  // every read done before red is written again (persistent kernels)
    }
    return m;
}

// block/mod.rs scale_of; a non-finite absmax gives block/mod.rs NAN_SCALE (0x7fc00000), and
// block_codes then gives codes 0: the block dequantises to NaN, as on the CPU.
__device__ __forceinline__ float scale_of(u32 m, float qmax) {
    if (m >= NON_FINITE) return __uint_as_float(0x7fc00000u);
    float s = __fdiv_rn(__uint_as_float(m), qmax);
    if (__fmul_rn(s, qmax) > F32_MAX) s = __uint_as_float(__float_as_uint(s) - 1u);
    return s;
}

// block/mod.rs code_div: round_half_away(clamp(v / s, -qmax, qmax)), exact: the codes of a block
// whose 1 / s overflows (a subnormal scale).
__device__ __forceinline__ int code_div(float v, float s, float qmax) {
    float y = __fdiv_rn(v, s);
    y = fminf(fmaxf(y, -qmax), qmax);
    float t = truncf(y);
    float f = __fsub_rn(y, t);
    return (int)t + (f >= 0.5f ? 1 : 0) - (f <= -0.5f ? 1 : 0);
}

// 1.5 * 2^23. fma(v, r, MAGIC) rounds the exact v * r + MAGIC once; for |v r| < 2^22 that sum
// lies in [2^23, 2^24), where the ulp is 1, so the result is MAGIC plus v * r rounded to an
// integer, nearest with ties to even (MAGIC is even): block/mod.rs code_mul, which keeps
// |v r| < qmax + 2^-13 (the proof is there). The result's low bits hold that integer in two's
// complement: its low 8 / 4 bits are the i8 / nibble code.
#define MAGIC 12582912.0f

// Codes of the N values v of one block with scale s (qmax QM), equal to block/mod.rs bitwise,
// handed G at a time to pack(g, z) (z[i]: the code of v[G * g + i] in its low bits, two's
// complement), with one branch a block: where r = fl(1/s) is finite (then s > 0 too), code_mul,
// one fma a value; where it overflows, code_div for every value if s > 0 (a subnormal scale),
// else 0 (a zero scale, or the NaN scale of a non-finite block). Each branch packs its own
// codes, so that only the packed words are live where the branches meet.
template <int QM, int G, int N, class Pack>
__device__ __forceinline__ void block_codes(const float* v, float s, float r, Pack pack) {
    if (__float_as_uint(r) < NON_FINITE) {
#pragma unroll
        for (int g = 0; g < N / G; ++g) {
            u32 z[G];
#pragma unroll
            for (int i = 0; i < G; ++i) z[i] = __float_as_uint(__fmaf_rn(v[G * g + i], r, MAGIC));
            pack(g, z);
        }
    } else if (s > 0.0f) {
#pragma unroll
        for (int g = 0; g < N / G; ++g) {
            u32 z[G];
#pragma unroll
            for (int i = 0; i < G; ++i) z[i] = (u32)code_div(v[G * g + i], s, (float)QM);
            pack(g, z);
        }
    } else {
#pragma unroll
        for (int g = 0; g < N / G; ++g) {
            u32 z[G];
#pragma unroll
            for (int i = 0; i < G; ++i) z[i] = 0u;
            pack(g, z);
        }
    }
}

// Packs the low bytes of four codes into a word (code 0 in byte 0).
__device__ __forceinline__ u32 pack8x4(const u32* z) {
    return __byte_perm(__byte_perm(z[0], z[1], 0x0040u), __byte_perm(z[2], z[3], 0x0040u), 0x5410u);
}
// Packs the low nibbles of four codes into 16 bits (code 0 in the low nibble of byte 0);
// the bits above 16 are garbage.
__device__ __forceinline__ u32 pack4x4(const u32* z) {
    const u32 a = __byte_perm(z[0], z[2], 0x0040u), b = __byte_perm(z[1], z[3], 0x0040u);
    return (a & 0x0f0fu) | ((b << 4) & 0xf0f0u);
}

// Quantises the quantisation block of this thread's group: BLOCK f32 at x + base (blen of them
// valid), codes of QM (127: a byte each, 7: a nibble each) written to codes (byte offset of
// element e: e for INT8, e / 2 for INT4), scale to *scale. The block is read as float4 units,
// unit u * TPB + t by thread t of the group (coalesced), VPT units a thread, all loads issued
// before any use.
template <int QM>
__device__ __forceinline__ void quantize_group(const float* __restrict__ x, u8* __restrict__ codes,
                                               float* __restrict__ scale, bool active, int blen,
                                               u32* red) {
    constexpr int UNITS = BLOCK / 4, TPB = tpb_of(UNITS), VPT = UNITS / TPB;
    const int t = threadIdx.x % TPB;
    float v[VPT * 4];
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
        const int e = (u * TPB + t) * 4;
        if (e + 4 <= blen) {
            const float4 f = *reinterpret_cast<const float4*>(x + e);
            v[4 * u] = f.x; v[4 * u + 1] = f.y; v[4 * u + 2] = f.z; v[4 * u + 3] = f.w;
        } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) v[4 * u + k] = (e + k < blen) ? x[e + k] : 0.0f;
        }
    }
    u32 m = 0;
#pragma unroll
    for (int i = 0; i < VPT * 4; ++i) m = umax(m, absbits(v[i]));
    m = group_max<TPB>(m, red);
    if (!active) return;
    const float s = scale_of(m, (float)QM);
    if (t == 0) *scale = s;
    // Unit u's 4 codes, packed: 4 bytes (INT8) or 16 bits (INT4).
    u32 w[VPT];
    block_codes<QM, 4, VPT * 4>(v, s, __frcp_rn(s), [&](int u, const u32* z) {
        w[u] = QM == 127 ? pack8x4(z) : pack4x4(z);
    });
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
        const int e = (u * TPB + t) * 4;
        if (QM == 127) {
            if (e + 4 <= blen) {
                *reinterpret_cast<u32*>(codes + e) = w[u];
            } else {
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    if (e + k < blen) codes[e + k] = (u8)(w[u] >> (8 * k));
            }
        } else {
            if (e + 4 <= blen) {
                *reinterpret_cast<u16*>(codes + e / 2) = (u16)w[u];
            } else if (e < blen) {  // blen is even: one byte (two codes) valid
                codes[e / 2] = (u8)w[u];
            }
        }
    }
}

// x [n] f32 -> codes [n] (i8 bits), scales [nblocks]. A group of TPB threads per block,
// NT / TPB blocks a CTA.
extern "C" __global__ void __launch_bounds__(NT, 8) quantize_int8(
    const float* __restrict__ x, u8* __restrict__ codes, float* __restrict__ scales,
    i64 n, i64 nblocks) {
    constexpr int TPB = tpb_of(BLOCK / 4);
    __shared__ u32 red[NT / 32];
    const i64 b = (i64)blockIdx.x * (NT / TPB) + threadIdx.x / TPB;
    const bool active = b < nblocks;
    const i64 base = b * BLOCK;
    const int blen = !active ? 0 : (n - base) < BLOCK ? (int)(n - base) : BLOCK;
    quantize_group<127>(x + (active ? base : 0), codes + (active ? base : 0), scales + b, active, blen, red);
}

// x [W * S] f32 -> packed [W * S / 2], scales [W * S / BLOCK], slice p (bps blocks) written at
// position (p % rpn) * nodes + p / rpn. S % BLOCK == 0 (so n % BLOCK == 0 too, but the tail
// guard is kept so that nodes = rpn = 1, bps = nblocks is plain INT4).
extern "C" __global__ void __launch_bounds__(NT, 8) quantize_int4_swizzled(
    const float* __restrict__ x, u8* __restrict__ packed, float* __restrict__ scales,
    i64 n, i64 nblocks, i64 bps, i64 nodes, i64 rpn) {
    constexpr int TPB = tpb_of(BLOCK / 4);
    __shared__ u32 red[NT / 32];
    const i64 b = (i64)blockIdx.x * (NT / TPB) + threadIdx.x / TPB;
    const bool active = b < nblocks;
    i64 ob = 0, base = 0;
    int blen = 0;
    if (active) {
        const i64 p = b / bps, k = b - p * bps;
        ob = ((p % rpn) * nodes + p / rpn) * bps + k;
        base = b * BLOCK;
        blen = (n - base) < BLOCK ? (int)(n - base) : BLOCK;
    }
    quantize_group<7>(x + base, packed + ob * (BLOCK / 2), scales + ob, active, blen, red);
}

// Units (4 codes) a thread of the INT8 dequantisers, NT apart (quant::cuda::DEQ_UNROLL).
#ifndef DEQ_UNROLL
#define DEQ_UNROLL 4
#endif

// codes [n] (i8 bits), scales [ceil(n / BLOCK)] -> out [n] f32. Thread t of CTA c converts
// units (4 codes: a 4-byte load, a 16-byte store) c * NT * DEQ_UNROLL + k * NT + t.
extern "C" __global__ void __launch_bounds__(NT, 8) dequantize_int8_f32(
    const u8* __restrict__ codes, const float* __restrict__ scales, float* __restrict__ out, i64 n) {
    const i64 full = n / 4;
    const i64 u0 = (i64)blockIdx.x * (NT * DEQ_UNROLL) + threadIdx.x;
    u32 w[DEQ_UNROLL];
    float s[DEQ_UNROLL];
#pragma unroll
    for (int k = 0; k < DEQ_UNROLL; ++k) {
        const i64 u = u0 + k * NT;
        if (u < full) {
            w[k] = reinterpret_cast<const u32*>(codes)[u];
            s[k] = scales[(u * 4) / BLOCK];
        }
    }
#pragma unroll
    for (int k = 0; k < DEQ_UNROLL; ++k) {
        const i64 u = u0 + k * NT;
        if (u < full) {
            float4 f;
            f.x = __fmul_rn((float)(signed char)(w[k] & 0xffu), s[k]);
            f.y = __fmul_rn((float)(signed char)((w[k] >> 8) & 0xffu), s[k]);
            f.z = __fmul_rn((float)(signed char)((w[k] >> 16) & 0xffu), s[k]);
            f.w = __fmul_rn((float)(signed char)(w[k] >> 24), s[k]);
            reinterpret_cast<float4*>(out)[u] = f;
        } else if (u == full) {
            for (i64 e = 4 * u; e < n; ++e) out[e] = __fmul_rn((float)(signed char)codes[e], scales[e / BLOCK]);
        }
    }
}

// Exact helpers with a PTX fast form on sm_80+ and a portable form elsewhere (the portable
// form is also what the CPU emulation of this source runs).
// lop3.b32 with truth table LUT (a: 0xf0, b: 0xcc, c: 0xaa).
template <int LUT>
__device__ __forceinline__ u32 lop3(u32 a, u32 b, u32 c) {
#ifdef __CUDA_ARCH__
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
    return d;
#else
    u32 d = 0;
    for (int i = 0; i < 32; ++i) {
        const int k = (((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1);
        d |= (u32)((LUT >> k) & 1) << i;
    }
    return d;
#endif
}
// max(m, |v|) that propagates NaN (m >= 0): one FMNMX.NAN with an |.| operand on sm_80+.
// Its bits & ABS_MASK order like the integer max of `absbits` (NaN: >= NON_FINITE).
__device__ __forceinline__ float max_abs_nan(float m, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(v)));
    return r;
#else
    return (m != m || v != v) ? __uint_as_float(0x7fffffffu) : fmaxf(m, fabsf(v));
#endif
}
// bf16 bits of (lo, hi) in one word (lo in the low half), each f32_to_bf16: one
// cvt.rn.bf16x2.f32 on sm_80+ (IEEE round to nearest even, subnormals kept; a NaN product of
// __fmul_rn is the canonical 0x7fffffff, which both forms map to 0x7fff).
__device__ __forceinline__ u32 bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
#endif
}

// i8 code in byte J of x ^ 0x80808080 -> float, exact: the byte (code + 128) put into the
// mantissa of 2^23 (one prmt), minus 2^23 + 128.
template <int J>
__device__ __forceinline__ float i8f(u32 xs) {
    return __fsub_rn(__uint_as_float(__byte_perm(xs, 0x4b000000u, 0x7440u + J)), 8388736.0f);
}

// 8-code units a thread of dequantize_int8_bf16, NT apart (quant::cuda::BF16_UNROLL).
#ifndef BF16_UNROLL
#define BF16_UNROLL 4
#endif

// As dequantize_int8_f32, output bf16 bits (round to nearest even). Units of 8 codes (an
// 8-byte load, one 16-byte store): thread t of CTA c converts units
// c * NT * BF16_UNROLL + k * NT + t, k < BF16_UNROLL, all loads issued first. Consecutive
// lanes take consecutive units, so each warp load covers 256 contiguous bytes and each warp
// store 512 (whole 128-byte lines, no partial sectors).
// Per element: prmt + fsub (code to float) + fmul + half a cvt.
extern "C" __global__ void __launch_bounds__(NT, 8) dequantize_int8_bf16(
    const u8* __restrict__ codes, const float* __restrict__ scales, u16* __restrict__ out, i64 n) {
    const i64 full = n / 8;
    const i64 u0 = (i64)blockIdx.x * (NT * BF16_UNROLL) + threadIdx.x;
    // 32-bit bookkeeping (the 32-register budget): unit u0 + k * NT is full iff k * NT < lim,
    // and is the tail unit (u == full) iff k * NT == lim; a full unit's scale is number
    // q0 + (r0 + 8 * k * NT) / BLOCK, where 8 * u0 = q0 * BLOCK + r0.
    const i64 left = full - u0;
    const int lim = left < 0 ? -1 : left > NT * BF16_UNROLL ? NT * BF16_UNROLL : (int)left;
    const i64 q0 = (8 * u0) / BLOCK;
    const int r0 = (int)(8 * u0 - q0 * BLOCK);
    const uint2* cp = reinterpret_cast<const uint2*>(codes) + u0;
    const float* sp = scales + q0;
    uint2 w[BF16_UNROLL];
    float s[BF16_UNROLL];
#pragma unroll
    for (int k = 0; k < BF16_UNROLL; ++k) {
        if (k * NT < lim) {
            w[k] = cp[k * NT];
            s[k] = sp[(r0 + 8 * k * NT) / BLOCK];
        }
    }
    uint4* op = reinterpret_cast<uint4*>(out) + u0;
#pragma unroll
    for (int k = 0; k < BF16_UNROLL; ++k) {
        if (k * NT < lim) {
            const u32 q0 = w[k].x ^ 0x80808080u, q1 = w[k].y ^ 0x80808080u;
            const float sk = s[k];
            const u32 h0 = bf16x2(__fmul_rn(i8f<0>(q0), sk), __fmul_rn(i8f<1>(q0), sk));
            const u32 h1 = bf16x2(__fmul_rn(i8f<2>(q0), sk), __fmul_rn(i8f<3>(q0), sk));
            const u32 h2 = bf16x2(__fmul_rn(i8f<0>(q1), sk), __fmul_rn(i8f<1>(q1), sk));
            const u32 h3 = bf16x2(__fmul_rn(i8f<2>(q1), sk), __fmul_rn(i8f<3>(q1), sk));
            op[k * NT] = make_uint4(h0, h1, h2, h3);
        }
    }
    // The tail unit (n % 8 codes), by the thread whose unit u0 + k * NT is `full`.
    if (lim >= 0 && lim < NT * BF16_UNROLL && lim % NT == 0) {
        for (i64 e = 8 * full; e < n; ++e)
            out[e] = f32_to_bf16(__fmul_rn((float)(signed char)codes[e], scales[e / BLOCK]));
    }
}

// ---- Fused INT4 kernels. A thread owns units of 32 consecutive elements (16 bytes of each
// piece: one uint4 load a piece), VPT units a thread; TPB threads a block.

// Threads a block of `units` 32-element units: the largest power of two dividing `units`, at
// most NT (one unit a thread for power-of-two blocks). Up to a warp, the block's absmax is a
// few shuffles (no shared memory, no barrier); wider groups (block 2048: 64 threads) add a
// shared-memory exchange.
__device__ constexpr int fused_tpb(int units) { return (units & -units) < NT ? (units & -units) : NT; }
#define F_TPB fused_tpb(BLOCK / 32)
#define F_VPT (BLOCK / 32 / F_TPB)
// Pieces whose loads are issued together (64 bytes a thread in flight).
#define F_GROUP (F_VPT >= 4 ? 1 : 4 / F_VPT)

// block/domain.rs pow2: 2^e, e in [-126, 127].
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float((u32)(e + 127) << 23); }
// block/domain.rs mul_pow2: x 2^t rounded once, t in [-126, 253] (two multiplies; the second is by 1
// where t <= 127, else both scale up, exact until an overflow).
__device__ __forceinline__ float mul_pow2(float x, int t) {
    const int a = t < 127 ? t : 127;
    return __fmul_rn(__fmul_rn(x, pow2f(a)), pow2f(t - a));
}
// x, hidden from the optimiser (a mov it cannot see through), so that values derived from x
// are recomputed where used instead of hoisted and kept live in registers.
__device__ __forceinline__ int opaque(int x) {
#ifdef __CUDA_ARCH__
    asm volatile("mov.b32 %0, %1;" : "=r"(x) : "r"(x));
#endif
    return x;
}
// 8 * 2^-149: the bias of a decoded nibble at position 0 (block/domain.rs BIAS0).
#define BIAS0 __uint_as_float(8u)

// The scale domain of one block (block/domain.rs int4_sum_block): shift k (S_j = mul_pow2(s_j, k),
// exact) and the bias B_0 of nibble position 0 (B_p = B_0 2^p). Only these two registers stay
// live across the loads (the 64-register budget); the factors and the four biases are
// recomputed where they are used.
struct Dom {
    int k;
    float B;
};

// Nibble K (bits 4K..4K+3) of the packed word w as a float, exact, in one instruction (a lop3:
// (w ^ 0x88888888) & mask): with its sign bit flipped the nibble is code + 8, and kept at its
// own bit position with exponent field 0 it is the subnormal (code + 8) 2^(4K - 149). Bits of
// w outside the nibble are ignored.
template <int K>
__device__ __forceinline__ float nib(u32 w) {
    return __uint_as_float(lop3<0x48>(w, 15u << (4 * K), 0x88888888u));
}

// The 32 elements of a 16-byte unit q (element e: nibble e % 8 of word e / 8, position
// 4 (e % 4)) times the domain scale S: acc = fma(F, S, -B_p) (FIRST: piece 0) or
// fma(F, S, acc), one rounding a value (block/domain.rs int4_sum_block), in element order.
template <bool FIRST>
__device__ __forceinline__ void deq32(uint4 q, float S, float B, float* acc) {
    const u32 ws[4] = {q.x, q.y, q.z, q.w};
    const float nb[4] = {-B, __fmul_rn(B, -16.0f), __fmul_rn(B, -256.0f), __fmul_rn(B, -4096.0f)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        // The upper half-word moved down (nibbles 4..7 at 0..12); the sign flips go into the
        // masks.
        const u32 lo = ws[i], hi = lo >> 16;
        const float c[8] = {nib<0>(lo), nib<1>(lo), nib<2>(lo), nib<3>(lo),
                            nib<0>(hi), nib<1>(hi), nib<2>(hi), nib<3>(hi)};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            acc[8 * i + k] = __fmaf_rn(c[k], S, FIRST ? nb[k & 3] : acc[8 * i + k]);
        }
    }
}

// The shift k of the domain given mx = max.NaN of the scales' |s| (block/domain.rs domain_shift: its
// exponent field, 255 for inf / NaN, clamped to [1, 254]; k = 254 - that).
__device__ __forceinline__ int domain_shift(float mx) {
    const int E = (int)(__float_as_uint(mx) >> 23);
    return 254 - (E < 1 ? 1 : E > 254 ? 254 : E);
}

// The loads of one group: the next GROUP pieces of this thread's VPT units, and their scales
// of this block.
template <int GROUP, int VPT>
struct GroupT {
    uint4 w[GROUP][VPT];
    float s[GROUP];
};
using Group = GroupT<F_GROUP, F_VPT>;

// The next F_GROUP pieces (those of the `left` still to sum) into G. p: this thread's first
// uint4 of the next piece, sp: that piece's scale of this block; both advance a piece (pstep
// uint4, nb scales) at a time.
__device__ __forceinline__ void load_group(Group& G, const uint4*& p, const float*& sp, i64 pstep, i64 nb,
                                           int left) {
#pragma unroll
    for (int g = 0; g < F_GROUP; ++g) {
        if (g < left) {
            G.s[g] = *sp;
#pragma unroll
            for (int u = 0; u < F_VPT; ++u) G.w[g][u] = p[u * F_TPB];
        }
        p += pstep;
        sp += nb;
    }
}

// Sums a loaded group (its first `left` pieces) into acc, in piece order (FIRST: it holds piece
// 0, which initialises acc). OWN: these are all the block's pieces (left <= GROUP), and the
// domain d is computed here from the group's scales (the hot path at up to GROUP pieces: no
// separate pass over the scales); otherwise d is given.
template <bool FIRST, bool OWN, int GROUP, int VPT>
__device__ __forceinline__ void sum_loaded(const GroupT<GROUP, VPT>& G, int left, Dom& d, float* acc) {
    if (OWN) {
        float mx = 0.0f;
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
            if (g < left) mx = max_abs_nan(mx, G.s[g]);
        d.k = domain_shift(mx);
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            if (g < left) {
                const float S = mul_pow2(G.s[g], d.k);
                d.B = g == 0 ? __fmul_rn(BIAS0, S) : __fmaf_rn(BIAS0, S, d.B);
            }
        }
    }
    // Past the first group, the factors 2^a, 2^(k - a) of mul_pow2 are recomputed each group
    // (a few integer instructions) rather than held across the loop: fewer spills there (block
    // 512, sm_90: 112 bytes of spill stores in the kernel instead of 124; the loop of more than
    // GROUP pieces still spills, docs/kernels.md).
    const int k = OWN || FIRST ? d.k : opaque(d.k);
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        if (g < left) {
            const float S = mul_pow2(G.s[g], k);
#pragma unroll
            for (int u = 0; u < VPT; ++u) {
                if (FIRST && g == 0) deq32<true>(G.w[g][u], S, d.B, acc + 32 * u);
                else deq32<false>(G.w[g][u], S, d.B, acc + 32 * u);
            }
        }
    }
}

// The next F_GROUP pieces of this thread's units summed into acc (see sum_loaded), all loads
// issued before any use.
template <bool FIRST, bool OWN>
__device__ __forceinline__ void sum_group(const uint4*& p, const float*& sp, i64 pstep, i64 nb, int left,
                                          Dom& d, float* acc) {
    Group G;
    load_group(G, p, sp, pstep, nb, left);
    sum_loaded<FIRST, OWN>(G, left, d, acc);
}

// Sum of `pieces` >= 1 INT4 pieces concatenated (packed [pieces * P], scales [pieces * nb],
// nb = ceil(2P / BLOCK)) over this thread's units of block b (unit u * F_TPB + t, u < F_VPT),
// in the block's scale domain (block/domain.rs int4_sum_block: piece 0 then one fma a piece, in piece
// order), into acc; returns the domain's shift k (true value = acc 2^(149 - k - p)). Full
// blocks of 16-byte aligned pieces (P % 16 == 0) take uint4 loads; other blocks (a short last
// block, other P) load bytes. Elements past blen are 0. pieces == 0: acc all 0.
__device__ __forceinline__ int sum_pieces(const u8* __restrict__ packed, const float* __restrict__ scales,
                                          int pieces, i64 P, i64 nb, i64 b, int blen, float* acc) {
    const int t = threadIdx.x % F_TPB;
    const u8* pj = packed + b * (BLOCK / 2);
    const float* sj = scales + b;
    // The domain: the largest scale exponent (max.NaN over |s|: 255 for inf / NaN), then the
    // bias chain over the scales moved into the domain: from the loaded scales where one load
    // group holds every piece, else a pass over the scales first (cached loads).
    Dom d;
    const bool vec = (P & 15) == 0 && blen == BLOCK && pieces > 0;
    if (vec && pieces <= F_GROUP) {
        const uint4* p = reinterpret_cast<const uint4*>(pj) + t;
        const float* sp = sj;
        sum_group<true, true>(p, sp, P >> 4, nb, pieces, d, acc);
        return d.k;
    }
    float mx = 0.0f;
    for (int j = 0; j < pieces; ++j) mx = max_abs_nan(mx, sj[(i64)j * nb]);
    d.k = domain_shift(mx);
    d.B = 0.0f;
    for (int j = 0; j < pieces; ++j) {
        const float S = mul_pow2(sj[(i64)j * nb], d.k);
        d.B = j == 0 ? __fmul_rn(BIAS0, S) : __fmaf_rn(BIAS0, S, d.B);
    }
    if (vec) {
        const uint4* p = reinterpret_cast<const uint4*>(pj) + t;
        const float* sp = sj;
        sum_group<true, false>(p, sp, P >> 4, nb, pieces, d, acc);
        for (int left = pieces - F_GROUP; left > 0; left -= F_GROUP)
            sum_group<false, false>(p, sp, P >> 4, nb, left, d, acc);
        return d.k;
    }
#pragma unroll
    for (int i = 0; i < F_VPT * 32; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int u = 0; u < F_VPT; ++u) {
        const int e = (u * F_TPB + t) * 32;
        float* a = acc + 32 * u;
        for (int j = 0; j < pieces; ++j) {
            const u8* p = pj + (i64)j * P + e / 2;
            u32 x[4] = {0u, 0u, 0u, 0u};
#pragma unroll
            for (int k = 0; k < 16; ++k)
                if (e + 2 * k < blen) x[k / 4] |= (u32)p[k] << (8 * (k % 4));
            const uint4 q = make_uint4(x[0], x[1], x[2], x[3]);
            const float S = mul_pow2(sj[(i64)j * nb], d.k);
            if (j == 0) deq32<true>(q, S, d.B, a);
            else deq32<false>(q, S, d.B, a);
        }
#pragma unroll
        for (int k = 0; k < 32; ++k)
            if (e + k >= blen) a[k] = 0.0f;
    }
    return d.k;
}

// Row stride (floats) of the per-warp transpose tile of dequantize_sum_int4: 32 + 4. A
// 16-byte shared access is served a quarter-warp (8 lanes) at a time; with rows 36 words
// apart, lane l's float4 at column 4q of row l sits in banks 4l + 4q (mod 32) and the 8
// float4 of one row in banks 4c + const: 8 distinct bank quads either way, no conflict.
#define T_STRIDE 36

// Pieces (see sum_pieces) -> f32 sum [2P]. F_TPB threads a block, NT / F_TPB blocks a CTA;
// each thread sums its 32-element units in registers as above. Stores go through a per-warp
// shared-memory transpose (4.5 KiB a warp): each lane writes its unit's 32 sums as a row of
// the tile, __syncwarp, then store k (k < 8) of lane l writes float4 (l & 7) of row
// 4k + (l >> 3), so one warp store covers 4 whole units (4 x 128 bytes; 512 contiguous bytes
// when the warp's units are contiguous: one unit a thread, or 32 threads or more a block).
// A warp holding a short unit or fewer than 32 running lanes (the grid's last) stores each
// lane's own elements directly instead.
extern "C" __global__ void __launch_bounds__(NT, 4) dequantize_sum_int4(
    const u8* __restrict__ packed, const float* __restrict__ scales, float* __restrict__ out,
    int pieces, i64 P, i64 nb) {
    __shared__ __align__(16) float tile[NT / 32][32 * T_STRIDE];
    const i64 b = (i64)blockIdx.x * (NT / F_TPB) + threadIdx.x / F_TPB;
    if (b >= nb) return;
    const int t = threadIdx.x % F_TPB;
    const int lane = threadIdx.x & 31;
    const i64 n = 2 * P, base = b * BLOCK;
    const int blen = (n - base) < BLOCK ? (int)(n - base) : BLOCK;
    float acc[F_VPT * 32];
    const int k = sum_pieces(packed, scales, pieces, P, nb, b, blen, acc);
    // True values: fl(v 2^(149 - k - p)) at position p = 4 (i % 4) (block/domain.rs mul_pow2).
#pragma unroll
    for (int i = 0; i < F_VPT * 32; ++i) acc[i] = mul_pow2(acc[i], 149 - k - 4 * (i & 3));
    // The lanes of this warp still running: those of blocks < nb (a prefix; lane 0's block is
    // b - lane / F_TPB). Only a warp with all 32 lanes and 32 full units each takes the
    // transposed stores (the exited lanes stay out of the vote's mask).
    const i64 act = (nb - (b - lane / F_TPB)) * F_TPB;
    const u32 mask = act >= 32 ? 0xffffffffu : (1u << act) - 1u;
    float* tw = tile[threadIdx.x >> 5];
#pragma unroll
    for (int u = 0; u < F_VPT; ++u) {
        const int e = (u * F_TPB + t) * 32;
        const float* a = acc + 32 * u;
        if (__all_sync(mask, e + 32 <= blen) && mask == 0xffffffffu) {
#pragma unroll
            for (int k = 0; k < 8; ++k)
                *reinterpret_cast<float4*>(tw + lane * T_STRIDE + 4 * k) =
                    make_float4(a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]);
            __syncwarp();
            float* ou = out + base + e;  // this lane's unit u
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int src = 4 * k + (lane >> 3), c = lane & 7;
                // Offset from ou of float4 c of lane src's unit u. Contiguous units (one a
                // thread, or a warp inside one block): 32 * (src - lane) + 4 * c. Otherwise
                // (several units a thread, F_TPB < 32 threads a block): unit
                // u * F_TPB + src % F_TPB of the block src / F_TPB - lane / F_TPB blocks from
                // this lane's.
                const int o = (F_VPT == 1 || F_TPB >= 32)
                                  ? 128 * k - 28 * lane
                                  : (src / F_TPB - lane / F_TPB) * BLOCK + (src % F_TPB - t) * 32 + 4 * c;
                *reinterpret_cast<float4*>(ou + o) =
                    *reinterpret_cast<const float4*>(tw + src * T_STRIDE + 4 * c);
            }
            if (u + 1 < F_VPT) __syncwarp();
        } else if (e + 32 <= blen) {
            float4* o = reinterpret_cast<float4*>(out + base + e);
#pragma unroll
            for (int k = 0; k < 8; ++k) o[k] = make_float4(a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]);
        } else {
            float* o = out + base + e;
#pragma unroll
            for (int k = 0; k < 32; ++k)
                if (e + k < blen) o[k] = a[k];
        }
    }
}

// Packs the low nibbles of eight codes into a word (code 2k in the low nibble of byte k,
// code 2k + 1 in the high one): the low bytes of the even and of the odd codes gathered by
// three prmt each, then (ev & 0x0f0f0f0f) | ((od << 4) & 0xf0f0f0f0) as a shift and one lop3
// (truth table 0xb8: c where b is set, else a).
__device__ __forceinline__ u32 pack8(const u32* z) {
    const u32 ev = __byte_perm(__byte_perm(z[0], z[2], 0x0040u), __byte_perm(z[4], z[6], 0x0040u), 0x5410u);
    const u32 od = __byte_perm(__byte_perm(z[1], z[3], 0x0040u), __byte_perm(z[5], z[7], 0x0040u), 0x5410u);
    return lop3<0xb8>(od << 4, 0x0f0f0f0fu, ev);
}

// Blocks a CTA takes a round (one group of F_TPB threads each).
#define F_BPC (NT / F_TPB)

// 1.5 * 2^23 + 8: fma(v, r, MAGIC8) is MAGIC8 plus the code, by MAGIC's rule (MAGIC8 is even
// too), so its low nibble is code + 8, in [1, 15] for |code| <= 7, and bits 4..21 are clear.
#define MAGIC8 12582920.0f

// Constants the compiler cannot fold (never written), so that products by them stay IMADs on
// the FMA pipe instead of becoming shifts and 64-bit adds on the ALU pipe, which issues at
// half rate and bounds the fused requantiser.
__constant__ u32 K16 = 16u;
__constant__ u32 K1 = 1u;

// p + n * m bytes: one IMAD.WIDE.U32 (FMA pipe) where m is not a constant the compiler sees.
template <class T>
__device__ __forceinline__ T* adv(T* p, u32 n, u32 m) {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(const_cast<void*>(
               reinterpret_cast<const void*>(p))) + (unsigned long long)n * m);
}

// pack8 on the FMA pipe, for eight codes given as MAGIC8 + code: the Horner sum
// z0 + 16 z1 + ... + 16^7 z7 mod 2^32 (seven IMADs) is the nibbles code + 8 plus the exponent
// bits 0x4b400000 (1 + 16 + ... + 16^7) = 0x3f400000 mod 2^32 (one IMAD takes them off); then
// xor 0x88888888 turns each code + 8 into the code's two's complement nibble.
__device__ __forceinline__ u32 pack8_fma(const u32* z) {
    u32 w = z[7];
#pragma unroll
    for (int i = 6; i >= 0; --i) w = w * K16 + z[i];
    return (w * K1 + 0xc0c00000u) ^ 0x88888888u;
}

// This thread's sums acc of its block (domain shift k; see sum_pieces) requantised: the scale
// to *sdst (by the group's thread 0), the codes of unit u (u < VPT) to dst + 16 TPB u, of
// which blen - 32 (u TPB + t) elements (all 32 if more) belong to the block. Every thread of
// the CTA calls it (the absmax is a group-wide max); those with active false store nothing.
// TPB threads a block, VPT units a thread. FMA_PACK: the codes packed on the FMA pipe
// (pack8_fma) on the fast branch.
template <bool FMA_PACK, int TPB, int VPT>
__device__ __forceinline__ void requantize_store(float* acc, int k, bool active, int blen, u8* dst,
                                                 float* sdst, u32* red) {
    const int t = threadIdx.x % TPB;
    // absmax of the true values: a max.NaN over |acc| a position p (one instruction a value),
    // the four moved exactly to position 12's scale (|acc| 2^(12 - p), no overflow), the
    // TPB-wide max (shuffles, shared memory above a warp), then fl(m 2^(137 - k)): rounding
    // is monotonic, so this is the absmax of the true values fl(v 2^(149 - k - p)).
    float mp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < VPT * 32; ++i) mp[i & 3] = max_abs_nan(mp[i & 3], acc[i]);
    const float md = max_abs_nan(max_abs_nan(__fmul_rn(mp[0], 4096.0f), __fmul_rn(mp[1], 256.0f)),
                                 max_abs_nan(__fmul_rn(mp[2], 16.0f), mp[3]));
    const u32 mdom = group_max<TPB>(__float_as_uint(md) & ABS_MASK, red);
    if (!active) return;
    const u32 m = __float_as_uint(mul_pow2(__uint_as_float(mdom), 137 - k)) & ABS_MASK;
    const float s = scale_of(m, 7.0f);
    if (t == 0) *sdst = s;
    // Codes (fused.rs dequantize_sum_requantize_int4): where r = fl(1/s) moved to the domain,
    // r_0 = fl(r 2^(149 - k)), is finite and r_12 = r_0 2^-12 is normal, r_p = r_0 2^-p is
    // exact and a code is one fma of the domain value; otherwise the true values take
    // quantize_int4's rules (block_codes).
    // Word i of unit u: codes 8i .. 8i + 7 of the unit, a nibble each.
    u32 ws[VPT * 4];
    const float r = __frcp_rn(s);
    const float r0 = mul_pow2(r, 149 - k), r12 = __fmul_rn(r0, 0x1p-12f);
    if (__float_as_uint(r0) < NON_FINITE && __float_as_uint(r12) > 0x00800000u) {
        const float rp[4] = {r0, __fmul_rn(r0, 0x1p-4f), __fmul_rn(r0, 0x1p-8f), r12};
#pragma unroll
        for (int g = 0; g < VPT * 4; ++g) {
            u32 z[8];
#pragma unroll
            for (int i = 0; i < 8; ++i)
                z[i] = __float_as_uint(__fmaf_rn(acc[8 * g + i], rp[i & 3], FMA_PACK ? MAGIC8 : MAGIC));
            ws[g] = FMA_PACK ? pack8_fma(z) : pack8(z);
        }
    } else {
#pragma unroll
        for (int i = 0; i < VPT * 32; ++i) acc[i] = mul_pow2(acc[i], 149 - k - 4 * (i & 3));
        block_codes<7, 8, VPT * 32>(acc, s, r, [&](int g, const u32* z) { ws[g] = pack8(z); });
    }
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
        const int e = (u * TPB + t) * 32;
        const u32* w = ws + 4 * u;
        u8* du = dst + 16 * TPB * u;
        if (e + 32 <= blen) {
            *reinterpret_cast<uint4*>(du) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
#pragma unroll
            for (int k = 0; k < 16; ++k)
                if (e + 2 * k < blen) du[k] = (u8)(w[k / 4] >> (8 * (k % 4)));
        }
    }
}

// Pieces (see sum_pieces) -> their sum requantised: packed [P], scales [nb]. F_TPB threads a
// block; the absmax is a max.NaN over |acc| (one instruction a value), then F_TPB-wide
// shuffles (and shared memory above a warp); one 16-byte store a unit. Blocks b0 and on, F_BPC
// a CTA (the blocks that dequantize_sum_requantize_int4_full leaves; any shape).
extern "C" __global__ void __launch_bounds__(NT, 4) dequantize_sum_requantize_int4(
    const u8* __restrict__ packed, const float* __restrict__ scales, u8* __restrict__ qout,
    float* __restrict__ qscales, int pieces, i64 P, i64 nb, i64 b0) {
    __shared__ u32 red[NT / 32];
    const i64 b = b0 + (i64)blockIdx.x * F_BPC + threadIdx.x / F_TPB;
    const bool active = b < nb;
    const i64 n = 2 * P;
    const int blen = !active ? 0 : (n - b * BLOCK) < BLOCK ? (int)(n - b * BLOCK) : BLOCK;
    float acc[F_VPT * 32];
    // `pieces` as passed (uniform: the per-piece branches of sum_group need no convergence
    // barrier); a thread past nb reads block 0 with blen 0 (the bytewise path, no packed bytes
    // loaded, in bounds) and sums zeros.
    const int k = sum_pieces(packed, scales, pieces, P, nb, active ? b : 0, blen, acc);
    const int t = threadIdx.x % F_TPB;
    requantize_store<false, F_TPB, F_VPT>(acc, k, active, blen, qout + b * (BLOCK / 2) + 16 * t, qscales + b,
                                          red);
}

// Threads a block of the persistent requantiser at up to 4 pieces: half the general kernels'
// where that leaves whole units (two 32-element units a thread at blocks of 64 and more powers
// of two), so that the per-block work (domain, absmax, scale, reciprocal: ~190 instructions a
// thread) is paid once for 64 elements: 468 instructions a 32-element unit instead of 563
// (block 512, 4 pieces, traced SASS).
#define Q_TPB (F_VPT == 1 && F_TPB >= 2 ? F_TPB / 2 : F_TPB)

// Most pieces of the two persistent requantisers (quant::cuda::FULL_PIECES, FULL8_PIECES): one
// load group holds every piece.
#ifndef FULL_PIECES
#define FULL_PIECES 4
#endif
#ifndef FULL8_PIECES
#define FULL8_PIECES 8
#endif

// The fast path of dequantize_sum_requantize_int4, for 1 <= pieces <= GROUP (one load group
// holds every piece) of P bytes, P % 16 == 0 and P < 2^32: the first `rounds` * (NT / TPB)
// blocks, all full, TPB threads a block. A round is NT / TPB consecutive blocks. Persistent:
// CTA c takes rounds c, c + gridDim.x, ... (the grid is what stays resident, quant/src/cuda.rs
// `dequantize_sum_int4_into`), so the start-up work is paid once a CTA, and each round's
// successor's loads are issued as soon as its codes are summed, in flight while it
// requantises. The kernel is bound by instruction issue and the ALU pipe (a lop3 a nibble), so
// the per-round addresses are IMADs (adv) and the codes are packed by IMADs (pack8_fma).
template <int TPB, int GROUP>
__device__ __forceinline__ void requantize_rounds(const u8* __restrict__ packed, const float* __restrict__ scales,
                                                  u8* __restrict__ qout, float* __restrict__ qscales,
                                                  int pieces, u32 P, u32 nb, u32 rounds) {
    constexpr int VPT = BLOCK / 32 / TPB, BPC = NT / TPB;
    __shared__ u32 red[NT / 32];
    const u32 t = threadIdx.x % TPB, blk = threadIdx.x / TPB;
    // Round 0's addresses of this thread (its first unit of piece 0, its block's scale of piece
    // 0, its output unit and scale); a round moves them round_bytes (packed and output) and
    // round_scales (scales) on, a piece P bytes (packed) and 4 nb (scales).
    const u8* const p0 = packed + blk * (BLOCK / 2) + 16 * t;
    const float* const s0 = scales + blk;
    u8* const q0 = qout + blk * (BLOCK / 2) + 16 * t;
    float* const qs0 = qscales + blk;
    const u32 round_bytes = K1 * (BPC * BLOCK / 2), round_scales = K1 * (4 * BPC);
    const u32 scale_step = 4 * nb;
    auto load_round = [&](GroupT<GROUP, VPT>& G, u32 r) {
        const u8* p = adv(p0, r, round_bytes);
        const float* sp = adv(s0, r, round_scales);
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            if (g < pieces) {
                G.s[g] = *sp;
#pragma unroll
                for (int u = 0; u < VPT; ++u) G.w[g][u] = reinterpret_cast<const uint4*>(p)[u * TPB];
            }
            p = adv(p, P, K1);
            sp = adv(sp, scale_step, K1);
        }
    };
    GroupT<GROUP, VPT> G;
    u32 r = blockIdx.x;
    if (r < rounds) load_round(G, r);
    for (; r < rounds; r += gridDim.x) {
        float acc[VPT * 32];
        Dom d;
        sum_loaded<true, true>(G, pieces, d, acc);
        if (r + gridDim.x < rounds) load_round(G, r + gridDim.x);
        requantize_store<true, TPB, VPT>(acc, d.k, true, BLOCK, adv(q0, r, round_bytes), adv(qs0, r, round_scales),
                                         red);
    }
}

// requantize_rounds for 1 to 4 pieces, Q_TPB threads a block (block 512, sm_90: 128 registers,
// 16 warps an SM, one 8-byte spill outside the loop).
extern "C" __global__ void __launch_bounds__(NT, 2) dequantize_sum_requantize_int4_full(
    const u8* __restrict__ packed, const float* __restrict__ scales, u8* __restrict__ qout,
    float* __restrict__ qscales, int pieces, u32 P, u32 nb, u32 rounds) {
    requantize_rounds<Q_TPB, FULL_PIECES>(packed, scales, qout, qscales, pieces, P, nb, rounds);
}

// requantize_rounds for 5 to 8 pieces (8 GPUs a node), F_TPB threads a block: one unit a
// thread, so that the eight pieces' loads fit in registers beside the sums (block 512, sm_90:
// 118 registers, no spills).
extern "C" __global__ void __launch_bounds__(NT, 2) dequantize_sum_requantize_int4_full8(
    const u8* __restrict__ packed, const float* __restrict__ scales, u8* __restrict__ qout,
    float* __restrict__ qscales, int pieces, u32 P, u32 nb, u32 rounds) {
    requantize_rounds<F_TPB, FULL8_PIECES>(packed, scales, qout, qscales, pieces, P, nb, rounds);
}
