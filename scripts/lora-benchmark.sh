#!/usr/bin/env bash
# Issue 60 point 4: LoRA (r = 8 and 16, α = 2r, every projection adapted: q, k, v, out, up,
# gate, down) against full fine-tuning, from the same base run: training tokens/s, peak resident
# memory, and the validation loss after the same steps. The three alternate, REPS rounds; the
# medians of tokens/s and memory are reported (the losses are the same in every round: one seed).
#
# Usage: scripts/lora-benchmark.sh [CONFIG] [BASE_STEPS] [STEPS] [REPS]
#   CONFIG      the base's config (default configs/llama-baby-shakespeare-char.toml); every run
#               fine-tunes on its data with its train settings (learning rate included)
#   BASE_STEPS  steps of the base run (default 500); STEPS of each fine-tuning (default 200)
# Needs a release build of the binary (VARIORUM, default $CARGO_TARGET_DIR/release/variorum).
set -euo pipefail
CONFIG=$(realpath "${1:-configs/llama-baby-shakespeare-char.toml}")
BASE_STEPS=${2:-500}
STEPS=${3:-200}
REPS=${4:-2}
BIN=${VARIORUM:-${CARGO_TARGET_DIR:-target}/release/variorum}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u +%F); $(basename "$CONFIG"), base $BASE_STEPS steps, fine-tuning $STEPS steps, $REPS rounds"
"$BIN" train "$CONFIG" --out "$WORK/base" --max-steps "$BASE_STEPS" --no-progress --no-report 2> /dev/null
printf 'extends = "%s"\n' "$CONFIG" > "$WORK/full.toml"
for r in 8 16; do
  printf 'extends = "%s"\n[train.lora]\nrank = %d\nalpha = %d\ntargets = ["q", "k", "v", "out", "up", "gate", "down"]\n' \
    "$CONFIG" "$r" $((2 * r)) > "$WORK/lora-r$r.toml"
done
for rep in $(seq "$REPS"); do
  for v in full lora-r8 lora-r16; do
    "$BIN" train "$WORK/$v.toml" --init-from "$WORK/base" --out "$WORK/$v-$rep" --max-steps "$STEPS" \
      --no-progress --no-report 2> "$WORK/$v-$rep.log"
  done
done
python3 - "$WORK" "$REPS" <<'PY'
import json, re, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
base = json.load(open(f"{work}/base/summary.json"))
print(f"base: validation loss {base['final_val_loss']:.4f}, {base['params']} parameters")
print("| fine-tuning | trained parameters | tokens/s (median) | peak RSS MiB (median) | validation loss |")
print("|---|---|---|---|---|")
for v in ["full", "lora-r8", "lora-r16"]:
    runs = [json.load(open(f"{work}/{v}-{i}/summary.json")) for i in range(1, reps + 1)]
    log = open(f"{work}/{v}-1.log").read()
    m = re.search(r"training (\d+) (LoRA adapter )?parameters", log)
    losses = sorted({round(r["final_val_loss"], 6) for r in runs})
    print(f"| {v} | {m.group(1)} | {statistics.median(r['tokens_per_sec'] for r in runs):,.0f} "
          f"| {statistics.median(r['peak_rss_mib'] for r in runs):.0f} | {', '.join(f'{l:.4f}' for l in losses)} |")
PY
