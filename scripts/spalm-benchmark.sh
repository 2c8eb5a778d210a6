#!/usr/bin/env bash
# SPALM on Complete Shakespeare (docs/retrieval.md):
#
# 1. trains configs/retrieval/knn-baby-shakespeare-char.toml (the pretrained model whose states
#    are the keys and the queries) into runs/knn-baby-shakespeare-char, and builds its datastore
#    over the training split (`variorum datastore build`), unless both exist;
# 2. searches both splits' neighbour tables (`variorum datastore neighbours`, K per position);
# 3. trains configs/retrieval/spalm-baby-shakespeare-char.toml (Transformer-XL with the long-term
#    memory) and spalm-baby-xl-only.toml (the same model without it: the baseline);
# 4. scores both on the whole validation split as 16 ordered streams (`variorum eval`): the
#    SPALM run with and without retrieval, the baseline with and without its XL memory.
#
# Writes OUT/results.tsv (run, loss with, loss without, predictions, training tokens/s) and the
# runs and logs under OUT.
#
# Environment:
#   OUT  where results go (default runs/spalm)
#   K    neighbours searched per position (default 8; the model reads its model.long_term_memory.k)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/spalm}"
K="${K:-8}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

build_and_fetch
mkdir -p "$OUT"
# the datastore the SPALM config names (data.neighbours)
ENCODER=runs/knn-baby-shakespeare-char
STORE=$ENCODER/datastore-train
train_once configs/retrieval/knn-baby-shakespeare-char.toml "$ENCODER" "$OUT/encoder.log"
if [[ ! -f $STORE/index.usearch ]]; then
  say "datastore over the training split"
  "$BIN" datastore build "$ENCODER" >"$OUT/datastore.log"
fi
say "neighbour tables (k = $K)"
"$BIN" datastore neighbours "$STORE" --k "$K" >"$OUT/neighbours.log"
train_once configs/retrieval/spalm-baby-shakespeare-char.toml "$OUT/spalm" "$OUT/spalm.log"
train_once configs/retrieval/spalm-baby-xl-only.toml "$OUT/xl-only" "$OUT/xl-only.log"

printf 'run\tloss_with\tloss_without\tpredictions\ttokens_per_sec\n' >"$OUT/results.tsv"
for run in spalm xl-only; do
  say "$run scored"
  "$BIN" eval "$OUT/$run" >"$OUT/$run.eval"
  tps=$(python3 -c "import json;print(round(json.load(open('$OUT/$run/summary.json'))['tokens_per_sec']))")
  awk -v run="$run" -v tps="$tps" '$1 == 64 { printf "%s\t%s\t%s\t%s\t%s\n", run, $3, $4, $2, tps }' \
    "$OUT/$run.eval" >>"$OUT/results.tsv"
done
cat "$OUT/results.tsv"
