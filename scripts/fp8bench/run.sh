#!/usr/bin/env bash
# On the GPU machine, from the repository root (after scripts/fp8bench/prepare.sh here, with
# .gpu carried): builds and runs the FP8 kernel benches with the device's nvcc, output under
# $OUT (default gpu-out/):
#   quantisers.txt  each tile quantiser of the working tree beside the baseline's: ms, GB/s of
#                   bf16 read and codes written, and whether every output byte is equal
#   ncu.txt         ncu's speed of light, occupancy and warp states of the largest ones, each
#                   launched once (NO_NCU=1 skips it)
#   gemm-modes.txt  cuBLASLt's FP8 GEMM candidates by scale mode and epilogue
# NVCC_FLAGS go to the quantiser bench's build (e.g. -DFP8_SWIGLU_GRAD_CTAS=3: fp8.cu's launch
# bounds of SwiGLU's backward kernel).
set -euo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
V=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$V/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
nvcc -O3 -arch=sm_90 -std=c++17 ${NVCC_FLAGS:-} -I crates/kernels/cuda -I .gpu/fp8bench \
  -o /tmp/fp8-quantisers scripts/fp8bench/quantisers.cu
/tmp/fp8-quantisers | tee "$OUT/quantisers.txt"
if [[ -z ${NO_NCU:-} ]]; then
  ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section LaunchStats /tmp/fp8-quantisers ncu > "$OUT/ncu.txt" 2>&1 || true
fi
nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/fp8-gemm-modes scripts/fp8bench/gemm_modes.cu -lcublasLt
/tmp/fp8-gemm-modes | tee "$OUT/gemm-modes.txt"
