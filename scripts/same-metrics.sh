#!/usr/bin/env bash
# Checks that a refactor changed no behaviour: runs the demo, tiny and llama-demo configs for 20
# steps and compares their metrics.jsonl, without the timing fields (tokens_per_s), to a
# reference written by an earlier commit.
#   scripts/same-metrics.sh record DIR    # on the commit before the change
#   scripts/same-metrics.sh check DIR     # after it: exit 1 and the first difference if any
# Uses target/release/trainer; build it first (cargo build --release -p trainer).
set -euo pipefail
mode=${1:?record or check}; ref=${2:?a directory for the reference metrics}
trainer=${TRAINER:-target/release/trainer}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for cfg in demo tiny llama-demo; do
  "$trainer" --config "configs/$cfg.toml" --set train.steps=20 --set "log.dir=\"$out/$cfg\"" \
    > "$out/$cfg.log" 2>&1 || { echo "$cfg: the run failed:"; tail -3 "$out/$cfg.log"; exit 1; }
  # Timing is the only field allowed to differ.
  sed -E 's/"tokens_per_s":[^,}]*,?//' "$out/$cfg/metrics.jsonl" > "$out/$cfg.metrics"
  case $mode in
    record) mkdir -p "$ref"; cp "$out/$cfg.metrics" "$ref/$cfg.metrics"; echo "$cfg: recorded" ;;
    check)
      if cmp -s "$ref/$cfg.metrics" "$out/$cfg.metrics"; then
        echo "$cfg: $(wc -l < "$out/$cfg.metrics") lines identical"
      else
        echo "$cfg: differs"; diff "$ref/$cfg.metrics" "$out/$cfg.metrics" | head -4; status=1
      fi ;;
    *) echo "mode is record or check" >&2; exit 2 ;;
  esac
done
exit $status
