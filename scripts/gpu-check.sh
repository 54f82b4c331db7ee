#!/usr/bin/env bash
# GPU checks, run on the H200 machine from the repository root with the CUDA build in
# .gpu/trainer.gz (README, "GPU"). Writes each run's metrics under $OUT (default gpu-out/) and
# prints the figures the checks compare: the same runs on CPU fp32 and on GPU bf16.
set -euo pipefail
OUT=${OUT:-gpu-out}
STEPS=${STEPS:-200}
V=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$V/nvidia/cu13/lib:$V/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
[[ -x .gpu/trainer ]] || gunzip -kf .gpu/trainer.gz
T=.gpu/trainer
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

base=(--config configs/tiny.toml --set log.progress=false --set checkpoint.resume=false
      --set "train.steps=$STEPS" --set log.interval=10 --set log.eval_interval=50)
gpu=(--set 'train.device="cuda"' --set 'train.precision="bf16"')
zeropp=(--set dist.world_size=8 --set dist.gpus_per_node=4 --set train.micro_batch=2
        --set zero.quantized_weights=true --set zero.hpz_partition_size=4 --set zero.quantized_gradients=true)

run() { # name, args...
  local name=$1; shift
  local start=$SECONDS
  "$T" "$@" --set "log.dir=\"$OUT/$name\"" > "$OUT/$name.log" 2>&1 || { echo "$name FAILED"; tail -5 "$OUT/$name.log"; return 1; }
  echo "$name: $((SECONDS - start)) s; $(grep -o '"val_loss":[0-9.]*' "$OUT/$name/metrics.jsonl" | tr '\n' ' ')"
}
mkdir -p "$OUT"
run tiny-cpu-fp32 "${base[@]}"
run tiny-gpu-bf16 "${base[@]}" "${gpu[@]}"
run zeropp-w8-cpu-fp32 "${base[@]}" "${zeropp[@]}"
run zeropp-w8-gpu-bf16 "${base[@]}" "${zeropp[@]}" "${gpu[@]}"
