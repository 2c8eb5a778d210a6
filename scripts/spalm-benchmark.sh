#!/usr/bin/env bash
# SPALM on Complete Shakespeare (docs/retrieval.md):
#
# 1. trains configs/retrieval/knn-baby-shakespeare-char.toml (the pretrained model whose states
#    are the keys and the queries) into runs/knn-baby-shakespeare-char, and builds its datastore
#    over the training split (`variorum datastore build`), unless both exist;
# 2. searches both splits' neighbour tables (`variorum datastore neighbours`, 8 per position,
#    the training split leaving out the entries within R of each position's own);
# 3. trains configs/retrieval/spalm-baby-shakespeare-char.toml (Transformer-XL with the long-term
#    memory) once for each k in KS (model.long_term_memory.k), and spalm-baby-xl-only.toml (the
#    same model without it: the baseline);
# 4. scores every run on the whole validation split as 16 ordered streams (`variorum eval`): the
#    SPALM runs with and without retrieval, the baseline with and without its XL memory.
#
# Writes OUT/results.tsv (run, loss with, loss without, predictions, training tokens/s) and the
# runs and logs under OUT.
#
# Environment:
#   OUT  where results go (default runs/spalm)
#   KS   neighbours the SPALM models read (default "4 8")
#   R    exclusion radius of the training table (default 0: a position's own entry alone). The
#        tables live in the datastore's directory: to search them with another R, remove
#        runs/knn-baby-shakespeare-char/datastore-train/neighbours-* first (the docs' ±65,536
#        rows used a second directory of links to the same datastore files)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/spalm}"
KS="${KS:-4 8}"
R="${R:-0}"
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
say "neighbour tables (k = 8, radius $R)"
"$BIN" datastore neighbours "$STORE" --k 8 --exclude-radius "$R" >"$OUT/neighbours.log"
runs=()
for k in $KS; do
  cfg="$OUT/spalm-k$k.toml"
  printf 'extends = "%s"\n\n[model.long_term_memory]\nk = %s\n' \
    "$ROOT/configs/retrieval/spalm-baby-shakespeare-char.toml" "$k" >"$cfg"
  train_once "$cfg" "$OUT/spalm-k$k" "$OUT/spalm-k$k.log"
  runs+=("spalm-k$k")
done
train_once configs/retrieval/spalm-baby-xl-only.toml "$OUT/xl-only" "$OUT/xl-only.log"
runs+=(xl-only)

printf 'run\tloss_with\tloss_without\tpredictions\ttokens_per_sec\n' >"$OUT/results.tsv"
for run in "${runs[@]}"; do
  say "$run scored"
  "$BIN" eval "$OUT/$run" >"$OUT/$run.eval"
  tps=$(python3 -c "import json;print(round(json.load(open('$OUT/$run/summary.json'))['tokens_per_sec']))")
  awk -v run="$run" -v tps="$tps" '$1 == 64 { printf "%s\t%s\t%s\t%s\t%s\n", run, $3, $4, $2, tps }' \
    "$OUT/$run.eval" >>"$OUT/results.tsv"
done
cat "$OUT/results.tsv"
