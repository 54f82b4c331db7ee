// cuBLASLt's FP8 GEMMs by scale mode on the GPU: every heuristic candidate timed (CUDA events,
// 10 runs after 3) at gpt350m's weight-gradient shapes (K = 16,384 tokens) in 128 x 1 blocks
// (VEC128), row-wise (OUTER_VEC) and with one operand in 128 x 128 tiles (BLK128x128, either
// side and either order), Llama 3.2 1B's forward and input-gradient GEMMs, and the forward
// with the BIAS epilogue, with and without
// C. A candidate count of 0 with a status is cuBLASLt refusing the combination. Change the
// shapes in main for other models. scripts/fp8bench/run.sh builds and runs it.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_fp8.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.cuh"
#define LK(x)                                                                      \
    do {                                                                           \
        cublasStatus_t s = (x);                                                    \
        if (s != CUBLAS_STATUS_SUCCESS) {                                          \
            printf("cuBLASLt status %d at %s:%d\n", (int)s, __FILE__, __LINE__);   \
            return;                                                                \
        }                                                                          \
    } while (0)

__global__ void fill_codes(unsigned char* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        // an e4m3 code of magnitude about 1..200, random sign (no NaN: 0x7f / 0xff avoided)
        unsigned char c = (unsigned char)(0x30 + (h % 0x40));
        p[i] = c | ((h >> 8) & 0x80);
    }
}
__global__ void fill_f32(float* p, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

static void* ws;
static const size_t WS = 32 << 20;
static cublasLtHandle_t lt;

// D (m, n) bf16 = A^T B, A (k, m) col-major = (m, k) row-major K-contiguous, B likewise.
static void probe(const char* name, int m, int n, int k, int amode, int bmode, int epi = 0, bool with_c = false) {
    unsigned char *a, *b;
    void* d;
    float *sa, *sb;
    CK(cudaMalloc(&a, (size_t)m * k));
    CK(cudaMalloc(&b, (size_t)n * k));
    CK(cudaMalloc(&d, (size_t)m * n * 2));
    size_t nsa = (size_t)m * ((k + 127) / 128) + 4096, nsb = (size_t)n * ((k + 127) / 128) + 4096;
    CK(cudaMalloc(&sa, nsa * 4));
    CK(cudaMalloc(&sb, nsb * 4));
    fill_codes<<<1024, 256>>>(a, (size_t)m * k, 1);
    fill_codes<<<1024, 256>>>(b, (size_t)n * k, 2);
    fill_f32<<<256, 256>>>(sa, nsa, 0.01f);
    fill_f32<<<256, 256>>>(sb, nsb, 0.02f);
    CK(cudaDeviceSynchronize());

    cublasLtMatmulDesc_t desc;
    LK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof amode));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof bmode));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    void* bias = nullptr;
    void* cbuf = nullptr;
    if (epi) {
        cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
        CK(cudaMalloc(&bias, (size_t)m * 2));
        CK(cudaMemset(bias, 0, (size_t)m * 2));
        cudaDataType_t bt = CUDA_R_16BF;
        LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
        LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (with_c) {
        CK(cudaMalloc(&cbuf, (size_t)m * n * 2));
        CK(cudaMemset(cbuf, 0, (size_t)m * n * 2));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k));
    LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k));
    LK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m));
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS, sizeof WS));
    cublasLtMatmulHeuristicResult_t res[32];
    int got = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 32, res, &got);
    printf("%-28s m %5d n %5d k %5d modes %d/%d: status %d, %d candidates\n", name, m, n, k, amode, bmode, (int)st, got);
    float alpha = 1, beta = with_c ? 1.f : 0.f;
    void* cptr = with_c ? cbuf : d;
    double flops = 2.0 * m * n * k;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < got; ++i) {
        auto run = [&] {
            return cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, cptr, ld, d, ld, &res[i].algo, ws, WS, 0);
        };
        if (run() != CUBLAS_STATUS_SUCCESS) {
            printf("  algo %2d: failed\n", i);
            continue;
        }
        for (int w = 0; w < 3; ++w) run();
        CK(cudaEventRecord(e0));
        const int reps = 10;
        for (int r = 0; r < reps; ++r) run();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        int tile = 0, stages = 0, splitk = 0, swizzle = 0, id = 0;
        size_t sz;
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle, &sz);
        printf("  algo %2d: %.3f ms %6.0f TFLOP/s (id %d tile %d stages %d splitk %d swizzle %d ws %zu)\n", i, ms,
               flops / ms / 1e9, id, tile, stages, splitk, swizzle, res[i].workspaceSize);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    cudaFree(sa);
    cudaFree(sb);
    if (bias) cudaFree(bias);
    if (cbuf) cudaFree(cbuf);
}

int main() {
    CK(cudaMalloc(&ws, WS));
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
    const int N = 16384;  // tokens: 8 sequences of 2048, or 16 of 1024
    const int SCALAR = 0, OUTER = 3, VEC128 = 4, BLK = 5;
    struct S {
        const char* name;
        int out, in;
    } shapes[] = {{"1B q|k|v", 3072, 2048},     {"1B o", 2048, 2048},
                  {"1B gate|up", 16384, 2048},  {"1B down", 2048, 8192},
                  {"gpt350m c_attn", 3072, 1024}, {"gpt350m attn.c_proj", 1024, 1024},
                  {"gpt350m c_fc", 4096, 1024},   {"gpt350m c_proj", 1024, 4096}};
    // The weight gradient dw^T (OUT, IN) = dout^T (OUT, N) x^T (IN, N): K = the tokens.
    struct M {
        const char* name;
        int a, b;
    } modes[] = {{"VEC128 x VEC128", VEC128, VEC128}, {"OUTER x OUTER", OUTER, OUTER},
                 {"VEC128 x BLK", VEC128, BLK},       {"BLK x VEC128", BLK, VEC128},
                 {"SCALAR x SCALAR", SCALAR, SCALAR}};
    for (auto s : shapes)
        for (auto m : modes) {
            char nm[96];
            snprintf(nm, sizeof nm, "%s wgrad %s", s.name, m.name);
            probe(nm, s.out, s.in, N, m.a, m.b);
        }
    // The weight gradient the other way round, dw (IN, OUT) = x^T (IN, N) dout^T (OUT, N): the
    // activation's 128 x 128 tiles as A, the gradient's 128 x 1 blocks as B.
    for (auto s : shapes) {
        char nm[96];
        snprintf(nm, sizeof nm, "%s wgrad^T BLK x VEC128", s.name);
        probe(nm, s.in, s.out, N, BLK, VEC128);
    }
    // Llama 3.2 1B's forward and input-gradient GEMMs (weight tiles x activation 1 x 128), every
    // candidate: (m, n, k) = (OUT, N, IN) forward, (IN, N, OUT) input gradient.
    for (int i = 0; i < 4; ++i) {
        char nm[96];
        snprintf(nm, sizeof nm, "%s fwd BLK x VEC128", shapes[i].name);
        probe(nm, shapes[i].out, N, shapes[i].in, BLK, VEC128);
        snprintf(nm, sizeof nm, "%s dgrad BLK x VEC128", shapes[i].name);
        probe(nm, shapes[i].in, N, shapes[i].out, BLK, VEC128);
    }
    // The forward (weight tiles x activation 1 x 128) with cuBLASLt's BIAS epilogue, with and
    // without C (a residual): gpt350m's c_attn (3072 x N, k 1024) and c_proj (1024 x N, k 4096).
    probe("c_attn fwd BLK x VEC128", 3072, N, 1024, BLK, VEC128, 0, false);
    probe("c_attn fwd BLK x VEC128 BIAS", 3072, N, 1024, BLK, VEC128, 1, false);
    probe("c_proj fwd BLK x VEC128 +C", 1024, N, 4096, BLK, VEC128, 0, true);
    probe("c_proj fwd BLK x VEC128 BIAS +C", 1024, N, 4096, BLK, VEC128, 1, true);
    return 0;
}
