// elementwise.cu: GELU (tanh form) forward and backward, and the bias gradient (column sums),
// bf16 storage, f32 math. (The FP8 linear layers add their biases in the GEMMs' epilogue.)
// Launchers: model/src/layers/gelu.rs (`mod cuda`) and model/src/layers/linear.rs (`mod
// bias_grad`).
//
// Bounds (all memory-bound):
//   gelu_forward:      reads h, writes out: 4 bytes an element. 256 threads a CTA, a grid-stride
//                      loop over 16-byte vectors (8 elements) then a scalar tail; one MUFU.EX2
//                      and one MUFU.RCP an element, far below the memory time.
//   gelu_backward:     reads dout, h, writes dh: 6 bytes an element. Same shape.
//   bias_grad_partial: reads dout (N, OUT) once (2 N OUT bytes). Grid (OUT / 128 column tiles,
//                      S row slices), block (16, 16): a thread sums 8 columns (one 16-byte
//                      vector) over every 16th row of its slice; the block adds its 16 row
//                      groups in order into partials (S, OUT) f32.
//   bias_grad_final:   partials (S, OUT) -> db (OUT) bf16, slices added in order: deterministic.
//   gelu_backward_bias_grad_partial: gelu_backward and bias_grad_partial of its output in one
//                      pass (reads dout, h, writes dh: 6 bytes an element, where the two kernels
//                      apart move 8): the MLP's GELU backward and the c_fc bias gradient.
// Aim: close to the ~4.3 TB/s copy bandwidth of the H200 at gpt350m's sizes. Measured there
// (`trainer bench --profile`, elementwise family; docs/kernels.md, "What bounds the model's
// kernels"): the fused GELU backward with the c_fc bias gradient and the other bias gradients
// take 4.7 ms a step, about 3.0 TB/s, 70% of the copy. The forward's GELU runs in the GEMM's
// epilogue there (GELU_AUX_BIAS), not in gelu_forward.
//
// GELU: gelu(h) = 0.5 h (1 + tanh(u)), u = s (h + a h^3). With 0.5 (1 + tanh(u)) =
// sigmoid(2u) = 1 / (1 + exp(-2u)) =: g, gelu(h) = h g, and since 1 - tanh(u)^2 = 4 g (1 - g),
// gelu'(h) = g + 2 h g (1 - g) s (1 + 3 a h^2): no cancellation where tanh(u) is near -1, and
// no tanh call. a, s come in as arguments (GELU_A, GELU_S of gelu.rs).

#include "common.cuh"
#include "gelu.cuh"
static_assert(PRECISION == PRECISION_BF16, "elementwise.cu: bf16 only: its vectors are 8 elements (unpack8, pack8)");

// h (n) bf16 -> out (n) bf16. nvec: how many leading 16-byte vectors to take vectorised (n / 8
// when both pointers are 16-byte aligned, else 0); the rest element by element.
extern "C" __global__ void __launch_bounds__(256) gelu_forward(
    act_t* __restrict__ out, const act_t* __restrict__ h, i64 n, i64 nvec, float a, float s) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    for (i64 i = tid; i < nvec; i += stride) {
        float f[8];
        unpack8(ld16(h + i * 8), f);
#pragma unroll
        for (int k = 0; k < 8; k++) f[k] = gelu_f(f[k], a, s);
        st16(out + i * 8, pack8(f));
    }
    for (i64 i = nvec * 8 + tid; i < n; i += stride) out[i] = f32_to_act(gelu_f(act_to_f32(h[i]), a, s));
}

// dout, h (n) bf16 -> dh (n) bf16 = dout * gelu'(h). nvec as in gelu_forward (all three
// pointers aligned).
extern "C" __global__ void __launch_bounds__(256) gelu_backward(
    act_t* __restrict__ dh, const act_t* __restrict__ dout, const act_t* __restrict__ h, i64 n,
    i64 nvec, float a, float s) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    for (i64 i = tid; i < nvec; i += stride) {
        float d[8], f[8];
        unpack8(ld16(dout + i * 8), d);
        unpack8(ld16(h + i * 8), f);
#pragma unroll
        for (int k = 0; k < 8; k++) f[k] = d[k] * gelu_grad(f[k], a, s);
        st16(dh + i * 8, pack8(f));
    }
    for (i64 i = nvec * 8 + tid; i < n; i += stride)
        dh[i] = f32_to_act(act_to_f32(dout[i]) * gelu_grad(act_to_f32(h[i]), a, s));
}

// dout (N, OUT) bf16 -> partials (gridDim.y, OUT) f32: the column sums of rows
// [blockIdx.y * rows, min(N, (blockIdx.y + 1) * rows)), over the 128 columns of tile blockIdx.x.
// OUT % 8 == 0, dout 16-byte aligned. Block (16, 16).
// The end of a partial column-sum CTA (block (16, 16), 128 columns from tile blockIdx.x): each
// thread's 8 column sums `acc` over its row group, added over the 16 row groups in order into
// partials[blockIdx.y, :].
__device__ __forceinline__ void store_column_partials(
    float* __restrict__ partials, const float acc[8], int OUT) {
    __shared__ float4 part[16][16 * 2 + 1];  // [row group][column float4], padded
    const int tx = threadIdx.x, ty = threadIdx.y;
    part[ty][tx * 2] = float4{acc[0], acc[1], acc[2], acc[3]};
    part[ty][tx * 2 + 1] = float4{acc[4], acc[5], acc[6], acc[7]};
    __syncthreads();
    // 128 threads: one column each, the 16 row groups in order.
    const int t = ty * 16 + tx;
    if (t < 128) {
        const int c = blockIdx.x * 128 + t;
        if (c < OUT) {
            const float* pf = reinterpret_cast<const float*>(&part[0][0]);
            float sum = 0.f;
#pragma unroll
            for (int y = 0; y < 16; y++) sum += pf[y * (16 * 2 + 1) * 4 + t];
            partials[(i64)blockIdx.y * OUT + c] = sum;
        }
    }
}

// dout (N, OUT) bf16 -> partials (gridDim.y, OUT) f32: the column sums of rows
// [blockIdx.y * rows, min(N, (blockIdx.y + 1) * rows)), over the 128 columns of tile blockIdx.x.
// OUT % 8 == 0, dout 16-byte aligned. Block (16, 16).
extern "C" __global__ void __launch_bounds__(256) bias_grad_partial(
    float* __restrict__ partials, const act_t* __restrict__ dout, int N, int OUT, int rows) {
    const int col = (blockIdx.x * 16 + threadIdx.x) * 8;
    const i64 r0 = (i64)blockIdx.y * rows;
    const i64 r1 = r0 + rows < N ? r0 + rows : N;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (col < OUT) {
#pragma unroll 4
        for (i64 r = r0 + threadIdx.y; r < r1; r += 16) {
            float f[8];
            unpack8(ld16(dout + r * OUT + col), f);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += f[k];
        }
    }
    store_column_partials(partials, acc, OUT);
}

// dout, h (N, OUT) bf16 -> dh (N, OUT) bf16 = dout * gelu'(h), and partials (gridDim.y, OUT) f32
// of dh's column sums as bias_grad_partial takes them (of dh as rounded to bf16, so the bias
// gradient is that of the dh written). Same grid, block and conditions as bias_grad_partial,
// all three pointers 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256) gelu_backward_bias_grad_partial(
    act_t* __restrict__ dh, float* __restrict__ partials, const act_t* __restrict__ dout,
    const act_t* __restrict__ h, int N, int OUT, int rows, float a, float s) {
    const int col = (blockIdx.x * 16 + threadIdx.x) * 8;
    const i64 r0 = (i64)blockIdx.y * rows;
    const i64 r1 = r0 + rows < N ? r0 + rows : N;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (col < OUT) {
#pragma unroll 2
        for (i64 r = r0 + threadIdx.y; r < r1; r += 16) {
            const i64 at = r * OUT + col;
            float d[8], f[8];
            unpack8(ld16(dout + at), d);
            unpack8(ld16(h + at), f);
#pragma unroll
            for (int k = 0; k < 8; k++) f[k] = d[k] * gelu_grad(f[k], a, s);
            const uint4 v = pack8(f);
            st16(dh + at, v);
            unpack8(v, f);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += f[k];
        }
    }
    store_column_partials(partials, acc, OUT);
}

// partials (S, OUT) f32 -> db (OUT) bf16, the S slices added in a fixed order. Block (32, 8):
// threadIdx.x picks the column, threadIdx.y sums slices y, y + 8, ... in order, then row 0 of the
// block adds the 8 sums in order. Grid ceil(OUT / 32).
extern "C" __global__ void __launch_bounds__(256) bias_grad_final(
    act_t* __restrict__ db, const float* __restrict__ partials, int S, int OUT) {
    __shared__ float part[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.f;
    if (c < OUT) {
#pragma unroll 4
        for (int k = threadIdx.y; k < S; k += 8) sum += partials[(i64)k * OUT + c];
    }
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < OUT) {
        float total = 0.f;
#pragma unroll
        for (int y = 0; y < 8; y++) total += part[y][threadIdx.x];
        db[c] = f32_to_act(total);
    }
}
