// layernorm.cu: LayerNorm over the last dimension, forward and backward (the residual gradient
// added into dx), bf16 storage, f32 math. Launchers: model/src/layers/layernorm.rs (`mod cuda`).
//
// Size letters: N rows, C channels (C a #define, C % 8 == 0, so that every row is whole 16-byte
// vectors). Lane `lane` of the warp that owns a row holds the row's vectors i = v*32 + lane,
// v < VPL, 8 channels each.
//
// Bounds (both memory-bound; nothing here comes close to the FP32 or issue limits):
//   layernorm_forward:  reads x (2NC bytes), writes out (2NC) + mean, rstd (8N). One warp a row,
//                       4 warps a CTA, grid ceil(N / 4). Rows of C <= 4096 sit in registers
//                       (raw bf16 pairs, 2 passes over registers: mean, then the squared
//                       deviations); wider rows are read three times (the re-reads mostly hit L1).
//   layernorm_backward: reads dout, x, (dresidual) (4-6NC bytes), writes dx (2NC). One warp a row,
//                       WARPS warps a CTA, a persistent grid (a few CTAs an SM) whose warps stride
//                       over the rows. dw, db: each warp accumulates its rows' dout*xhat and dout
//                       in its own f32 slice of shared memory (no atomics), the CTA sums the
//                       slices in warp order into `partials` (gridDim x 2C f32), and
//                       layernorm_backward_reduce sums the partials in CTA order: deterministic.
//                       Rows of C <= 2048 sit in registers, wider ones are read twice.
// Aim: >= 80% of the H200's ~4.3 TB/s copy bandwidth at (N, C) = (16384, 1024). Measured at
// gpt350m's shape (`trainer bench --profile`, norm family; docs/kernels.md, "What bounds the
// model's kernels"): 3.2 ms for the step's 49 forwards and 49 backwards, about 2.9 TB/s, 68% of
// the copy, short of the aim.

#include "common.cuh"
#include "layernorm.cuh"
static_assert(PRECISION == PRECISION_BF16, "layernorm.cu: bf16 only: its rows are vectors of 8 (unpack8, pack8)");

#ifndef C
#define C 768
#endif
// Warps a CTA of layernorm_backward (the launcher picks it so that the shared slices fit).
#ifndef WARPS
#define WARPS 4
#endif

static_assert(C % 8 == 0 && C > 0, "C must be a positive multiple of 8");

constexpr int NV = C / 8;                // 16-byte vectors a row
constexpr int VPL = (NV + 31) / 32;      // vectors a lane
constexpr bool FULL = NV % 32 == 0;      // every lane has VPL vectors (no guard needed)
constexpr int FWD_REG_V = 16;            // forward keeps rows of C <= 4096 in registers
constexpr int BWD_REG_V = 8;             // backward keeps rows of C <= 2048 in registers

// x (N, C), w (C), b (C) bf16 -> out (N, C) bf16 (null: not written, for a consumer that
// makes the normalised rows itself from x, mean and rstd, as fp8_quantize_layernorm does),
// mean (N), rstd (N) f32;
// rstd = 1 / sqrt(mean((x - mean)^2) + eps). Block: 4 warps (any multiple of 32 works).
extern "C" __global__ void __launch_bounds__(128) layernorm_forward(
    act_t* __restrict__ out, float* __restrict__ mean_out, float* __restrict__ rstd_out,
    const act_t* __restrict__ x, const act_t* __restrict__ w, const act_t* __restrict__ b, int N,
    float eps) {
    const int lane = threadIdx.x & 31;
    const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const act_t* xr = x + row * C;
    act_t* outr = out == nullptr ? nullptr : out + row * C;
    float mean, rstd;
    if constexpr (VPL <= FWD_REG_V) {
        uint4 xv[VPL];
#pragma unroll
        for (int v = 0; v < VPL; v++) {
            const int i = v * 32 + lane;
            if (FULL || i < NV) xv[v] = ld16(xr + i * 8);
            else xv[v] = uint4{0u, 0u, 0u, 0u};  // adds 0 to the sum; skipped below
        }
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < VPL; v++) {
            float f[8];
            unpack8(xv[v], f);
#pragma unroll
            for (int k = 0; k < 8; k++) s += f[k];
        }
        mean = warp_sum(s) * (1.f / C);
        float q = 0.f;
#pragma unroll
        for (int v = 0; v < VPL; v++) {
            if (FULL || v * 32 + lane < NV) {
                float f[8];
                unpack8(xv[v], f);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float d = f[k] - mean;
                    q += d * d;
                }
            }
        }
        rstd = 1.f / sqrtf(warp_sum(q) * (1.f / C) + eps);
        if (outr != nullptr) {
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                const int i = v * 32 + lane;
                if (FULL || i < NV) st16(outr + i * 8, ln_out8(xv[v], ld16(w + i * 8), ld16(b + i * 8), mean, rstd));
            }
        }
    } else {
        // Wide rows: three passes over global memory (the row, 2C bytes, mostly stays in L1).
        float s = 0.f;
#pragma unroll 4
        for (int i = lane; i < NV; i += 32) {
            float f[8];
            unpack8(ld16(xr + i * 8), f);
#pragma unroll
            for (int k = 0; k < 8; k++) s += f[k];
        }
        mean = warp_sum(s) * (1.f / C);
        float q = 0.f;
#pragma unroll 4
        for (int i = lane; i < NV; i += 32) {
            float f[8];
            unpack8(ld16(xr + i * 8), f);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float d = f[k] - mean;
                q += d * d;
            }
        }
        rstd = 1.f / sqrtf(warp_sum(q) * (1.f / C) + eps);
        if (outr != nullptr)
#pragma unroll 4
            for (int i = lane; i < NV; i += 32)
                st16(outr + i * 8, ln_out8(ld16(xr + i * 8), ld16(w + i * 8), ld16(b + i * 8), mean, rstd));
    }
    if (lane == 0) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

// A warp's slice of shared memory in layernorm_backward: float4 slots, lane-minor so that the
// 16-byte accesses of a warp hit 32 distinct 16-byte bank groups. kind 0: dw, 1: db; half 0:
// channels 0-3 of the lane's vector v, 1: channels 4-7.
constexpr int SLICE_F4 = 2 * VPL * 2 * 32;
__device__ __forceinline__ int slot(int kind, int v, int half, int lane) {
    return ((kind * VPL + v) * 2 + half) * 32 + lane;
}

// acc[kind 0] += d * xhat, acc[kind 1] += d over the 8 channels of vector slot v.
__device__ __forceinline__ void accumulate8(float4* sl, int v, int lane, const float d[8],
                                            const float xh[8]) {
    float4 a;
    a = sl[slot(0, v, 0, lane)];
    a.x += d[0] * xh[0]; a.y += d[1] * xh[1]; a.z += d[2] * xh[2]; a.w += d[3] * xh[3];
    sl[slot(0, v, 0, lane)] = a;
    a = sl[slot(0, v, 1, lane)];
    a.x += d[4] * xh[4]; a.y += d[5] * xh[5]; a.z += d[6] * xh[6]; a.w += d[7] * xh[7];
    sl[slot(0, v, 1, lane)] = a;
    a = sl[slot(1, v, 0, lane)];
    a.x += d[0]; a.y += d[1]; a.z += d[2]; a.w += d[3];
    sl[slot(1, v, 0, lane)] = a;
    a = sl[slot(1, v, 1, lane)];
    a.x += d[4]; a.y += d[5]; a.z += d[6]; a.w += d[7];
    sl[slot(1, v, 1, lane)] = a;
}

// dx for one vector: rstd * (dnorm - m1 - xhat * m2) (+ dresidual); also feeds dw, db.
__device__ __forceinline__ uint4 ln_dx8(uint4 dv, uint4 xv, uint4 wv, bool has_res, uint4 rv,
                                        float mean, float rstd, float m1, float m2, float4* sl,
                                        int v, int lane) {
    float d[8], xf[8], wf[8], xh[8], o[8];
    unpack8(dv, d);
    unpack8(xv, xf);
    unpack8(wv, wf);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        xh[k] = (xf[k] - mean) * rstd;
        o[k] = rstd * (d[k] * wf[k] - m1 - xh[k] * m2);
    }
    if (has_res) {
        float r[8];
        unpack8(rv, r);
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] += r[k];
    }
    accumulate8(sl, v, lane, d, xh);
    return pack8(o);
}

// The two row sums of the backward, sum(dnorm) and sum(dnorm * xhat), for one vector.
__device__ __forceinline__ void ln_sums8(uint4 dv, uint4 xv, uint4 wv, float mean, float rstd,
                                         float& s1, float& s2) {
    float d[8], xf[8], wf[8];
    unpack8(dv, d);
    unpack8(xv, xf);
    unpack8(wv, wf);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float dn = d[k] * wf[k];
        s1 += dn;
        s2 += dn * ((xf[k] - mean) * rstd);
    }
}

// dout, x (N, C) bf16, mean, rstd (N) f32, w (C) bf16, dres (N, C) bf16 or null
// -> dx (N, C) bf16 = dres + rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)),
//    partials (gridDim.x, 2C) f32: this CTA's sums of dout * xhat (dw) then of dout (db).
// Block: WARPS warps; dynamic shared memory: WARPS * SLICE_F4 * 16 bytes.
extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) layernorm_backward(
    act_t* __restrict__ dx, float* __restrict__ partials, const act_t* __restrict__ dout,
    const act_t* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd,
    const act_t* __restrict__ w, const act_t* __restrict__ dres, int N) {
    extern __shared__ float4 sh[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float4* sl = sh + warp * SLICE_F4;
    // Each lane only ever touches its own slots until the CTA sum: no sync needed here.
    for (int j = lane; j < SLICE_F4; j += 32) sl[j] = float4{0.f, 0.f, 0.f, 0.f};

    for (i64 row = (i64)blockIdx.x * WARPS + warp; row < N; row += (i64)gridDim.x * WARPS) {
        const act_t* dr = dout + row * C;
        const act_t* xr = x + row * C;
        const act_t* rr = dres == nullptr ? nullptr : dres + row * C;
        act_t* dxr = dx + row * C;
        const float m = mean[row], r = rstd[row];
        float s1 = 0.f, s2 = 0.f;
        if constexpr (VPL <= BWD_REG_V) {
            // Every load of the row (dresidual too) issued before the first use.
            uint4 dv[VPL], xv[VPL], rv[VPL];
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                const int i = v * 32 + lane;
                if (FULL || i < NV) {
                    dv[v] = ld16(dr + i * 8);
                    xv[v] = ld16(xr + i * 8);
                    rv[v] = rr == nullptr ? uint4{0u, 0u, 0u, 0u} : ld16(rr + i * 8);
                }
            }
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                const int i = v * 32 + lane;
                if (FULL || i < NV) ln_sums8(dv[v], xv[v], ld16(w + i * 8), m, r, s1, s2);
            }
            const float m1 = warp_sum(s1) * (1.f / C), m2 = warp_sum(s2) * (1.f / C);
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                const int i = v * 32 + lane;
                if (FULL || i < NV)
                    st16(dxr + i * 8, ln_dx8(dv[v], xv[v], ld16(w + i * 8), rr != nullptr,
                                             rv[v], m, r, m1, m2, sl, v, lane));
            }
        } else {
#pragma unroll 4
            for (int i = lane; i < NV; i += 32)
                ln_sums8(ld16(dr + i * 8), ld16(xr + i * 8), ld16(w + i * 8), m, r, s1, s2);
            const float m1 = warp_sum(s1) * (1.f / C), m2 = warp_sum(s2) * (1.f / C);
#pragma unroll 2
            for (int v = 0; v < VPL; v++) {
                const int i = v * 32 + lane;
                if (FULL || i < NV)
                    st16(dxr + i * 8,
                         ln_dx8(ld16(dr + i * 8), ld16(xr + i * 8), ld16(w + i * 8),
                                rr != nullptr,
                                rr == nullptr ? uint4{0u, 0u, 0u, 0u} : ld16(rr + i * 8), m, r,
                                m1, m2, sl, v, lane));
            }
        }
    }
    __syncthreads();
    // The CTA's partial sums, warps added in order 0, 1, ... (fixed order: deterministic).
    const float* shf = reinterpret_cast<const float*>(sh);
    for (int t = threadIdx.x; t < 2 * C; t += blockDim.x) {
        const int kind = t >= C, c = t - kind * C;
        const int i = c >> 3, j = c & 7;
        const int f = slot(kind, i >> 5, j >> 2, i & 31) * 4 + (j & 3);
        float s = 0.f;
#pragma unroll
        for (int wp = 0; wp < WARPS; wp++) s += shf[wp * SLICE_F4 * 4 + f];
        partials[(i64)blockIdx.x * 2 * C + t] = s;
    }
}

// partials (G, 2C) f32 -> dw (C), db (C) bf16: column sums in a fixed order. Block (32, 8):
// threadIdx.x picks the column of 2C, threadIdx.y sums partial rows y, y + 8, ... in order, then
// row 0 of the block adds the 8 sums in order. Grid ceil(2C / 32).
extern "C" __global__ void __launch_bounds__(256) layernorm_backward_reduce(
    act_t* __restrict__ dw, act_t* __restrict__ db, const float* __restrict__ partials, int G) {
    __shared__ float part[8][33];
    const int t = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (t < 2 * C)
#pragma unroll 4
        for (int g = threadIdx.y; g < G; g += 8) s += partials[(i64)g * 2 * C + t];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && t < 2 * C) {
        float total = 0.f;
#pragma unroll
        for (int y = 0; y < 8; y++) total += part[y][threadIdx.x];
        if (t < C) dw[t] = f32_to_act(total);
        else db[t - C] = f32_to_act(total);
    }
}
