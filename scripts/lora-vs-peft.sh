#!/usr/bin/env bash
# Issue 60 point 4 at ~125 M parameters: LoRA (r = 8 and 16, α = 2r, q, k, v, out, up, down)
# and full fine-tuning with variorum, against the same with PEFT + transformers on the same
# cores, in one run: tokens/s (median of the steps after the first) and peak resident memory.
# The model is GPT-2 small's shape with random weights, made by transformers (as in
# scripts/hf-125m.sh) and brought in by `variorum import`; every run is STEPS steps of one
# 1,024-token window of the shakespeare dataset, AdamW at lr 1e-4. The five set-ups alternate,
# REPS rounds; medians are reported.
#
# Usage: scripts/lora-vs-peft.sh [STEPS] [REPS]   (needs the venv of
# scripts/reference/requirements.txt in $VENV, default .venv-reference, with peft; the
# shakespeare dataset; a release build of the binary)
set -euo pipefail
STEPS=${1:-8}
REPS=${2:-1}
VENV=${VENV:-.venv-reference}
BIN=${VARIORUM:-${CARGO_TARGET_DIR:-target}/release/variorum}
WORK=${WORK:-$(mktemp -d)}
PY="$VENV/bin/python"

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u +%F); $STEPS steps of 1024 tokens, $REPS rounds"
if [ ! -d "$WORK/hf" ]; then
  "$PY" scripts/lib/gpt2_125m.py "$WORK/hf" > /dev/null
  "$BIN" import "$WORK/hf" --out "$WORK/base" > /dev/null
fi
train='[train]
steps = '"$STEPS"'
batch_size = 1
warmup_steps = 1
lr = 1e-4
min_lr = 1e-5
eval_interval = '"$STEPS"'
eval_batches = 2
log_interval = 1
checkpoint_interval = '"$STEPS"'
sample_tokens = 0'
printf 'extends = "%s"\n%s\n' "$WORK/base/config.toml" "$train" > "$WORK/full.toml"
for r in 8 16; do
  printf 'extends = "%s"\n%s\n[train.lora]\nrank = %d\nalpha = %d\ntargets = ["q", "k", "v", "out", "up", "down"]\n' \
    "$WORK/base/config.toml" "$train" "$r" $((2 * r)) > "$WORK/lora-r$r.toml"
done
for rep in $(seq "$REPS"); do
  for v in full lora-r8 lora-r16; do
    rm -rf "$WORK/$v-$rep"
    "$BIN" train "$WORK/$v.toml" --init-from "$WORK/base" --out "$WORK/$v-$rep" --no-progress --no-report 2> "$WORK/$v-$rep.log"
    python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(json.dumps({'tokens_per_sec': s['tokens_per_sec'], 'peak_rss_mib': s['peak_rss_mib']}))" \
      "$WORK/$v-$rep/summary.json" > "$WORK/variorum-$v-$rep.json"
    echo "variorum $v: $(cat "$WORK/variorum-$v-$rep.json")"
  done
  for r in 0 8 16; do
    "$PY" scripts/reference/peft_train.py "$WORK/hf" "$r" "$STEPS" 2> /dev/null > "$WORK/peft-$r-$rep.json"
    echo "transformers r=$r: $(cat "$WORK/peft-$r-$rep.json")"
  done
done
python3 - "$WORK" "$REPS" <<'PY'
import json, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
med = lambda xs: statistics.median(xs)
rows = {}
for name, files in [("variorum full", "variorum-full"), ("variorum LoRA r = 8", "variorum-lora-r8"),
                    ("variorum LoRA r = 16", "variorum-lora-r16"), ("transformers full", "peft-0"),
                    ("PEFT LoRA r = 8", "peft-8"), ("PEFT LoRA r = 16", "peft-16")]:
    runs = [json.load(open(f"{work}/{files}-{i}.json")) for i in range(1, reps + 1)]
    rows[name] = (med([r["tokens_per_sec"] for r in runs]), med([r["peak_rss_mib"] for r in runs]))
print("| fine-tuning | tokens/s (median) | peak RSS MiB (median) |")
print("|---|---|---|")
for name, (tps, rss) in rows.items():
    print(f"| {name} | {tps:.1f} | {rss:,.0f} |")
for r in (8, 16):
    v, p = rows[f"variorum LoRA r = {r}"], rows[f"PEFT LoRA r = {r}"]
    print(f"r = {r}: variorum / PEFT tokens/s = {v[0] / p[0]:.2f}, peak memory = {v[1] / p[1]:.2f}")
PY
