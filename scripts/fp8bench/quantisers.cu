// The FP8 tile quantisers of the working tree (crates/kernels/cuda/fp8.cu) against those of a
// baseline revision, on the GPU: every output byte compared, each kernel timed (CUDA events,
// 20 launches after 3) at Llama 3.2 1B's and gpt350m's shapes, 16,384 rows, and on edges.
// `quantisers ncu` launches each profiled kernel once, for `ncu`. scripts/fp8bench/run.sh
// builds and runs it; scripts/fp8bench/prepare.sh writes the baseline's copy
// (.gpu/fp8bench/fp8_old.cu, its names prefixed old_) before the device call. Both sides are
// launched with the kernels' signatures and grids as of 83a8c90 (2026-12-06, thirteenth
// session: fp8_quantize_act with col_reduce, col_given and col_tiles, fp8_quantize_swiglu with
// act's absmax, fp8_quantize_swiglu_grad with act^T's outputs): a baseline from before then,
// or a kernel whose signature changes, needs its launch here changed with it. The whole-column
// modes (col_reduce, col_given, act^T) are timed alone on the lines that start "  +",
// "  rows + absmax" and "act whole"; the tiles of x^T (col_tiles) side by side on the lines
// that end "+tiles".
#include "fp8.cu"
#include "fp8_old.cu"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.cuh"


static unsigned long long rng = 88172645463325252ull;
static double urand() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (rng >> 11) * (1.0 / 9007199254740992.0);
}
static u16 to_bf16(float f) {
    u32 u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (u16)(u >> 16);
}

// Random bf16 (rows, cols) with magnitudes spread over rows and columns, a few specials.
static bf16* make(int rows, int cols, bool specials) {
    std::vector<u16> h((size_t)rows * cols);
    for (size_t i = 0; i < h.size(); ++i) {
        int r = i / cols, c = i % cols;
        double g = (urand() - 0.5) * 3.4;
        double mag = ldexp(1.0, ((r / 128) % 7) - 3 + ((c / 128) % 5));
        h[i] = to_bf16((float)(g * mag));
    }
    if (specials) {
        h[5] = 0x7f80;                          // inf
        h[(size_t)300 * cols + 700 % cols] = 0x7fc1;  // NaN
        for (int c = 0; c < 128 && c < cols; ++c) h[(size_t)129 * cols + c + 128] = 0;  // zero row block
    }
    bf16* d;
    CK(cudaMalloc(&d, h.size() * 2));
    CK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    return d;
}

struct Out {
    u8 *codes, *codes_t;
    float *scales, *scales_t;
    size_t n, ns, nst;
    Out(int rows, int cols) {
        n = (size_t)rows * cols;
        ns = (size_t)((cols + 127) / 128) * rows;
        nst = (size_t)((rows + 127) / 128) * cols;
        CK(cudaMalloc(&codes, n));
        CK(cudaMalloc(&codes_t, n));
        CK(cudaMalloc(&scales, ns * 4));
        CK(cudaMalloc(&scales_t, nst * 4));
        CK(cudaMemset(codes, 0xAB, n));
        CK(cudaMemset(codes_t, 0xAB, n));
        CK(cudaMemset(scales, 0xAB, ns * 4));
        CK(cudaMemset(scales_t, 0xAB, nst * 4));
    }
};

static bool same(const char* what, const void* a, const void* b, size_t bytes) {
    std::vector<u8> x(bytes), y(bytes);
    CK(cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), b, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < bytes; ++i)
        if (x[i] != y[i]) {
            printf("  MISMATCH %s at byte %zu: %02x vs %02x\n", what, i, x[i], y[i]);
            return false;
        }
    return true;
}

static bool compare(const Out& a, const Out& b, bool rows, bool cols) {
    bool ok = true;
    if (rows) ok &= same("codes", a.codes, b.codes, a.n) & same("scales", a.scales, b.scales, a.ns * 4);
    if (cols)
        ok &= same("codes_t", a.codes_t, b.codes_t, a.n) & same("scales_t", a.scales_t, b.scales_t, a.nst * 4);
    return ok;
}

static bool profiling = false;  // argv[1] == "ncu": each kernel once, no timing

template <class F>
static float time_ms(F f) {
    if (profiling) {
        f();
        CK(cudaDeviceSynchronize());
        return 1.0f;
    }
    for (int i = 0; i < 3; ++i) f();
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    const int reps = 20;
    for (int i = 0; i < reps; ++i) f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaGetLastError());
    return ms / reps;
}

static void report(const char* name, double bytes, float old_ms, float new_ms, bool ok) {
    printf("%-34s old %7.3f ms %6.0f GB/s | new %7.3f ms %6.0f GB/s | %.2fx %s\n", name, old_ms,
           bytes / old_ms / 1e6, new_ms, bytes / new_ms / 1e6, old_ms / new_ms,
           ok ? "bitwise equal" : "DIFFERENT");
}

// A bench's name, formatted (one at a time: the buffer is reused).
static const char* label(const char* fmt, int a, int b) {
    static char name[96];
    snprintf(name, sizeof name, fmt, a, b);
    return name;
}

// Times the baseline's launch and the working tree's, compares their outputs (the orientations
// asked) and prints one line.
template <class Old, class New>
static void side_by_side(const char* name, double bytes, Old run_old, New run_new, const Out& o,
                         const Out& n, bool rows_b = true, bool cols_b = true) {
    const float t0 = time_ms(run_old), t1 = time_ms(run_new);
    report(name, bytes, t0, t1, compare(o, n, rows_b, cols_b));
}

// Times one launch sequence of the working tree's alone (no baseline) and prints one line.
template <class F>
static void time_alone(const char* name, double bytes, F f) {
    const float t = time_ms(f);
    printf("%-34s                           | new %7.3f ms %6.0f GB/s\n", name, t, bytes / t / 1e6);
}

static void act(int rows, int cols, bool rows_b, bool cols_b, bool tiles = false) {
    bf16* x = make(rows, cols, true);
    Out o(rows, cols), n(rows, cols);
    dim3 grid((cols + 127) / 128, (rows + 127) / 128);
    auto run_old = [&] {
        old_fp8_quantize_act<<<grid, 256>>>(x, cols, rows_b ? o.codes : nullptr, o.scales,
                                             cols_b ? o.codes_t : nullptr, o.scales_t, rows, cols,
                                             nullptr, nullptr, nullptr, tiles);
    };
    auto run_new = [&] {
        fp8_quantize_act<<<grid, 256>>>(x, cols, rows_b ? n.codes : nullptr, n.scales,
                                         cols_b ? n.codes_t : nullptr, n.scales_t, rows, cols,
                                         nullptr, nullptr, nullptr, tiles);
    };
    char name[96];
    snprintf(name, sizeof name, "act (%d, %d) %s%s", rows, cols, rows_b ? "rows" : "",
             cols_b ? (tiles ? "+tiles" : "+cols") : "");
    side_by_side(name, (double)rows * cols * (2 + rows_b + cols_b), run_old, run_new, o, n, rows_b,
                 cols_b);
    CK(cudaFree(x));
}

static void swiglu_grad(int rows, int F) {
    bf16* dact = make(rows, F, true);
    bf16* gu = make(rows, 2 * F, false);
    Out o(rows, 2 * F), n(rows, 2 * F);
    auto run_old = [&] {
        old_fp8_quantize_swiglu_grad<<<dim3(2 * F / 128, rows / 128), 256>>>(
            dact, gu, o.codes, o.scales, o.codes_t, o.scales_t, rows, F, nullptr, nullptr,
            nullptr);
    };
    auto run_new = [&] {
        fp8_quantize_swiglu_grad<<<dim3(2 * F / 128, rows / 128), 256>>>(
            dact, gu, n.codes, n.scales, n.codes_t, n.scales_t, rows, F, nullptr, nullptr,
            nullptr);
    };
    side_by_side(label("swiglu_grad (%d, F %d)", rows, F), (double)rows * F * (6 + 4), run_old, run_new, o, n);
    // The working tree's with act^T's codes in whole columns (down's weight gradient operand).
    u32* absmax;
    u8* act_t;
    float* act_s;
    CK(cudaMalloc(&absmax, F * 4));
    CK(cudaMemset(absmax, 0, F * 4));
    CK(cudaMalloc(&act_t, (size_t)rows * F));
    CK(cudaMalloc(&act_s, F * 4));
    fp8_quantize_swiglu<<<dim3(F / 128, rows / 128), 256>>>(gu, nullptr, nullptr, nullptr, nullptr,
                                                            rows, F, absmax);
    time_alone(label("  + act^T whole columns (%d, F %d)", rows, F), (double)rows * F * (6 + 5), [&] {
        fp8_quantize_swiglu_grad<<<dim3(2 * F / 128, rows / 128), 256>>>(
            dact, gu, n.codes, n.scales, n.codes_t, n.scales_t, rows, F, absmax, act_t, act_s);
    });
    CK(cudaFree(absmax)); CK(cudaFree(act_t)); CK(cudaFree(act_s));
}

static void swiglu(int rows, int F) {
    bf16* gu = make(rows, 2 * F, true);
    Out o(rows, F), n(rows, F);
    dim3 grid(F / 128, rows / 128);
    auto run_old = [&] {
        old_fp8_quantize_swiglu<<<grid, 256>>>(gu, o.codes, o.scales, o.codes_t, o.scales_t, rows, F,
                                               nullptr);
    };
    auto run_new = [&] {
        fp8_quantize_swiglu<<<grid, 256>>>(gu, n.codes, n.scales, n.codes_t, n.scales_t, rows, F,
                                           nullptr);
    };
    side_by_side(label("swiglu (%d, F %d)", rows, F), (double)rows * F * (4 + 2), run_old, run_new, o, n);
    // The working tree's forward as the FP8 Llama block runs it: the row blocks and act's
    // columns' absmax (no act^T codes).
    u32* absmax;
    CK(cudaMalloc(&absmax, F * 4));
    time_alone(label("  rows + absmax (%d, F %d)", rows, F), (double)rows * F * (4 + 1), [&] {
        CK(cudaMemsetAsync(absmax, 0, F * 4));
        fp8_quantize_swiglu<<<grid, 256>>>(gu, n.codes, n.scales, nullptr, nullptr, rows, F, absmax);
    });
    CK(cudaFree(absmax));
}

// down's dout with whole columns: the absmax pass, then the row blocks and x^T's codes.
static void act_whole(int rows, int cols) {
    bf16* x = make(rows, cols, true);
    Out n(rows, cols);
    u32* absmax;
    CK(cudaMalloc(&absmax, cols * 4));
    dim3 grid((cols + 127) / 128, (rows + 127) / 128);
    time_alone(label("act whole columns (%d, %d)", rows, cols), (double)rows * cols * (2 + 2 + 2), [&] {
        CK(cudaMemsetAsync(absmax, 0, cols * 4));
        fp8_quantize_act<<<grid, 256>>>(x, cols, nullptr, nullptr, nullptr, nullptr, rows, cols,
                                         nullptr, absmax, nullptr, 0);
        fp8_quantize_act<<<grid, 256>>>(x, cols, n.codes, n.scales, n.codes_t, n.scales_t, rows,
                                         cols, nullptr, nullptr, absmax, 0);
    });
    CK(cudaFree(absmax));
    CK(cudaFree(x));
}

static void rmsnorm(int rows, int cols) {
    bf16* h = make(rows, cols, false);
    bf16* w = make(1, cols, false);
    std::vector<float> rs(rows);
    for (auto& r : rs) r = 0.5f + (float)urand();
    float* rstd;
    CK(cudaMalloc(&rstd, rows * 4));
    CK(cudaMemcpy(rstd, rs.data(), rows * 4, cudaMemcpyHostToDevice));
    Out o(rows, cols), n(rows, cols);
    dim3 grid(cols / 128, rows / 128);
    auto run_old = [&] {
        old_fp8_quantize_rmsnorm<<<grid, 256>>>(h, rstd, w, o.codes, o.scales, o.codes_t, o.scales_t, rows, cols);
    };
    auto run_new = [&] {
        fp8_quantize_rmsnorm<<<grid, 256>>>(h, rstd, w, n.codes, n.scales, n.codes_t, n.scales_t, rows, cols);
    };
    side_by_side(label("rmsnorm (%d, %d)", rows, cols), (double)rows * cols * 4, run_old, run_new, o, n);
}

// One weight (rows = IN, cols = OUT) through fp8_quantize_tiles, both orientations.
static void tiles(int rows, int cols) {
    bf16* w = make(rows, cols, true);
    const int nib = (rows + 127) / 128, nob = (cols + 127) / 128;
    const int ld_fwd = (nib + 3) / 4 * 4, ld_bwd = (nob + 3) / 4 * 4;
    size_t n = (size_t)rows * cols;
    u8 *c0, *t0, *c1, *t1;
    float *f0, *b0, *f1, *b1;
    CK(cudaMalloc(&c0, n)); CK(cudaMalloc(&t0, n)); CK(cudaMalloc(&c1, n)); CK(cudaMalloc(&t1, n));
    size_t nf = (size_t)nob * ld_fwd, nb = (size_t)nib * ld_bwd;
    CK(cudaMalloc(&f0, nf * 4)); CK(cudaMalloc(&b0, nb * 4)); CK(cudaMalloc(&f1, nf * 4)); CK(cudaMalloc(&b1, nb * 4));
    CK(cudaMemset(c0, 0xAB, n)); CK(cudaMemset(c1, 0xAB, n)); CK(cudaMemset(t0, 0xAB, n)); CK(cudaMemset(t1, 0xAB, n));
    OldFp8TileBatch ob = {};
    Fp8TileBatch nbt = {};
    ob.w[0] = w; ob.codes[0] = c0; ob.codes_t[0] = t0; ob.scales_fwd[0] = f0; ob.scales_bwd[0] = b0;
    ob.ldw[0] = cols; ob.cols[0] = cols; ob.ld_bwd[0] = ld_bwd; ob.first_ob[0] = 0; ob.count = 1;
    nbt.w[0] = w; nbt.codes[0] = c1; nbt.codes_t[0] = t1; nbt.scales_fwd[0] = f1; nbt.scales_bwd[0] = b1;
    nbt.ldw[0] = cols; nbt.cols[0] = cols; nbt.ld_bwd[0] = ld_bwd; nbt.first_ob[0] = 0; nbt.count = 1;
    dim3 grid(nob, nib);
    auto run_old = [&] { old_fp8_quantize_tiles<<<grid, 256>>>(ob, rows, ld_fwd); };
    auto run_new = [&] { fp8_quantize_tiles<<<grid, 256>>>(nbt, rows, ld_fwd); };
    float a = time_ms(run_old), b = time_ms(run_new);
    bool ok = same("codes", c0, c1, n) & same("codes_t", t0, t1, n) & same("scales_fwd", f0, f1, nf * 4) &
              same("scales_bwd", b0, b1, nb * 4);
    report(label("tiles (%d, %d) both", rows, cols), (double)n * 4, a, b, ok);
}

int main(int argc, char** argv) {
    const int n = 16384;
    if (argc > 1 && strcmp(argv[1], "ncu") == 0) {
        profiling = true;
        act(n, 8192, true, true);
        swiglu_grad(n, 8192);
        tiles(8192, 2048);
        return 0;
    }
    act(n, 2048, true, true);
    act(n, 2048, true, true, true);
    act(n, 3072, true, true);
    act(n, 8192, true, true);
    act(n, 2048, true, false);
    act(n, 2048, false, true);
    act(n, 1024, true, true);
    act(n, 4096, true, true);
    act(1000, 264, true, true);  // edges: rows and columns not multiples of 128
    act(1000, 264, true, true, true);
    act_whole(n, 2048);
    swiglu_grad(n, 8192);
    swiglu_grad(2048, 1024);
    swiglu(n, 8192);
    rmsnorm(n, 2048);
    tiles(2048, 16384);
    tiles(8192, 2048);
    tiles(2048, 3072);
    tiles(1000, 300);  // not a multiple of 8: element by element
    return 0;
}
