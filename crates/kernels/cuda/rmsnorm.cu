// rmsnorm.cu: RMSNorm over the last dimension (Llama's), with the residual add before it fused
// into the forward and the residual gradient added into dx in the backward. bf16 storage, f32
// math. Launchers: model/src/layers/rmsnorm.rs (`mod cuda`).
//
// Size letters: N rows, C channels (C a #define, C % 8 == 0, so that every row is whole 16-byte
// vectors). One warp owns a row; lane `lane` handles the row's vectors lane, lane + 32, ...
//
// Rounding, as the CPU reference (and Hugging Face's LlamaRMSNorm) does it: h = x + delta rounded
// to bf16 once; rstd = 1 / sqrt(mean(h^2) + eps) in f32; normed = bf16(h * rstd); out =
// bf16(normed * w). Backward in f32 from the bf16 inputs, each output rounded once.
//
// Bounds (both memory-bound; the math is a few FMAs a byte):
//   rmsnorm_forward:  reads x (2NC bytes) and delta (2NC, when given), writes h (2NC, when
//                     delta is given) and out (2NC), rstd (4N). One warp a row, 4 warps a CTA;
//                     rows of C <= 4096 sit in registers between the two passes, wider rows
//                     are read again (an L1 hit).
//   rmsnorm_backward: reads dout, h (4NC), dresidual (2NC, when given), writes dx (2NC); the
//                     second pass re-reads dout and h (L1). dw: each warp accumulates its rows'
//                     dout * xhat in its own f32 slice of shared memory (WARPS * C * 4 bytes;
//                     no atomics), the CTA sums its warps in order into `partials` (grid x C),
//                     rmsnorm_backward_reduce sums the partials in CTA order: deterministic.
// Measured on the H200 at Llama 3.2 1B's (N, C) = (16384, 2048), against a device copy of
// 3.2 TB/s (read + write) in the same test (tests/gpu/llama_layers.rs,
// llama_kernels_against_the_copy): forward 2.6 TB/s (83% of the copy), forward with the
// residual add 3.2 TB/s (99%), backward with dresidual 3.0 TB/s (93%). (With the forward's row
// re-read from L1 instead of kept in registers: 64% and 78%.)

#include "common.cuh"
#include "rmsnorm.cuh"
static_assert(PRECISION == PRECISION_BF16, "rmsnorm.cu: bf16 only: its rows are vectors of 8 (unpack8, pack8)");

#ifndef C
#define C 2048
#endif
// Warps a CTA of rmsnorm_backward (the launcher picks it so that the dw slices fit).
#ifndef WARPS
#define WARPS 4
#endif

static_assert(C % 8 == 0 && C > 0, "C must be a positive multiple of 8");

constexpr int NV = C / 8;  // 16-byte vectors a row

// Adds two vectors of 8 bf16 in f32, rounding each sum once.
__device__ __forceinline__ uint4 add8(uint4 a, uint4 b) {
    float fa[8], fb[8];
    unpack8(a, fa);
    unpack8(b, fb);
#pragma unroll
    for (int k = 0; k < 8; k++) fa[k] += fb[k];
    return pack8(fa);
}

__device__ __forceinline__ float sum_sq8(uint4 v) {
    float f[8], q = 0.f;
    unpack8(v, f);
#pragma unroll
    for (int k = 0; k < 8; k++) q += f[k] * f[k];
    return q;
}

constexpr int VPL = (NV + 31) / 32;   // vectors a lane
constexpr bool FULL = NV % 32 == 0;   // every lane has VPL vectors (no guard needed)
constexpr int FWD_REG_V = 16;         // rows of C <= 4096 stay in registers

// x (N, C), delta (N, C) or null, w (C) bf16 -> h (N, C) bf16 = x + delta (written only when
// delta is given; h may be null otherwise), out (N, C) bf16 (null: not written, for a consumer
// that makes the normalised rows itself from h and rstd, as fp8_quantize_rmsnorm does), rstd
// (N) f32.
// Block: 4 warps (any multiple of 32 works), grid ceil(N / warps a CTA). Rows of C <= 4096 are
// read once into registers (every load issued before the first use); wider rows are read again
// for the second pass (an L1 hit).
extern "C" __global__ void __launch_bounds__(128) rmsnorm_forward(
    act_t* __restrict__ out, act_t* __restrict__ h, float* __restrict__ rstd_out,
    const act_t* __restrict__ x, const act_t* __restrict__ delta, const act_t* __restrict__ w,
    int N, float eps) {
    const int lane = threadIdx.x & 31;
    const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const act_t* xr = x + row * C;
    const act_t* dr = delta == nullptr ? nullptr : delta + row * C;
    act_t* hr = delta == nullptr ? nullptr : h + row * C;
    act_t* outr = out == nullptr ? nullptr : out + row * C;
    float q = 0.f;
    if constexpr (VPL <= FWD_REG_V) {
        uint4 hv[VPL];
#pragma unroll
        for (int v = 0; v < VPL; v++) {
            const int i = v * 32 + lane;
            hv[v] = (FULL || i < NV) ? ld16(xr + i * 8) : uint4{0u, 0u, 0u, 0u};
        }
        if (dr != nullptr) {
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                const int i = v * 32 + lane;
                if (FULL || i < NV) {
                    hv[v] = add8(hv[v], ld16(dr + i * 8));
                    st16(hr + i * 8, hv[v]);
                }
            }
        }
#pragma unroll
        for (int v = 0; v < VPL; v++) q += sum_sq8(hv[v]);  // padding vectors add 0
        const float rstd = 1.f / sqrtf(warp_sum(q) * (1.f / C) + eps);
        if (outr != nullptr) {
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                const int i = v * 32 + lane;
                if (FULL || i < NV) st16(outr + i * 8, rms_out8(hv[v], ld16(w + i * 8), rstd));
            }
        }
        if (lane == 0) rstd_out[row] = rstd;
    } else {
        // The normalised row's source for the second pass: h when the add runs here, else x.
        const act_t* src = xr;
        if (dr != nullptr) {
            for (int i = lane; i < NV; i += 32) {
                const uint4 hv = add8(ld16(xr + i * 8), ld16(dr + i * 8));
                st16(hr + i * 8, hv);
                q += sum_sq8(hv);
            }
            src = hr;  // this lane re-reads only the vectors it wrote: no barrier needed
        } else {
            for (int i = lane; i < NV; i += 32) q += sum_sq8(ld16(xr + i * 8));
        }
        const float rstd = 1.f / sqrtf(warp_sum(q) * (1.f / C) + eps);
        if (outr != nullptr)
            for (int i = lane; i < NV; i += 32)
                st16(outr + i * 8, rms_out8(ld16(src + i * 8), ld16(w + i * 8), rstd));
        if (lane == 0) rstd_out[row] = rstd;
    }
}

// dout, h (N, C) bf16 (h: the forward's normalised input), rstd (N) f32, w (C) bf16,
// dres (N, C) bf16 or null -> dx (N, C) bf16 = dres + rstd * (dnorm - xhat * mean(dnorm * xhat)),
// dnorm = dout * w, xhat = h * rstd; partials (gridDim.x, C) f32: this CTA's sums of
// dout * xhat (dw).
// Block: WARPS warps, a persistent grid whose warps stride over the rows; dynamic shared
// memory WARPS * C * 4 bytes.
extern "C" __global__ void __launch_bounds__(WARPS * 32) rmsnorm_backward(
    act_t* __restrict__ dx, float* __restrict__ partials, const act_t* __restrict__ dout,
    const act_t* __restrict__ h, const float* __restrict__ rstd, const act_t* __restrict__ w,
    const act_t* __restrict__ dres, int N) {
    extern __shared__ float sh[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* sl = sh + warp * C;
    // Each lane touches only the channels of its own vectors until the CTA sum: no barrier
    // needed here.
    for (int j = lane; j < NV; j += 32)
#pragma unroll
        for (int k = 0; k < 8; k++) sl[j * 8 + k] = 0.f;

    for (i64 row = (i64)blockIdx.x * WARPS + warp; row < N; row += (i64)gridDim.x * WARPS) {
        const act_t* dr = dout + row * C;
        const act_t* hr = h + row * C;
        const float r = rstd[row];
        float s = 0.f;
        for (int i = lane; i < NV; i += 32) {
            float d[8], hf[8], wf[8];
            unpack8(ld16(dr + i * 8), d);
            unpack8(ld16(hr + i * 8), hf);
            unpack8(ld16(w + i * 8), wf);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float xh = hf[k] * r;
                s += d[k] * wf[k] * xh;
                sl[i * 8 + k] += d[k] * xh;
            }
        }
        const float m = warp_sum(s) * (1.f / C);
        act_t* dxr = dx + row * C;
        const act_t* rr = dres == nullptr ? nullptr : dres + row * C;
        for (int i = lane; i < NV; i += 32) {
            float d[8], hf[8], wf[8], o[8];
            unpack8(ld16(dr + i * 8), d);
            unpack8(ld16(hr + i * 8), hf);
            unpack8(ld16(w + i * 8), wf);
#pragma unroll
            for (int k = 0; k < 8; k++) o[k] = r * (d[k] * wf[k] - hf[k] * r * m);
            if (rr != nullptr) {
                float rf[8];
                unpack8(ld16(rr + i * 8), rf);
#pragma unroll
                for (int k = 0; k < 8; k++) o[k] += rf[k];
            }
            st16(dxr + i * 8, pack8(o));
        }
    }
    __syncthreads();
    // The CTA's partial sums, warps added in order 0, 1, ... (fixed order: deterministic).
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f;
#pragma unroll
        for (int wp = 0; wp < WARPS; wp++) s += sh[wp * C + c];
        partials[(i64)blockIdx.x * C + c] = s;
    }
}

// partials (G, C) f32 -> dw (C) bf16: column sums in a fixed order. Block (32, 8): threadIdx.x
// picks the column, threadIdx.y sums partial rows y, y + 8, ... in order, then row 0 of the
// block adds the 8 sums in order. Grid ceil(C / 32). dw may point into a unit's flat gradient.
extern "C" __global__ void __launch_bounds__(256) rmsnorm_backward_reduce(
    act_t* __restrict__ dw, const float* __restrict__ partials, int G) {
    __shared__ float part[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (c < C)
#pragma unroll 4
        for (int g = threadIdx.y; g < G; g += 8) s += partials[(i64)g * C + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.f;
#pragma unroll
        for (int y = 0; y < 8; y++) total += part[y][threadIdx.x];
        dw[c] = f32_to_act(total);
    }
}
