#!/usr/bin/env bash
# Builds the CUDA flavour on a machine without a GPU and packs what the GPU machine runs into
# .gpu/ (git-ignored): the trainer and the GPU test binary, stripped and gzipped.
# Run from the repository root: scripts/gpu-build.sh   (first build 10-15 minutes)
# Then on the GPU machine: scripts/gpu-test.sh (README, "GPU").
set -euo pipefail
eval "$(scripts/cuda-toolchain.sh)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
# The attention runs on cuDNN (crates/model/src/cudnn/), so the binaries link libcudnn.so.9;
# the GPU machine has it in PyTorch's wheel. To link here without it, a stub of the cuDNN entry
# points that cudarc binds stands in, as the toolchain's stub does for the driver.
stub=$CARGO_TARGET_DIR/cudnn-stub
if [[ ! -f $stub/libcudnn.so ]]; then
  cargo fetch --locked  # unpacks cudarc's sources on a fresh machine
  v=$(grep -A1 '^name = "cudarc"' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
  sys=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$v" | head -1)/src/cudnn/sys/mod.rs
  mkdir -p "$stub"
  grep -oE 'pub unsafe fn cudnn[A-Za-z0-9_]+' "$sys" | awk '{print "void " $NF "(void){}"}' | sort -u > "$stub/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcudnn.so.9 -o "$stub/libcudnn.so" "$stub/stub.c"
fi
export LIBRARY_PATH=$stub:$LIBRARY_PATH
cargo build --release --features cuda -p trainer
# Every kernel source through NVRTC as the loader compiles it, so that a compile error shows
# here and not on the device (no GPU needed: the driver stub stands in for libcuda.so.1).
driver=$(realpath -m "$CARGO_TARGET_DIR/driver-stub")  # absolute: the test runs in its crate
mkdir -p "$driver"
ln -sf "$CUDA_ROOT/lib/libcuda.so" "$driver/libcuda.so.1"
LD_LIBRARY_PATH=$driver:$CUDA_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  cargo test --release --features cuda -p kernels nvrtc
# cargo prints the test binary's path relative or absolute as CARGO_TARGET_DIR is given.
tests=$(cargo test --release --features cuda -p trainer --test gpu --no-run 2>&1 |
        grep -o "[^ (]*/release/deps/gpu-[0-9a-f]*" | tail -1)
[[ -x $tests ]] || { echo "no GPU test binary found" >&2; exit 1; }
mkdir -p .gpu
strip -o .gpu/trainer "$CARGO_TARGET_DIR/release/trainer"
strip -o .gpu/gpu-tests "$tests"
gzip -6 -f .gpu/trainer .gpu/gpu-tests
ls -l .gpu
