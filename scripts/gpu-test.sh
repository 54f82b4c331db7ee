#!/usr/bin/env bash
# The GPU test suite, run on the H200 machine from the repository root with what
# scripts/gpu-build.sh packed into .gpu/ (README, "GPU"). Stages (default: tests parity):
#   tests   every GPU test: each kernel against its CPU reference, the local backend on one GPU,
#           the ZeRO++ engine on GPU vs CPU, NCCL at world 1 (TESTS="a b": the tests whose
#           names hold a or b)
#   parity  200 steps of tiny, CPU fp32 vs GPU bf16, plain and ZeRO++ at W = 8 (2 x 4)
#   bench   trainer bench --kernels, and gpt350m at W = 1 and W = 8 (bench.toml settings)
#   speed   gpt350m at W = 1 (seq 1024, 16 sequences) with --profile, beside PyTorch eager and
#           torch.compile from the same call (.gpu/torch_gpt.py: a copy of shared/tools/torch_gpt.py)
#   speed-2k, speed-1.3b, speed-6.7b  issue 13's other shapes, each beside PyTorch in the same
#           call: gpt350m at seq 2048 and GPT-1.3B at seq 2048 (eager and torch.compile), gpt6.7b
#           with recomputation (eager with checkpointing); speed-large: all three
#   local-speed  gpt350m on this one GPU: W = 1 beside PyTorch eager, and the local backend's
#           2 x 1 and 2 x 4 worlds (ZeRO-3 and ZeRO++), with the communication jobs' report
#   ablation  the convergence ablation of configs/ablation/ on the open corpus (docs/convergence.md)
#   llama   the Llama family: 200 steps of llama-tiny, CPU fp32 vs GPU bf16, plain and ZeRO++ at
#           W = 8 (2 x 4); the Llama 3.2 1B shape at seq 2048, 8 sequences a step (LLAMA_MB a
#           micro-batch, default 8) with --profile, beside .gpu/torch_llama.py eager and
#           torch.compile from the same call
#   qwen    Qwen3 1.7B's and Qwen2.5 1.5B's shapes at seq 2048, 8 sequences a step (QWEN_MB a
#           micro-batch, default 8) with --profile, each beside .gpu/torch_llama.py eager and
#           torch.compile with the same blocks (--qk-norm --head-dim 128, --qkv-bias)
#   fp8     issue 40: the FP8 kernels' tests with the GEMM timings at Llama 3.2 1B's shapes beside
#           PyTorch's (scripts/fp8_gemm_torch.py), llama-tiny in FP8 on the GPU (plain and ZeRO++
#           at W = 8), the Llama 3.2 1B shape in FP8 beside torch_llama.py --compile --float8
#   fp8-speed  issue 40's other speed targets beside their anchors: gpt350m and Llama 3.2 3B
#           (recomputation) in FP8, and Llama 3.2 1B as local 2 x 4 ZeRO++ in FP8 (FP8 qwZ) and bf16
#   fp8-convergence  issue 40: FP8 against bf16 on the bundled corpus, same data and seed:
#           configs/llama-100m.toml for 1,000 steps and Llama 3.2 1B's shape for 200
#   llama-3b  the Llama 3.2 3B shape with recomputation (W = 1, seq 2048, 8 sequences) beside
#           torch_llama.py eager and torch.compile with activation checkpointing
#   calibrate  issue 28: trainer bench --profile --json at W = 1 for gpt350m (seq 1024) at 16, 8
#           and 2 sequences a micro-batch ($OUT/calibrate-mbN.json), then trainer plan --throughput
#           --calibrate --shared-gpu's predictions of local-speed's worlds (2 x 1 from the bench at
#           8, 2 x 4 from the one at 2); run local-speed in the same call for the measured ones
#   daily   issue 27 on gpt350m (W = 1, seq 1024, 16 sequences a step) trained on the bundled
#           corpus: DAILY_STEPS (150) steps with no checkpoint but the last, one every 50 steps
#           in the foreground, and in the background (each run's "trained N steps in S s" and
#           checkpoint lines); eval and generate on the GPU from its checkpoint; gpt6.7b's
#           background checkpoint stall; the out-of-memory line of gpt6.7b without recomputation
# Each run's log and metrics go under $OUT (default gpu-out/). BENCH_SET: more section.key=VALUE
# settings for the speed and llama stages' benches (e.g. BENCH_SET='zero.prefetch_depth=1'),
# TAG a suffix of their output files; NO_TORCH=1 leaves the PyTorch anchors out, NO_EAGER=1 the
# eager ones of the speed, llama and qwen stages, NO_PARITY=1 the llama stage's llama-tiny runs.
# NO_PROFILE=1 runs the speed stages' single-GPU benches without --profile: its two CUDA events
# a span sit in the step's time (1B FP8 on an H100: 80,120 tokens/s with them, 81,060 without;
# gpt350m 215,496 and 221,232; results.md, 2026-12-06), so a ratio to an anchor is the true one
# without them (then run the stage again with TAG=-profile for the table by family).
set -euo pipefail
OUT=${OUT:-gpu-out}
STEPS=${STEPS:-200}
STAGES=${*:-tests parity}
V=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$V/nvidia/cu13/lib:$V/nvidia/nccl/lib:$V/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
for b in trainer gpu-tests; do [[ -x .gpu/$b || ! -f .gpu/$b.gz ]] || gunzip -kf .gpu/$b.gz; done
T=.gpu/trainer
mkdir -p "$OUT"
bench_set=()
for kv in ${BENCH_SET:-}; do bench_set+=(--set "$kv"); done
prof=(--profile)
[[ -z ${NO_PROFILE:-} ]] || prof=()
[[ -z ${NO_TORCH:-} ]] || rm -f .gpu/torch_gpt.py .gpu/torch_llama.py
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

run() { # name, args...: a training run, its val_loss line
  local name=$1; shift
  local start=$SECONDS
  "$T" "$@" --set "log.dir=\"$OUT/$name\"" > "$OUT/$name.log" 2>&1 || { echo "$name FAILED"; tail -5 "$OUT/$name.log"; return 1; }
  echo "$name: $((SECONDS - start)) s; $(grep -o '"val_loss":[0-9.]*' "$OUT/$name/metrics.jsonl" | tr '\n' ' ')"
}

# A Llama shape at W = 1, seq 2048, 8 sequences a step, ZeRO-3 (the speed stages add the shape).
llama_w1=(bench --config configs/gpt350m.toml --set 'dist.backend="local"' --set model.seq_len=2048
          --set train.global_batch=8 --set dist.world_size=1 --set dist.gpus_per_node=1
          --set zero.hpz_partition_size=1 --set zero.quantized_weights=false
          --set zero.quantized_gradients=false)

# The parity stages' runs: llama-tiny's 200 steps, and ZeRO++ at W = 8 as 2 x 4.
llama_tiny=(--config configs/tiny.toml --set 'model.preset="llama-tiny"' --set log.progress=false
            --set checkpoint.resume=false --set "train.steps=$STEPS" --set log.interval=10
            --set log.eval_interval=50)
zeropp=(--set dist.world_size=8 --set dist.gpus_per_node=4 --set train.micro_batch=2
        --set zero.quantized_weights=true --set zero.hpz_partition_size=4 --set zero.quantized_gradients=true)

for stage in $STAGES; do
  case $stage in
  tests)
    # TESTS: name filters (e.g. TESTS="engine nccl"), every test without.
    .gpu/gpu-tests ${TESTS:-} --test-threads=1 2>&1 | tee "$OUT/gpu-tests.log"
    ;;
  parity)
    base=(--config configs/tiny.toml --set log.progress=false --set checkpoint.resume=false
          --set "train.steps=$STEPS" --set log.interval=10 --set log.eval_interval=50)
    gpu=(--set 'train.device="cuda"' --set 'train.precision="bf16"')
    run tiny-cpu-fp32 "${base[@]}"
    run tiny-gpu-bf16 "${base[@]}" "${gpu[@]}"
    run zeropp-w8-cpu-fp32 "${base[@]}" "${zeropp[@]}"
    run zeropp-w8-gpu-bf16 "${base[@]}" "${zeropp[@]}" "${gpu[@]}"
    ;;
  bench)
    "$T" bench --kernels | tee "$OUT/bench-kernels.txt"
    # gpt350m at seq 1024 and 16 sequences a step: W = 1 (ZeRO-3), and W = 8 as 2 x 4 sharing
    # the GPU with all of ZeRO++ (2 sequences a rank).
    b=(bench --config configs/gpt350m.toml --set 'dist.backend="local"' --set model.seq_len=1024
       --set model.recompute=false --set train.global_batch=16 --steps "${BENCH_STEPS:-5}")
    "$T" "${b[@]}" --set dist.world_size=1 --set dist.gpus_per_node=1 --set train.micro_batch=16 \
      --set zero.hpz_partition_size=1 --set zero.quantized_weights=false \
      --set zero.quantized_gradients=false | tee "$OUT/bench-gpt350m-w1.txt"
    "$T" "${b[@]}" --set dist.world_size=8 --set dist.gpus_per_node=4 --set train.micro_batch=2 \
      --set zero.hpz_partition_size=4 | tee "$OUT/bench-gpt350m-w8-zeropp.txt"
    ;;
  llama)
    base=("${llama_tiny[@]}")
    gpu=(--set 'train.device="cuda"' --set 'train.precision="bf16"')
    if [[ -z ${NO_PARITY:-} ]]; then
      run llama-tiny-cpu-fp32 "${base[@]}"
      run llama-tiny-gpu-bf16 "${base[@]}" "${gpu[@]}"
      run llama-zeropp-w8-gpu-bf16 "${base[@]}" "${zeropp[@]}" "${gpu[@]}"
    fi
    "$T" "${llama_w1[@]}" --set 'model.preset="llama3.2-1b"' --set model.recompute=false \
      --set "train.micro_batch=${LLAMA_MB:-8}" --steps "${BENCH_STEPS:-5}" "${prof[@]}" "${bench_set[@]}" \
      | tee "$OUT/speed-llama1b${TAG:-}.txt"
    if [[ -f .gpu/torch_llama.py ]]; then
      [[ -n ${NO_EAGER:-} ]] || python3 .gpu/torch_llama.py --steps 20 | tee "$OUT/speed-torch-llama-eager.txt"
      [[ -n ${NO_COMPILE:-} ]] || python3 .gpu/torch_llama.py --steps 20 --compile \
        | tee "$OUT/speed-torch-llama-compile.txt"
    fi
    ;;
  qwen)
    # Qwen3 1.7B's and Qwen2.5 1.5B's shapes (issue 39), each beside torch_llama.py with the same
    # blocks (--qk-norm --head-dim, --qkv-bias) in the same call; batch 8 x 2048, no recompute.
    for q in "qwen3-1.7b:--layers 28 --dim 2048 --heads 16 --kv-heads 8 --head-dim 128 --ffn 6144 --vocab 151936 --qk-norm" \
             "qwen2.5-1.5b:--layers 28 --dim 1536 --heads 12 --kv-heads 2 --ffn 8960 --vocab 151936 --qkv-bias"; do
      preset=${q%%:*}; read -r -a shape <<< "${q#*:}"
      "$T" "${llama_w1[@]}" --set "model.preset=\"$preset\"" --set model.vocab_size=151936 \
        --set model.recompute=false --set "train.micro_batch=${QWEN_MB:-8}" --steps "${BENCH_STEPS:-5}" \
        "${prof[@]}" "${bench_set[@]}" | tee "$OUT/speed-$preset${TAG:-}.txt"
      if [[ -f .gpu/torch_llama.py ]]; then
        [[ -n ${NO_EAGER:-} ]] || python3 .gpu/torch_llama.py --steps 20 "${shape[@]}" \
          | tee "$OUT/speed-torch-$preset-eager.txt"
        [[ -n ${NO_COMPILE:-} ]] || python3 .gpu/torch_llama.py --steps 20 "${shape[@]}" --compile \
          | tee "$OUT/speed-torch-$preset-compile.txt"
      fi
    done
    ;;
  fp8)
    # Issue 40: the FP8 quantisers and layers against their CPU references and the FP8 GEMMs at
    # Llama 3.2 1B's shapes beside bf16 and PyTorch's (scripts/fp8_gemm_torch.py); llama-tiny
    # trained in FP8 on the GPU (plain, and ZeRO++ at W = 8 as 2 x 4: compare with the llama
    # stage's bf16 runs and the CPU emulation, docs/kernels.md); the Llama 3.2 1B shape in FP8
    # beside torch_llama.py --compile --float8 (torchao's row-wise recipe) from the same call.
    .gpu/gpu-tests fp8 --test-threads=1 --nocapture 2>&1 | tee "$OUT/fp8-tests.log"
    python3 scripts/fp8_gemm_torch.py 2>&1 | tee "$OUT/fp8-gemm-torch.txt" || true
    base=("${llama_tiny[@]}")
    gpu=(--set 'train.device="cuda"' --set 'train.precision="fp8"')
    if [[ -z ${NO_PARITY:-} ]]; then
      run llama-tiny-gpu-fp8 "${base[@]}" "${gpu[@]}"
      run llama-zeropp-w8-gpu-fp8 "${base[@]}" "${zeropp[@]}" "${gpu[@]}"
    fi
    "$T" "${llama_w1[@]}" --set 'model.preset="llama3.2-1b"' --set model.recompute=false \
      --set 'train.precision="fp8"' --set "train.micro_batch=${LLAMA_MB:-8}" --steps "${BENCH_STEPS:-5}" \
      "${prof[@]}" "${bench_set[@]}" | tee "$OUT/speed-llama1b-fp8${TAG:-}.txt"
    if [[ -f .gpu/torch_llama.py ]]; then
      python3 .gpu/torch_llama.py --steps 20 --compile --float8 \
        | tee "$OUT/speed-torch-llama-compile-float8.txt"
    fi
    ;;
  fp8-speed)
    # Issue 40's other speed targets, each beside its anchor from the same call: gpt350m in FP8
    # (seq 1024, 16 sequences) beside torch_gpt.py --compile; Llama 3.2 3B in FP8 with
    # recomputation (of the attention half, and of the whole block) beside torch_llama.py
    # --compile --ckpt (bf16) and --compile --float8 --ckpt;
    # Llama 3.2 1B as 2 x 4 ZeRO++ on the local backend (qwZ + hpZ + qgZ, one sequence a rank)
    # in FP8 (FP8 qwZ: the gathered codes go to the GEMMs) and in bf16 (INT8 qwZ, dequantised),
    # each with --profile: the dequantisation's time against FP8's.
    fp8=(--set 'train.precision="fp8"')
    "$T" bench --config configs/gpt350m.toml --set 'dist.backend="local"' --set model.seq_len=1024 \
      --set model.recompute=false --set train.global_batch=16 --set train.micro_batch=16 \
      --set dist.world_size=1 --set dist.gpus_per_node=1 --set zero.hpz_partition_size=1 \
      --set zero.quantized_weights=false --set zero.quantized_gradients=false "${fp8[@]}" \
      --steps "${BENCH_STEPS:-10}" "${prof[@]}" "${bench_set[@]}" | tee "$OUT/speed-gpt350m-fp8${TAG:-}.txt"
    if [[ -f .gpu/torch_gpt.py ]]; then
      python3 .gpu/torch_gpt.py --steps 30 --compile | tee "$OUT/speed-torch-compile.txt"
    fi
    # Both recomputations: the attention half alone (each block keeps its MLP's activations)
    # and the whole block. NO_3B=1 leaves out the 3B runs (about 4 of the stage's 8 minutes).
    for r in attention:'"attention"' full:true; do
      [[ -n ${NO_3B:-} ]] || "$T" "${llama_w1[@]}" --set 'model.preset="llama3.2-3b"' --set "model.recompute=${r#*:}" \
        "${fp8[@]}" --set "train.micro_batch=${LLAMA_MB:-8}" --steps "${BENCH_STEPS:-3}" "${prof[@]}" "${bench_set[@]}" \
        | tee "$OUT/speed-llama3b-fp8-${r%%:*}${TAG:-}.txt"
    done
    if [[ -z ${NO_3B:-} && -f .gpu/torch_llama.py ]]; then
      l3=(--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn 8192 --ckpt --compile)
      python3 .gpu/torch_llama.py --steps 10 "${l3[@]}" | tee "$OUT/speed-torch-llama3b-compile.txt"
      python3 .gpu/torch_llama.py --steps 10 "${l3[@]}" --float8 \
        | tee "$OUT/speed-torch-llama3b-compile-float8.txt"
    fi
    w8=(bench --config configs/gpt350m.toml --set 'dist.backend="local"' --set 'model.preset="llama3.2-1b"'
        --set model.seq_len=2048 --set model.recompute=false --set dist.world_size=8
        --set dist.gpus_per_node=4 --set train.micro_batch=1 --set train.global_batch=8
        --set zero.quantized_weights=true --set zero.hpz_partition_size=4
        --set zero.quantized_gradients=true --steps "${BENCH_STEPS:-3}" --profile)
    "$T" "${w8[@]}" "${fp8[@]}" | tee "$OUT/local-llama1b-w8-zeropp-fp8.txt"
    "$T" "${w8[@]}" | tee "$OUT/local-llama1b-w8-zeropp-bf16.txt"
    ;;
  fp8-convergence)
    # Issue 40: FP8 against bf16 on the GPU, the same data (the bundled corpus) and seed:
    # configs/llama-100m.toml for CONV_STEPS (1000) steps, and Llama 3.2 1B's shape (seq 2048,
    # 8 sequences a step, the GPT-2 vocabulary) for CONV_1B_STEPS (200). What comes back (the
    # device returns 8 files): each run's metrics as $OUT/conv-NAME.metrics.jsonl, the two
    # figures of trainer plot ($OUT/conv-100m.png, conv-1b.png) and the logs in conv-logs.tgz;
    # the final checkpoints are written outside $OUT and deleted.
    quiet=(--set log.progress=false --set checkpoint.interval=0 --set checkpoint.resume=false)
    for p in bf16 fp8; do
      run "conv-100m-$p" --config configs/llama-100m.toml "${quiet[@]}" \
        --set "checkpoint.dir=\"/tmp/conv-100m-$p\"" \
        --set "train.precision=\"$p\"" --set "train.steps=${CONV_STEPS:-1000}"
    done
    for p in bf16 fp8; do
      run "conv-1b-$p" --config configs/llama-demo.toml "${quiet[@]}" --set 'model.preset="llama3.2-1b"' \
        --set "checkpoint.dir=\"/tmp/conv-1b-$p\"" \
        --set model.vocab_size=50304 --set model.seq_len=2048 --set 'train.device="cuda"' \
        --set "train.precision=\"$p\"" --set train.micro_batch=8 --set train.global_batch=8 \
        --set dist.world_size=1 --set dist.gpus_per_node=1 --set zero.hpz_partition_size=1 \
        --set zero.quantized_weights=false --set zero.quantized_gradients=false \
        --set train.lr=3e-4 --set train.min_lr=3e-5 --set train.warmup_steps=20 \
        --set "train.steps=${CONV_1B_STEPS:-200}" --set log.eval_interval=50
    done
    rm -rf /tmp/conv-100m-* /tmp/conv-1b-*
    for n in 100m 1b; do
      "$T" plot "$OUT/conv-$n-bf16" "$OUT/conv-$n-fp8" --label bf16 --label fp8 \
        --output "$OUT/conv-$n.png" || echo "plot of conv-$n FAILED"
    done
    for r in "$OUT"/conv-*-bf16 "$OUT"/conv-*-fp8; do
      if [[ -d $r ]]; then cp "$r/metrics.jsonl" "$r.metrics.jsonl"; rm -rf "$r"; fi
    done
    tar czf "$OUT/conv-logs.tgz" -C "$OUT" $(cd "$OUT" && ls conv-*.log) && rm -f "$OUT"/conv-*.log
    ;;
  llama-3b)
    "$T" "${llama_w1[@]}" --set 'model.preset="llama3.2-3b"' --set model.recompute=true \
      --set "train.micro_batch=${LLAMA_MB:-8}" --steps "${BENCH_STEPS:-3}" "${prof[@]}" "${bench_set[@]}" \
      | tee "$OUT/speed-llama3b${TAG:-}.txt"
    if [[ -f .gpu/torch_llama.py ]]; then
      l3=(--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn 8192 --ckpt)
      python3 .gpu/torch_llama.py --steps 10 "${l3[@]}" | tee "$OUT/speed-torch-llama3b-eager.txt"
      [[ -n ${NO_COMPILE:-} ]] || python3 .gpu/torch_llama.py --steps 10 "${l3[@]}" --compile \
        | tee "$OUT/speed-torch-llama3b-compile.txt"
    fi
    ;;
  daily)
    d=(--config configs/gpt350m.toml --set 'dist.backend="local"' --set model.seq_len=1024
       --set model.recompute=false --set train.global_batch=16 --set train.micro_batch=16
       --set dist.world_size=1 --set dist.gpus_per_node=1 --set zero.hpz_partition_size=1
       --set zero.quantized_weights=false --set zero.quantized_gradients=false
       --set 'data.train=["data/corpus/sotu.jsonl.zst"]' --set 'data.valid=[]'
       --set data.valid_fraction=0.05 --set "train.steps=${DAILY_STEPS:-150}"
       --set train.warmup_steps=10 --set log.interval=10 --set log.eval_interval=0
       --set log.eval_samples=64 --set log.progress=false --set checkpoint.resume=false
       --set checkpoint.keep_last=1 --set log.tensorboard=true)
    daily() { # name, settings...: a run; its timing and checkpoint lines
      local name=$1; shift
      "$T" "${d[@]}" --set "log.dir=\"$OUT/daily-$name\"" "$@" > "$OUT/daily-$name.log" 2>&1 \
        || { echo "daily-$name FAILED"; tail -5 "$OUT/daily-$name.log"; return 1; }
      echo "== daily-$name"; grep -E "^(trained|checkpoint)" "$OUT/daily-$name.log"
    }
    daily none --set checkpoint.interval=0
    daily sync-50 --set checkpoint.interval=50 --set checkpoint.async=false
    daily async-50 --set checkpoint.interval=50 --set checkpoint.async=true
    ckpt=$OUT/daily-async-50/checkpoints
    echo "== eval on the GPU"; "$T" eval --checkpoint "$ckpt" --device cuda
    grep -o '"step":[0-9]*,"tokens":[0-9]*,"val_loss":[0-9.]*' "$OUT/daily-async-50/metrics.jsonl" | tail -1
    echo "== generate on the GPU"
    "$T" generate --checkpoint "$ckpt" --device cuda --prompt "Fellow citizens" --max-new-tokens 40 --temperature 0
    echo; "$T" generate --checkpoint "$ckpt" --device cuda --prompt "Fellow citizens" --max-new-tokens 40 --seed 7
    echo; rm -rf "$OUT"/daily-*/checkpoints
    # gpt6.7b's 80 GB checkpoint does not fit this machine's 64 GiB disk: the background
    # write of step 2 is held back (ZEROPP_CHECKPOINT_DELAY) and the process killed at step 4,
    # before it writes, so what is measured is the stall training sees: the copy to host memory.
    echo "== gpt6.7b, background checkpoint at step 2"
    ZEROPP_CHECKPOINT_DELAY=2@600000 ZEROPP_KILL_RANK=0@4 "$T" --config configs/gpt6.7b.toml \
      --set 'data.train=["data/corpus/sotu.jsonl.zst"]' --set 'data.valid=[]' --set train.steps=6 \
      --set checkpoint.interval=2 --set checkpoint.async=true --set checkpoint.resume=false \
      --set log.eval_samples=0 --set log.progress=false --set "log.dir=\"$OUT/daily-6.7b\"" \
      > "$OUT/daily-6.7b.log" 2>&1 || true
    grep -E "^(step|checkpoint|error)" "$OUT/daily-6.7b.log" | head || true
    rm -rf "$OUT/daily-6.7b/checkpoints"
    echo "== out of memory: gpt6.7b without recomputation, micro-batch 16"
    "$T" bench --config configs/gpt6.7b.toml --set model.recompute=false --set train.micro_batch=16 --set train.global_batch=16 \
      > "$OUT/daily-oom.log" 2>&1 && echo "no out-of-memory error" || true
    cat "$OUT/daily-oom.log"
    ;;
  speed)
    # Ours first, then the anchors: the same model, data shape and optimizer (issue #13).
    "$T" bench --config configs/gpt350m.toml --set 'dist.backend="local"' --set model.seq_len=1024 \
      --set model.recompute=false --set train.global_batch=16 --set train.micro_batch=16 \
      --set dist.world_size=1 --set dist.gpus_per_node=1 --set zero.hpz_partition_size=1 \
      --set zero.quantized_weights=false --set zero.quantized_gradients=false \
      --steps "${BENCH_STEPS:-10}" "${prof[@]}" "${bench_set[@]}" | tee "$OUT/speed-gpt350m${TAG:-}.txt"
    if [[ -f .gpu/torch_gpt.py ]]; then
      [[ -n ${NO_EAGER:-} ]] || python3 .gpu/torch_gpt.py --steps 30 | tee "$OUT/speed-torch-eager.txt"
      [[ -n ${NO_COMPILE:-} ]] || python3 .gpu/torch_gpt.py --steps 30 --compile | tee "$OUT/speed-torch-compile.txt"
    fi
    ;;
  speed-2k|speed-1.3b|speed-6.7b|speed-large)
    # Issue 13's other shapes, each beside its PyTorch anchors in the same call: gpt350m at seq
    # 2048 (8 sequences) and GPT-1.3B at seq 2048 (eager and torch.compile), gpt6.7b with
    # recomputation (eager with activation checkpointing). speed-large runs all three.
    w1=(bench --config configs/gpt350m.toml --set 'dist.backend="local"' --set model.recompute=false
        --set dist.world_size=1 --set dist.gpus_per_node=1 --set zero.hpz_partition_size=1
        --set zero.quantized_weights=false --set zero.quantized_gradients=false
        --set model.seq_len=2048 --set train.global_batch=8 --set train.micro_batch=8)
    torch=() ; [[ -f .gpu/torch_gpt.py ]] && torch=(python3 .gpu/torch_gpt.py)
    if [[ $stage == speed-2k || $stage == speed-large ]]; then
      "$T" "${w1[@]}" --steps 5 "${prof[@]}" | tee "$OUT/speed-gpt350m-2k.txt"
      if [[ -n ${torch[*]} ]]; then
        "${torch[@]}" --steps 15 --seq 2048 --batch 8 | tee "$OUT/speed-torch-2k.txt"
        "${torch[@]}" --steps 15 --seq 2048 --batch 8 --compile | tee "$OUT/speed-torch-2k-compile.txt"
      fi
    fi
    if [[ $stage == speed-1.3b || $stage == speed-large ]]; then
      "$T" "${w1[@]}" --set 'model.preset="gpt1.3b"' --steps 4 "${prof[@]}" "${bench_set[@]}" | tee "$OUT/speed-gpt1.3b-2k.txt"
      if [[ -n ${torch[*]} ]]; then
        l13=(--layers 24 --dim 2048 --heads 16 --seq 2048 --batch 8)
        "${torch[@]}" --steps 10 "${l13[@]}" | tee "$OUT/speed-torch-1.3b.txt"
        "${torch[@]}" --steps 10 "${l13[@]}" --compile | tee "$OUT/speed-torch-1.3b-compile.txt"
      fi
    fi
    if [[ $stage == speed-6.7b || $stage == speed-large ]]; then
      "$T" bench --config configs/gpt6.7b.toml --set train.micro_batch=4 --steps 2 --warmup 1 \
        | tee "$OUT/speed-gpt6.7b.txt"
      [[ -z ${torch[*]} ]] || "${torch[@]}" --steps 6 --layers 32 --dim 4096 --heads 32 --seq 2048 \
        --batch 4 --ckpt | tee "$OUT/speed-torch-6.7b.txt"
    fi
    ;;
  calibrate)
    cb=(--config configs/gpt350m.toml --set model.seq_len=1024 --set model.recompute=false)
    z3=(--set zero.hpz_partition_size=1 --set zero.quantized_weights=false --set zero.quantized_gradients=false)
    for mb in 16 8 2; do
      "$T" bench "${cb[@]}" --set 'dist.backend="local"' --set dist.world_size=1 \
        --set dist.gpus_per_node=1 --set train.global_batch=16 --set "train.micro_batch=$mb" \
        "${z3[@]}" --steps "${BENCH_STEPS:-5}" --profile --json > "$OUT/calibrate-mb$mb.json"
      echo "W = 1 at $mb a micro-batch: $(grep -o '"tokens_per_s":[0-9.]*' "$OUT/calibrate-mb$mb.json")"
    done
    "$T" plan "${cb[@]}" --set dist.world_size=2 --set dist.gpus_per_node=1 \
      --set zero.hpz_partition_size=1 --set train.global_batch=16 --set train.micro_batch=8 \
      --throughput --calibrate "$OUT/calibrate-mb8.json" --shared-gpu \
      | tee "$OUT/predict-w2.txt" | sed -n '/^throughput/,$p'
    "$T" plan "${cb[@]}" --set dist.world_size=8 --set dist.gpus_per_node=4 \
      --set zero.hpz_partition_size=4 --set train.global_batch=16 --set train.micro_batch=2 \
      --throughput --calibrate "$OUT/calibrate-mb2.json" --shared-gpu \
      | tee "$OUT/predict-w8.txt" | sed -n '/^throughput/,$p'
    ;;
  local-speed)
    # Issue 16: gpt350m at seq 1024 on one GPU, W = 1 (with --profile) beside PyTorch eager from
    # the same call, then the local backend's worlds on the same GPU: 2 x 1 (ZeRO-3, ZeRO++ =
    # qwZ + qgZ) and 2 x 4 (ZeRO-3, all of ZeRO++) at 16 sequences a step, and 2 x 4 ZeRO++ at 64.
    lb=(bench --config configs/gpt350m.toml --set 'dist.backend="local"' --set model.seq_len=1024
        --set model.recompute=false --steps "${BENCH_STEPS:-5}")
    z3=(--set zero.hpz_partition_size=1 --set zero.quantized_weights=false --set zero.quantized_gradients=false)
    zq=(--set zero.quantized_weights=true --set zero.quantized_gradients=true)
    one() { local name=$1; shift; echo "== $name"; "$T" "${lb[@]}" "$@" | tee "$OUT/local-$name.txt"; }
    one w1 --set dist.world_size=1 --set dist.gpus_per_node=1 --set train.global_batch=16 \
      --set train.micro_batch=16 "${z3[@]}" --profile
    [[ -f .gpu/torch_gpt.py ]] && python3 .gpu/torch_gpt.py --steps 30 | tee "$OUT/local-torch-eager.txt"
    w2=(--set dist.world_size=2 --set dist.gpus_per_node=1 --set train.global_batch=16 --set train.micro_batch=8)
    w8=(--set dist.world_size=8 --set dist.gpus_per_node=4 --set train.micro_batch=2 --set train.global_batch=16)
    one w2-zero3 "${w2[@]}" "${z3[@]}"
    one w2-zeropp "${w2[@]}" "${zq[@]}" --set zero.hpz_partition_size=1
    one w8-zero3 "${w8[@]}" "${z3[@]}"
    one w8-zeropp "${w8[@]}" "${zq[@]}" --set zero.hpz_partition_size=4 --profile
    one w8-zeropp-64 "${w8[@]}" "${zq[@]}" --set zero.hpz_partition_size=4 --set train.global_batch=64 \
      --set train.micro_batch=8
    ;;
  ablation)
    # Issue 17: the convergence ablation of configs/ablation/ (GPT-125M, 2 x 4 ranks on this GPU)
    # on the open corpus. CORPUS: its .jsonl.zst files (default data/openpile/train/*), tokenised
    # here into data/openpile/ unless that is there already. ABLATION: which configs (default
    # all five, in the paper's order). ABL_SET: more section.key=VALUE settings for every run
    # (e.g. "train.seed=1235"), ABL_TAG: a suffix of the runs' names for them. Each run's
    # metrics.jsonl and config.toml stay in $OUT/abl-NAME[-TAG]/ (its final checkpoint is removed). Draw the figure
    # where they come back: trainer plot $OUT/abl-*.
    if [[ ! -f data/openpile/openpile.bin ]]; then
      corpus=(${CORPUS:-data/openpile/train/*.jsonl.zst})
      "$T" prepare-data --input "${corpus[@]}" --output data/openpile/openpile --valid-fraction 0.01
    fi
    extra=()
    for kv in ${ABL_SET:-}; do extra+=(--set "$kv"); done
    for name in ${ABLATION:-zero3 hpz_qwz zeropp_qgz_half zeropp zeropp_ef}; do
      start=$SECONDS
      run=abl-$name${ABL_TAG:+-$ABL_TAG}
      "$T" --config "configs/ablation/$name.toml" --set "log.dir=\"$OUT/$run\"" \
        --set checkpoint.interval=0 --set checkpoint.resume=false "${extra[@]}" > "$OUT/$run.log" 2>&1 \
        || { echo "$run FAILED"; tail -5 "$OUT/$run.log"; continue; }
      echo "$run: $((SECONDS - start)) s; $(grep -o '"val_loss":[0-9.]*' "$OUT/$run/metrics.jsonl" | tail -1); $(grep -o '"tokens_per_s":[0-9.]*' "$OUT/$run/metrics.jsonl" | tail -1)"
      rm -rf "$OUT/$run.log" "$OUT/$run/checkpoints" "$OUT/$run/trainer.lock"
    done
    ;;
  *) echo "unknown stage $stage (tests, parity, bench, speed, speed-2k, speed-1.3b, speed-6.7b, speed-large, local-speed, ablation, llama, llama-3b, qwen, fp8, fp8-speed, fp8-convergence, calibrate, daily)" >&2; exit 2 ;;
  esac
done
