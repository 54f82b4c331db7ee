#!/usr/bin/env bash
# Installs a CUDA 13.0 build toolchain (nvcc, headers, cuBLAS, cuRAND, NVRTC, NCCL) from PyPI wheels
# into DIR (default ~/.cache/cuda-13.0) on a machine with no GPU and no driver, and makes a link-time
# stub of libcuda.so, so that `cargo build --features cuda` (candle's cuda + nccl features) links here.
# The binary it builds loads the real driver and libraries at run time on the GPU machine.
# Usage: eval "$(scripts/cuda-toolchain.sh [DIR])"  (scripts/gpu-build.sh does)   -> exports CUDA_ROOT, PATH, LIBRARY_PATH, CUDA_COMPUTE_CAP
# Pins match the GPU machine (driver 580 = CUDA 13.0): a newer nvcc/nvvm emits PTX that driver cannot load.
set -euo pipefail
DIR=${1:-$HOME/.cache/cuda-13.0}
ROOT=$DIR/root
if [[ ! -x $ROOT/bin/nvcc || ! -f $ROOT/lib/libcuda.so ]]; then
  mkdir -p "$DIR" >&2
  [[ -x $DIR/venv/bin/pip ]] || python3 -m venv "$DIR/venv" >&2
  "$DIR/venv/bin/pip" install -q --disable-pip-version-check \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 \
    nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 \
    nvidia-nccl-cu13==2.28.9 >&2
  N=$(ls -d "$DIR"/venv/lib/python3*/site-packages/nvidia)
  rm -rf "$ROOT"; mkdir -p "$ROOT/lib" "$ROOT/stub"
  ln -s "$N/cu13/bin" "$ROOT/bin"; ln -s "$N/cu13/include" "$ROOT/include"; ln -s "$N/cu13/nvvm" "$ROOT/nvvm"
  ln -s "$N/nccl/include/nccl.h" "$N/cu13/include/nccl.h" 2>/dev/null || true
  for f in "$N"/cu13/lib/*.so.* "$N"/nccl/lib/*.so.*; do
    b=$(basename "$f"); ln -sf "$f" "$ROOT/lib/$b"; ln -sf "$f" "$ROOT/lib/${b%%.so*}.so"
  done
  # link-time stub of the driver API: every cu* entry point named in cuda.h (versioned names included)
  { grep -oE '\b(CUresult|CUresult CUDAAPI) +cu[A-Za-z0-9_]+' "$ROOT/include/cuda.h" | awk '{print $NF}'
    grep -oE '#define +cu[A-Za-z0-9_]+ +cu[A-Za-z0-9_]+' "$ROOT/include/cuda.h" | awk '{print $3}'
  } | sort -u | awk '{print "void " $1 "(void){}"}' > "$ROOT/stub/libcuda.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$ROOT/lib/libcuda.so" "$ROOT/stub/libcuda.c" >&2
fi
echo "export CUDA_ROOT=$ROOT PATH=$ROOT/bin:\$PATH LIBRARY_PATH=$ROOT/lib\${LIBRARY_PATH:+:\$LIBRARY_PATH} CUDA_COMPUTE_CAP=90"
