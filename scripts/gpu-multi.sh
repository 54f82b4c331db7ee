#!/usr/bin/env bash
# Multi-GPU checks and measurements on one host with 2 or more GPUs (issue 7), from the
# repository root with what scripts/gpu-build.sh packed into .gpu/. One process per GPU under
# torchrun (--no-python), the nccl backend, the GPUs as simulated nodes of GPN GPUs each
# (default 1, so every byte between GPUs counts as inter-node; GPN=4 on 8 GPUs gives the 2 x 4 of
# the issue, with hpZ over each simulated node). Stages (default parity bench comm):
#   parity   MODELS (default "tiny gpt350m"), 200 steps, ZeRO-3 and ZeRO++ over NCCL vs the local
#            backend on one GPU (the local runs go in the background, one GPU each, from the
#            last GPU down, while the NCCL runs use every GPU); gpt350m on the bundled corpus
#   bench    gpt350m, ZeRO-3 vs ZeRO++, 1K and 2K tokens per GPU, over each PATHS entry
#            (default "fast link"): fast = NVLink; link = an emulated node link of LINK_GBPS
#            (default 6.25 Gb/s a GPU, the paper's 100 Gb/s InfiniBand link shared by 16 GPUs;
#            comm::link); socket = NCCL's socket transport for everything (P2P and shared
#            memory off)
#   large    LARGE (default gpt6.7b), ZeRO-3 vs ZeRO++, at LARGE_TOKENS (default "1024 2048")
#            tokens per GPU with recomputation, over LARGE_PATHS (default fast)
#   comm     all-gather, reduce-scatter, all-to-all bus bandwidth through our communicator
#   sweep    gpt350m at seq 1024, 16 sequences a GPU, no recomputation, ZeRO-3 vs ZeRO++ over
#            each SWEEP_PATHS entry (default "fast socket link"), link at each SWEEP_GBPS rate
#            (default "400 200 100 50 25 12.5" Gb/s a node); every `bench --json` line goes to
#            $OUT/sweep.json (started afresh unless SWEEP_APPEND=1), then `trainer plot --bench`
#            draws $OUT/sweep.png and prints the table (also in $OUT/sweep.md; docs/bench.md)
#   fsdp     PyTorch FSDP2, the anchor our tokens/s is a ratio to, in the sweep's shape, over
#            NVLink and sockets: .gpu/torch_fsdp.py (a copy of the shared tools' script; extra
#            arguments in FSDP_ARGS, e.g. --compile). Run it in the same call as what it anchors:
#            scripts/gpu-multi.sh fsdp sweep
# BENCH_STEPS timed steps (default 5) after one warm-up. Logs under $OUT (default gpu-out/).
set -euo pipefail -f  # -f: no globbing (the --set values hold brackets)
OUT=${OUT:-gpu-out}
STAGES=${*:-parity bench comm}
V=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$V/nvidia/cu13/lib:$V/nvidia/nccl/lib:$V/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
# NVLink multicast (NVLS) stays off on the H200 machines, for every torchrun below.
export NCCL_NVLS_ENABLE=0
for b in trainer gpu-tests; do [[ -x .gpu/$b || ! -f .gpu/$b.gz ]] || gunzip -kf .gpu/$b.gz; done
T=$PWD/.gpu/trainer
N=${NGPU:-$(nvidia-smi -L | wc -l)}
GPN=${GPN:-1}
mkdir -p "$OUT"
launch() { torchrun --nproc-per-node="$N" --master-port="${PORT:-29501}" --no-python "$T" "$@"; }
gpu=(--set 'train.device="cuda"' --set 'train.precision="bf16"')
nccl=(--set 'dist.backend="nccl"' --set "dist.world_size=$N" --set "dist.gpus_per_node=$GPN")
zeropp=(--set zero.quantized_weights=true --set zero.quantized_gradients=true --set "zero.hpz_partition_size=$GPN")
LINK_GBPS=${LINK_GBPS:-$(awk -v g="$GPN" 'BEGIN { print 6.25 * g }')}
zero3=(--set zero.quantized_weights=false --set zero.quantized_gradients=false --set zero.hpz_partition_size=1)

for stage in $STAGES; do
  case $stage in
  parity)
    # tiny: 16 sequences a step; gpt350m: seq 1024, one sequence a GPU, 200 steps.
    declare -A args=(
      [tiny]="--config configs/tiny.toml --set log.eval_interval=50 --set train.micro_batch=$((16 / N))"
      [gpt350m]="--config configs/gpt350m.toml --set data.train=[\"data/corpus/sotu.jsonl.zst\"] --set data.valid=[]
                 --set data.valid_fraction=0.05 --set model.seq_len=1024 --set model.recompute=false
                 --set train.micro_batch=1 --set train.global_batch=$N --set train.warmup_steps=10
                 --set log.eval_interval=100 --set log.eval_samples=16"
    )
    common=(--set log.progress=false --set train.steps=200 --set log.interval=10 --set checkpoint.interval=0
            --set checkpoint.resume=false --set dist.world_size="$N" --set "dist.gpus_per_node=$GPN" "${gpu[@]}")
    runs=()
    for model in ${MODELS:-tiny gpt350m}; do for mode in zero3 zeropp; do runs+=("$model-$mode"); done; done
    gpu_free=$((N - 1))
    for run in "${runs[@]}"; do  # the local runs, in the background, one GPU each
      model=${run%-*}; mode=${run##*-}; extra=(); [[ $mode == zeropp ]] && extra=("${zeropp[@]}") || extra=("${zero3[@]}")
      CUDA_VISIBLE_DEVICES=$gpu_free "$T" ${args[$model]} "${common[@]}" --set 'dist.backend="local"' "${extra[@]}" \
        --set "log.dir=\"$OUT/$run-local\"" > "$OUT/$run-local.log" 2>&1 &
      gpu_free=$(( gpu_free > 0 ? gpu_free - 1 : N - 1 ))
    done
    for run in "${runs[@]}"; do
      model=${run%-*}; mode=${run##*-}; extra=(); [[ $mode == zeropp ]] && extra=("${zeropp[@]}") || extra=("${zero3[@]}")
      launch ${args[$model]} "${common[@]}" "${nccl[@]}" "${extra[@]}" --set "log.dir=\"$OUT/$run-nccl\"" \
        > "$OUT/$run-nccl.log" 2>&1 || echo "$run nccl FAILED"
    done
    wait || true
    for run in "${runs[@]}"; do
      for b in local nccl; do
        m=$OUT/$run-$b/metrics.jsonl
        [[ -f $m ]] || { echo "$run $b: no metrics"; tail -3 "$OUT/$run-$b.log"; continue; }
        echo "$run $b: val $(grep -o '"val_loss":[0-9.]*' "$m" | cut -d: -f2 | tr '\n' ' ')| last loss $(grep -o '"loss":[0-9.]*' "$m" | tail -1 | cut -d: -f2) | $(grep -o '"tokens_per_s":[0-9.]*' "$m" | tail -1)"
      done
    done
    ;;
  bench|large)
    model=gpt350m; paths=${PATHS:-fast link}; toks="1024 2048"; rc=false
    [[ $stage == large ]] && { model=${LARGE:-gpt6.7b}; paths=${LARGE_PATHS:-fast}; toks=${LARGE_TOKENS:-1024 2048}; rc=true; }
    for path in $paths; do
      for tok in $toks; do
        for mode in zero3 zeropp; do
          if [[ $mode == zeropp ]]; then extra=("${zeropp[@]}"); else extra=("${zero3[@]}"); fi
          name=$model-$mode-$tok-$path
          env_=(); slow=()
          [[ $path == socket ]] && env_=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
          [[ $path == link ]] && slow=(--set "dist.emulated_link_gbps=$LINK_GBPS")
          env "${env_[@]}" torchrun --nproc-per-node="$N" --master-port="${PORT:-29501}" --no-python "$T" \
            bench --config configs/gpt350m.toml --set "model.preset=\"$model\"" "${gpu[@]}" "${nccl[@]}" "${extra[@]}" "${slow[@]}" \
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
  sweep)
    # Throughput against the link: the same gpt350m bench at 16 x 1024 tokens a GPU everywhere.
    [[ ${SWEEP_APPEND:-0} == 1 ]] || : > "$OUT/sweep.json"
    for path in ${SWEEP_PATHS:-fast socket link}; do
      rates=(none); [[ $path == link ]] && read -r -a rates <<< "${SWEEP_GBPS:-400 200 100 50 25 12.5}"
      for gbps in "${rates[@]}"; do
        for mode in zero3 zeropp; do
          if [[ $mode == zeropp ]]; then extra=("${zeropp[@]}"); else extra=("${zero3[@]}"); fi
          env_=(); slow=(); name=sweep-$mode-$path
          [[ $path == socket ]] && env_=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
          [[ $path == link ]] && { slow=(--set "dist.emulated_link_gbps=$gbps"); name=$name-$gbps; }
          env "${env_[@]}" torchrun --nproc-per-node="$N" --master-port="${PORT:-29501}" --no-python "$T" \
            bench --config configs/gpt350m.toml "${gpu[@]}" "${nccl[@]}" "${extra[@]}" "${slow[@]}" \
            --set model.seq_len=1024 --set model.recompute=false --set train.micro_batch=16 \
            --set "train.global_batch=$((16 * N))" --steps "${BENCH_STEPS:-5}" --json > "$OUT/$name.json" 2> "$OUT/$name.log" || { echo "$name FAILED"; tail -3 "$OUT/$name.log"; }
          cat "$OUT/$name.json" >> "$OUT/sweep.json"
          echo "$name $(cat "$OUT/$name.json")"
        done
      done
    done
    "$T" plot --bench "$OUT/sweep.json" --output "$OUT/sweep.png" > "$OUT/sweep.md" || echo "sweep plot FAILED"
    cat "$OUT/sweep.md"
    ;;
  fsdp)
    # PyTorch FSDP2 in the sweep's shape (gpt350m: 24 x 1024, 16 heads; seq 1024, 16 a GPU).
    if [[ ! -f .gpu/torch_fsdp.py ]]; then
      echo "fsdp: no .gpu/torch_fsdp.py (copy /work/shared/tools/torch_fsdp.py there)"
    else
      for path in fast socket; do
        env_=(); [[ $path == socket ]] && env_=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
        env "${env_[@]}" torchrun --nproc-per-node="$N" --master-port="${PORT:-29501}" .gpu/torch_fsdp.py \
          --seq 1024 --batch 16 ${FSDP_ARGS:-} > "$OUT/fsdp-$path.txt" 2> "$OUT/fsdp-$path.log" || { echo "fsdp-$path FAILED"; tail -3 "$OUT/fsdp-$path.log"; }
        echo "fsdp-$path $(cat "$OUT/fsdp-$path.txt")"
      done
    fi
    ;;
  *) echo "unknown stage $stage (parity, bench, large, comm, sweep, fsdp)" >&2; exit 2 ;;
  esac
done
