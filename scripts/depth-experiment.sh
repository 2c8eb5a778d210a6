#!/usr/bin/env bash
# Adaptive depth: a 6-block stack, a Universal Transformer (one block, 6 steps) and a Universal
# Transformer with Adaptive Computation Time (at most 6 steps), trained alike
# (configs/depth/base.toml), then evaluated on the validation split at context 64; the ACT
# model's steps per token are printed by `variorum eval`; post-LN variants (the paper's wiring) and a
# stack with an exit after every block, whose CALM loss/compute curve `variorum early-exit` draws.
#
# Writes OUT/<name>/ (a finished run is not trained again), OUT/<name>.eval and OUT/results.tsv.
#
# Environment:
#   OUT               where runs and results go (default runs/depth)
#   RUNS              space-separated config names (default: all of configs/depth/ but base)
#   EVAL_TOKENS       validation tokens to evaluate (default 131072)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/depth}"
EVAL_TOKENS="${EVAL_TOKENS:-131072}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

RUNS=$(family_members configs/depth "${RUNS:-}")
build_and_fetch
mkdir -p "$OUT"
printf 'run\tparams\ttrain_tokens_per_s\tval_loss\tsteps\n' >"$OUT/results.tsv"
for r in $RUNS; do
  train_once "configs/depth/$r.toml" "$OUT/$r" "$OUT/$r.log"
  "$BIN" eval "$OUT/$r" --max-tokens "$EVAL_TOKENS" >"$OUT/$r.eval"
  python3 - "$OUT/$r/summary.json" "$OUT/$r.eval" "$r" >>"$OUT/results.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
lines = open(sys.argv[2]).read().splitlines()
loss = next(l.split()[3] for l in lines if l.strip() and not l.startswith("#") and l.split()[0].isdigit())
steps = next((l.split(": ", 1)[1] for l in lines if "adaptive computation time" in l), "")
print(f"{sys.argv[3]}\t{s['params']}\t{s['tokens_per_sec']:.0f}\t{loss}\t{steps}")
PY
done
for r in $RUNS; do
  if grep -q 'every-layer' "$OUT/$r/config.toml"; then
    say "$r: early-exit curve"
    "$BIN" early-exit "$OUT/$r" --max-tokens 2048 --plot "$OUT/$r.early-exit.png" >"$OUT/$r.early-exit"
    cat "$OUT/$r.early-exit"
  fi
done
column -t -s $'\t' "$OUT/results.tsv"
