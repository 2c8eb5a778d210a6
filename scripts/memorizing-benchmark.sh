#!/usr/bin/env bash
# The Memorizing Transformer on Complete Shakespeare (docs/retrieval.md):
#
# 1. trains configs/retrieval/memorizing-baby-shakespeare-char.toml (a memory of 65,536
#    positions per work in the third layer) and memorizing-baby-local-only.toml (the same model
#    with a memory of 0: the baseline);
# 2. scores the validation split's works document by document (`variorum eval`: each row reads
#    whole works, its memory emptied where the next starts), the memory model at every memory
#    size in SIZES (`--set model.attention.memory_size=N`), and the baseline.
#
# Writes OUT/memory-size.tsv (run, memory size, loss carrying the state — the kNN memory and the
# XL cache —, loss of the same segments each read from nothing, predictions scored) and the runs
# under OUT. The memory's own worth is a size's loss against size 0's (which keeps the XL cache).
#
# Environment:
#   OUT         where results go (default runs/memorizing)
#   SIZES       memory sizes the trained model is scored with (default "0 1024 4096 16384 65536")
#   VAL_TOKENS  validation tokens scored (default: all of them)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/memorizing}"
SIZES="${SIZES:-0 1024 4096 16384 65536}"
VAL_TOKENS="${VAL_TOKENS:-}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

build_and_fetch
mkdir -p "$OUT"
train_once configs/retrieval/memorizing-baby-shakespeare-char.toml "$OUT/memorizing-64k" "$OUT/memorizing-64k.log"
train_once configs/retrieval/memorizing-baby-local-only.toml "$OUT/local-only" "$OUT/local-only.log"

limit=()
[[ -n $VAL_TOKENS ]] && limit=(--max-tokens "$VAL_TOKENS")
# score RUN SIZE [eval options]: one line "run size with without predictions"
score() {
  local run=$1 size=$2; shift 2
  "$BIN" eval "$OUT/$run" --seq-len 64 ${limit[@]+"${limit[@]}"} "$@" |
    awk -v run="$run" -v size="$size" '$1 == 64 { printf "%s\t%s\t%s\t%s\t%s\n", run, size, $3, $4, $2 }'
}
{
  printf 'run\tmemory_size\tloss_carrying_state\tloss_each_segment_alone\tpredictions\n'
  for size in $SIZES; do
    say "memorizing-64k scored with a memory of $size"
    score memorizing-64k "$size" --set "model.attention.memory_size=$size"
  done
  say "local-only scored"
  score local-only 0
} | tee "$OUT/memory-size.tsv"
