#!/usr/bin/env bash
# Multi-GPU checks and measurements on one host with 2 or more GPUs (issue 7), from the
# repository root with what scripts/gpu-build.sh packed into .gpu/. One process per GPU under
# torchrun (--no-python), the nccl backend, the GPUs as simulated nodes of GPN GPUs each
# (default 1, so every byte between GPUs counts as inter-node; GPN=4 on 8 GPUs gives the 2 x 4 of
# the issue, with hpZ over each simulated node). Stages (default parity bench comm):
#   parity   tiny, 200 steps, ZeRO-3 and ZeRO++ over NCCL vs the local backend on one GPU
#   parity350 gpt350m, 200 steps on the bundled corpus, ZeRO-3 and ZeRO++ over NCCL vs local
#   bench    gpt350m, ZeRO-3 vs ZeRO++, 1K and 2K tokens per GPU, NCCL's fast path and its
#            socket transport (P2P and shared memory off: the low-bandwidth regime)
#   large    gpt6.7b (the largest that fits two H200s), ZeRO-3 vs ZeRO++, 2K tokens per GPU
#   comm     all-gather, reduce-scatter, all-to-all bus bandwidth through our communicator
# Logs under $OUT (default gpu-out/).
set -euo pipefail
OUT=${OUT:-gpu-out}
STAGES=${*:-parity bench comm}
V=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$V/nvidia/cu13/lib:$V/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for b in trainer gpu-tests; do [[ -x .gpu/$b ]] || gunzip -kf .gpu/$b.gz; done
T=$PWD/.gpu/trainer
N=${NGPU:-$(nvidia-smi -L | wc -l)}
GPN=${GPN:-1}
mkdir -p "$OUT"
launch() { torchrun --nproc-per-node="$N" --master-port="${PORT:-29501}" --no-python "$T" "$@"; }
gpu=(--set 'train.device="cuda"' --set 'train.precision="bf16"')
nccl=(--set 'dist.backend="nccl"' --set "dist.world_size=$N" --set "dist.gpus_per_node=$GPN")
zeropp=(--set zero.quantized_weights=true --set zero.quantized_gradients=true --set "zero.hpz_partition_size=$GPN")
zero3=(--set zero.quantized_weights=false --set zero.quantized_gradients=false --set zero.hpz_partition_size=1)

for stage in $STAGES; do
  case $stage in
  parity)
    base=(--config configs/tiny.toml --set log.progress=false --set train.steps=200 --set log.interval=10
          --set log.eval_interval=50 --set dist.world_size="$N" --set "dist.gpus_per_node=$GPN" --set zero.hpz_partition_size=1
          --set train.micro_batch=$((16 / N)) --set checkpoint.interval=0)
    for mode in zero3 zeropp; do
      extra=(); [[ $mode == zeropp ]] && extra=("${zeropp[@]}")
      "$T" "${base[@]}" "${gpu[@]}" "${extra[@]}" --set "log.dir=\"$OUT/$mode-local\"" > "$OUT/$mode-local.log" 2>&1
      launch "${base[@]}" "${gpu[@]}" "${nccl[@]}" "${extra[@]}" --set "log.dir=\"$OUT/$mode-nccl\"" > "$OUT/$mode-nccl.log" 2>&1
      for b in local nccl; do
        echo "$mode $b: $(grep -o '"val_loss":[0-9.]*' "$OUT/$mode-$b/metrics.jsonl" | tr '\n' ' ')"
      done
    done
    ;;
  parity350)
    # gpt350m on the bundled corpus, seq 1024, one sequence per GPU per step, 200 steps.
    base=(--config configs/gpt350m.toml --set 'data.train=["data/corpus/sotu.jsonl.zst"]' --set 'data.valid=[]'
          --set data.valid_fraction=0.05 --set model.seq_len=1024 --set model.recompute=false
          --set train.micro_batch=1 --set "train.global_batch=$N" --set train.steps=200 --set train.warmup_steps=10
          --set log.progress=false --set log.interval=10 --set log.eval_interval=100 --set log.eval_samples=16
          --set checkpoint.interval=0 --set checkpoint.resume=false --set dist.world_size="$N" --set "dist.gpus_per_node=$GPN"
          --set zero.hpz_partition_size=1)
    for mode in zero3 zeropp; do
      if [[ $mode == zeropp ]]; then extra=("${zeropp[@]}"); else extra=("${zero3[@]}"); fi
      "$T" "${base[@]}" "${gpu[@]}" --set 'dist.backend="local"' "${extra[@]}" --set "log.dir=\"$OUT/350-$mode-local\"" > "$OUT/350-$mode-local.log" 2>&1
      launch "${base[@]}" "${gpu[@]}" "${nccl[@]}" "${extra[@]}" --set "log.dir=\"$OUT/350-$mode-nccl\"" > "$OUT/350-$mode-nccl.log" 2>&1
      for b in local nccl; do
        echo "gpt350m $mode $b: $(grep -o '"val_loss":[0-9.]*' "$OUT/350-$mode-$b/metrics.jsonl" | tr '\n' ' ') | last loss $(grep -o '"loss":[0-9.]*' "$OUT/350-$mode-$b/metrics.jsonl" | tail -1)"
      done
    done
    ;;
  bench|large)
    # bench: gpt350m at 1K and 2K tokens per GPU, fast and socket transport;
    # large: the largest model that fits (gpt6.7b, recomputation) at 2K tokens, fast transport.
    model=gpt350m; slows="0 1"; toks="1024 2048"; rc=false
    [[ $stage == large ]] && { model=gpt6.7b; slows=0; toks=2048; rc=true; }
    for slow in $slows; do
      for tok in $toks; do
        for mode in zero3 zeropp; do
          if [[ $mode == zeropp ]]; then extra=("${zeropp[@]}"); else extra=("${zero3[@]}"); fi
          name=$model-$mode-$tok-$([[ $slow == 1 ]] && echo socket || echo fast)
          env_=(); [[ $slow == 1 ]] && env_=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
          env "${env_[@]}" torchrun --nproc-per-node="$N" --master-port="${PORT:-29501}" --no-python "$T" \
            bench --config configs/gpt350m.toml --set "model.preset=\"$model\"" "${gpu[@]}" "${nccl[@]}" "${extra[@]}" \
            --set model.seq_len=$tok --set model.recompute=$rc --set train.micro_batch=1 \
            --set "train.global_batch=$N" --steps "${BENCH_STEPS:-5}" --json > "$OUT/$name.json" 2> "$OUT/$name.log" || { echo "$name FAILED"; tail -3 "$OUT/$name.log"; }
          echo "$name $(cat "$OUT/$name.json")"
        done
      done
    done
    ;;
  comm)
    launch bench --collectives --config configs/tiny.toml "${gpu[@]}" "${nccl[@]}" --mib 16,256,1024 2>&1 | tee "$OUT/collectives-fast.txt"
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 launch bench --collectives --config configs/tiny.toml "${gpu[@]}" "${nccl[@]}" \
      --mib 16,256 2>&1 | tee "$OUT/collectives-socket.txt"
    ;;
  *) echo "unknown stage $stage (parity, bench, comm)" >&2; exit 2 ;;
  esac
done
