#!/usr/bin/env bash
# The memory experiment: the same small character model (configs/memory/base.toml: 4 × 128,
# Transformer-XL relative positions, segments of 64, 12 ordered streams, 1000 steps) trained
# (a) without memory, (b) with an XL memory of 64, (c) compressive 32 + 32 at rate 2, (d) adaptive
# span up to 256, (e) GTrXL with an XL memory of 64. Each run is then evaluated on the
# validation split read as 16 ordered streams, with its memory carried from segment to segment
# and without it (`variorum eval`), and (d)'s learned spans are printed (`variorum inspect`).
#
# Writes OUT/<name>/ (a finished run is not trained again), OUT/<name>.eval, OUT/results.tsv and
# OUT/spans.txt.
#
# Environment:
#   OUT               where runs and results go (default runs/memory)
#   RUNS              space-separated config names (default: all of configs/memory/ but base)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/memory}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

RUNS=$(family_members configs/memory "${RUNS:-}")
build_and_fetch
mkdir -p "$OUT"
for r in $RUNS; do
  train_once "configs/memory/$r.toml" "$OUT/$r" "$OUT/$r.log"
  say "$r: evaluating"
  "$BIN" eval "$OUT/$r" --seq-len 64 >"$OUT/$r.eval"
done

printf 'run\tparams\ttrain_tokens_per_s\tval_with_memory\tval_without_memory\n' >"$OUT/results.tsv"
for r in $RUNS; do
  python3 - "$OUT/$r/summary.json" "$OUT/$r.eval" "$r" >>"$OUT/results.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
rows = [l.split() for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")]
seg = next(r for r in rows if r[0] == "64")
# memory runs print: segment tokens with without gain; the others: seq_len stride tokens loss …
with_m, without = (seg[2], seg[3]) if len(seg) == 5 else (seg[3], seg[3])
print(f"{sys.argv[3]}\t{s['params']}\t{s['tokens_per_sec']:.0f}\t{with_m}\t{without}")
PY
done
: >"$OUT/spans.txt"
for r in $RUNS; do
  if grep -q 'adaptive-span' "$OUT/$r/config.toml"; then
    { echo "# $r"; "$BIN" inspect "$OUT/$r" | grep -A100 'learned spans'; } >>"$OUT/spans.txt"
  fi
done
column -t -s $'\t' "$OUT/results.tsv"
cat "$OUT/spans.txt"
