#!/usr/bin/env bash
# Builds the CUDA flavour on a machine without a GPU and packs what the GPU machine runs into
# .gpu/ (git-ignored): the trainer and the GPU test binary, stripped and gzipped.
# Run from the repository root: scripts/gpu-build.sh   (first build 10-15 minutes)
# Then on the GPU machine: scripts/gpu-test.sh (README, "GPU").
set -euo pipefail
eval "$(../shared/tools/cuda-toolchain.sh)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
cargo build --release --features cuda -p trainer
tests=$(cargo test --release --features cuda -p trainer --test gpu --no-run 2>&1 |
        grep -o "$CARGO_TARGET_DIR/release/deps/gpu-[0-9a-f]*" | tail -1)
[[ -x $tests ]] || { echo "no GPU test binary found" >&2; exit 1; }
mkdir -p .gpu
strip -o .gpu/trainer "$CARGO_TARGET_DIR/release/trainer"
strip -o .gpu/gpu-tests "$tests"
gzip -6 -f .gpu/trainer .gpu/gpu-tests
ls -l .gpu
