#!/usr/bin/env bash
# The position-encoding experiment: the baby character GPT (configs/positions/base.toml) trained
# at context 64 once per position scheme (every other file in configs/positions/), then every run
# evaluated at longer contexts with disjoint windows over the validation split. The ALiBi paper's
# claim to test: ALiBi degrades least beyond the training length, sinusoidal degrades sharply.
#
# Writes OUT/<scheme>/ (the runs; a finished run is not trained again), OUT/train.tsv (params,
# training tokens/s, validation loss at 64), OUT/eval.txt (loss per context) and OUT/eval.png.
#
# Environment:
#   OUT               where runs and results go (default runs/positions)
#   LENGTHS           comma-separated evaluation contexts (default 64,128,256,512)
#   EVAL_TOKENS       validation tokens scored at each context (default 131072, the first ones)
#   SCHEMES           space-separated config names to run (default: all of configs/positions/)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/positions}"
LENGTHS="${LENGTHS:-64,128,256,512}"
EVAL_TOKENS="${EVAL_TOKENS:-131072}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

SCHEMES=$(family_members configs/positions "${SCHEMES:-}")
build_and_fetch
mkdir -p "$OUT"
runs=()
for s in $SCHEMES; do
  runs+=("$OUT/$s")
  train_once "configs/positions/$s.toml" "$OUT/$s" "$OUT/$s.log"
done

printf 'scheme\tparams\ttrain_tokens_per_s\tval_loss\n' >"$OUT/train.tsv"
for s in $SCHEMES; do
  python3 - "$OUT/$s/summary.json" "$s" >>"$OUT/train.tsv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}\t{r['params']}\t{r['tokens_per_sec']:.0f}\t{r['final_val_loss']:.4f}")
PY
done

say "evaluating at $LENGTHS"
"$BIN" eval "${runs[@]}" --seq-len "$LENGTHS" --max-tokens "$EVAL_TOKENS" --plot "$OUT/eval.png" | tee "$OUT/eval.txt"
column -t -s $'\t' "$OUT/train.tsv"
