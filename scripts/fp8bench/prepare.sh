#!/usr/bin/env bash
# Before a device call (on the build machine, from the repository root):
#   scripts/fp8bench/prepare.sh [REV]   (default HEAD)
# writes .gpu/fp8bench/ (git-ignored, carried with .gpu): REV's fp8.cu and swiglu.cuh with
# every fp8_ / Fp8 / swiglu name prefixed old_, the baseline that scripts/fp8bench/run.sh
# compares the working tree's quantisers against, byte for byte.
set -euo pipefail
rev=${1:-HEAD}
out=.gpu/fp8bench
mkdir -p "$out"
git show "$rev:crates/kernels/cuda/swiglu.cuh" |
  sed -E 's/\bsigmoid_f\b/old_sigmoid_f/g; s/\bswiglu_(act8|grad8|dup|dgate)\b/old_swiglu_\1/g' > "$out/swiglu_old.cuh"
git show "$rev:crates/kernels/cuda/fp8.cu" |
  sed -E 's/\bfp8_/old_fp8_/g; s/\bFp8/OldFp8/g; s/\bswiglu_(act8|grad8|dup|dgate|act_load)\b/old_swiglu_\1/g;
          s/#include "swiglu\.cuh"/#include "swiglu_old.cuh"/' > "$out/fp8_old.cu"
echo "baseline $(git rev-parse --short "$rev") in $out"
