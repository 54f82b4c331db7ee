// swiglu.cu: SwiGLU, the gate of Llama's MLP, on the packed gate/up projection
// `gu (N, 2F)` = [gate | up] per row: forward act = silu(gate) * up, backward dgate, dup into the
// same packed layout (what the backward's GEMMs read). Launchers: model/src/layers/swiglu.rs.
//
// The arithmetic and its rounding are swiglu.cuh's (shared with fp8.cu's SwiGLU quantisers,
// which write FP8 codes of act or dgu in place of these kernels' bf16 under FP8 compute).
//
// Bound: bytes (a handful of flops and one exp a value). Forward reads gu (4NF bytes) and
// writes act (2NF); backward reads dact and gu (6NF) and writes dgu (4NF). One thread does 8
// channels with 16-byte accesses. Launch: grid ceil(N * F / 8 / 256), block 256; F % 8 == 0.
// Measured on the H200 at Llama 3.2 1B's (N, F) = (16384, 8192): forward 234 us (3.4 TB/s),
// backward 392 us (3.4 TB/s), at the rate of a device copy of 256 MB in the same test (3.2 TB/s;
// tests/gpu/llama_layers.rs).

#include "common.cuh"
#include "swiglu.cuh"
static_assert(PRECISION == PRECISION_BF16, "swiglu.cu: bf16 only: its rows are vectors of 8 (unpack8, pack8)");

// gu (N, 2F) bf16 -> act (N, F) bf16.
extern "C" __global__ void __launch_bounds__(256) swiglu_forward(act_t* __restrict__ act,
                                                                const act_t* __restrict__ gu,
                                                                int N, int F) {
    const int nv = F / 8;
    const i64 item = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (i64)N * nv) return;
    const i64 n = item / nv;
    const int j = (int)(item - n * nv) * 8;
    float g[8], u[8], a[8];
    unpack8(ld16(gu + n * 2 * F + j), g);
    unpack8(ld16(gu + n * 2 * F + F + j), u);
    swiglu_act8(g, u, a);
    st16(act + n * F + j, pack8(a));
}

// dact (N, F), gu (N, 2F) bf16 -> dgu (N, 2F) bf16 = [dgate | dup].
extern "C" __global__ void __launch_bounds__(256) swiglu_backward(act_t* __restrict__ dgu,
                                                                 const act_t* __restrict__ dact,
                                                                 const act_t* __restrict__ gu,
                                                                 int N, int F) {
    const int nv = F / 8;
    const i64 item = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (i64)N * nv) return;
    const i64 n = item / nv;
    const int j = (int)(item - n * nv) * 8;
    float d[8], g[8], u[8], dg[8], du[8];
    unpack8(ld16(dact + n * F + j), d);
    unpack8(ld16(gu + n * 2 * F + j), g);
    unpack8(ld16(gu + n * 2 * F + F + j), u);
    swiglu_grad8(d, g, u, dg, du);
    st16(dgu + n * 2 * F + j, pack8(dg));
    st16(dgu + n * 2 * F + F + j, pack8(du));
}
