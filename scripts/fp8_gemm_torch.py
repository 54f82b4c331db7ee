"""PyTorch's GEMMs at Llama 3.2 1B's projection shapes (8 x 2048 tokens): bf16, and FP8 E4M3
through torch._scaled_mm with row-wise scales (torchao's float8 recipe) and, where this torch
takes them, 1 x 128 / 128 x 128 block scales (cuBLASLt's VEC128 / BLK128x128, our recipe). The
anchor of tests/gpu/fp8.rs's `fp8_gemms_at_llama_1b_shapes_beside_bf16`: run both in the same
device call (scripts/gpu-test.sh fp8). GEMMs only, no casts: y = x @ w, x (M, K), w (K, N).

    python3 scripts/fp8_gemm_torch.py
"""

import torch

M = 8 * 2048
SHAPES = [("qkv", 2048, 3072), ("o", 2048, 2048), ("gate|up", 2048, 16384), ("down", 8192, 2048)]
E4M3 = torch.float8_e4m3fn


def seconds(f, runs=20):
    f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        f()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / runs


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'proj':<8} {'bf16':>16} {'fp8 row-wise':>16} {'fp8 1x128/128x128':>20}")
    for name, k, n in SHAPES:
        x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02  # (N, K): w^T
        flops = 2 * M * k * n
        t_bf16 = seconds(lambda: x @ w.t())
        xq, wq = x.to(E4M3), w.to(E4M3)
        # Row-wise: a (M, K) row-major with (M, 1) scales, b (K, N) column-major with (1, N).
        sa = torch.ones(M, 1, device="cuda", dtype=torch.float32)
        sb = torch.ones(1, n, device="cuda", dtype=torch.float32)
        t_row = seconds(lambda: torch._scaled_mm(xq, wq.t(), sa, sb, out_dtype=torch.bfloat16))
        # Block-wise: a's scales (M, K/128) outer-dim-major, b's (K/128, N/128) as ScaledBlas.cpp
        # checks them (is_blockwise_1x128_scaling, is_blockwise_128x128_scaling on b^T).
        try:
            sa_b = torch.ones(k // 128, M, device="cuda", dtype=torch.float32).t()
            sb_b = torch.ones(n // 128, k // 128, device="cuda", dtype=torch.float32).t()
            t_blk = seconds(
                lambda: torch._scaled_mm(xq, wq.t(), sa_b, sb_b, out_dtype=torch.bfloat16)
            )
            blk = f"{t_blk * 1e3:7.3f} ms {flops / t_blk / 1e12:5.0f} TF"
        except Exception as e:  # noqa: BLE001 - any refusal: report it in one line
            blk = f"not taken ({str(e).splitlines()[0][:60]})"
        print(
            f"{name:<8} {t_bf16 * 1e3:7.3f} ms {flops / t_bf16 / 1e12:5.0f} TF"
            f" {t_row * 1e3:7.3f} ms {flops / t_row / 1e12:5.0f} TF  {blk}"
        )


if __name__ == "__main__":
    main()
