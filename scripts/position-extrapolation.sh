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
say() { printf '==> %s\n' "$*" >&2; }

if [[ -z "${SCHEMES:-}" ]]; then
  SCHEMES=$(for f in configs/positions/*.toml; do n=$(basename "$f" .toml); [[ $n == base ]] || echo "$n"; done)
fi
for s in $SCHEMES; do
  [[ -f configs/positions/$s.toml ]] || { echo "error: no configs/positions/$s.toml" >&2; exit 2; }
done
[[ -f data/shakespeare/input.txt ]] || bash datasets/shakespeare/fetch.sh

say "building variorum"
cargo build --release -p variorum-cli >&2
mkdir -p "$OUT"

runs=()
for s in $SCHEMES; do
  run="$OUT/$s"
  runs+=("$run")
  if [[ -f $run/summary.json ]]; then
    say "$s: already trained"
    continue
  fi
  say "$s: training"
  resume=()
  [[ -d $run ]] && resume=(--resume)
  "$BIN" train "configs/positions/$s.toml" --out "$run" --no-progress "${resume[@]}" >"$OUT/$s.log" 2>&1 ||
    { echo "error: training $s failed; the end of $OUT/$s.log:" >&2; tail -n 3 "$OUT/$s.log" >&2; exit 1; }
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
