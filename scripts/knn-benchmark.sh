#!/usr/bin/env bash
# kNN-LM on Complete Shakespeare (docs/retrieval.md):
#
# 1. trains configs/retrieval/knn-baby-shakespeare-char.toml;
# 2. builds datastores over the first SIZES tokens of the training split and over all of it
#    (`variorum datastore build`; build time and size on disk of each);
# 3. scores the first VAL_TOKENS tokens of the validation split with each datastore
#    (`variorum eval --knn`): the loss alone and mixed, for every k in KS and λ in LAMBDAS, at each
#    temperature in TEMPERATURES; with the full datastore also the index's recall@k against exact
#    search and the search latency at each ef in EFS.
#
# Writes OUT/build.tsv, OUT/knn.tsv, OUT/search.tsv and the run under OUT.
#
# Environment:
#   OUT           where results go (default runs/retrieval)
#   SIZES         training tokens of the smaller datastores (default "100000 1000000")
#   VAL_TOKENS    validation tokens scored (default 100000)
#   KS, LAMBDAS   comma-separated (default 1,8,32,64,128 and 0.05,0.1,0.2,0.3,0.5)
#   TEMPERATURES  space-separated (default "1 3 10")
#   EFS           space-separated HNSW ef, at least k = 64 (default "64 128 256 512")
#   EF            HNSW ef of the scoring runs (default 128)
#   RECALL        queries searched exactly for the recall (default 500)
#   EXACT_TOKENS  validation tokens scored with exact search and with HNSW, for the cost of the
#                 approximation (default 2000; 0 leaves it out: exact search of 4.55 M keys takes
#                 ~26 ms per query)
#   SKIP_BUILD=1, SKIP_KNN=1, SKIP_SEARCH=1   leave out a part (the later parts need the datastores)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/retrieval}"
SIZES="${SIZES:-100000 1000000}"
VAL_TOKENS="${VAL_TOKENS:-100000}"
KS="${KS:-1,8,32,64,128}"
LAMBDAS="${LAMBDAS:-0.05,0.1,0.2,0.3,0.5}"
TEMPERATURES="${TEMPERATURES:-1 3 10}"
EFS="${EFS:-64 128 256 512}"
RECALL="${RECALL:-500}"
EF="${EF:-128}"
EXACT_TOKENS="${EXACT_TOKENS:-2000}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

build_and_fetch
mkdir -p "$OUT"
RUN="$OUT/knn-baby"
train_once configs/retrieval/knn-baby-shakespeare-char.toml "$RUN" "$OUT/train.log"

# build_store NAME [--max-tokens N]: prints "entries seconds MiB"
build_store() {
  local name=$1; shift
  local dir="$RUN/$name" start end
  start=$(date +%s.%N)
  "$BIN" datastore build "$RUN" --out "$dir" "$@" >"$OUT/$name.log"
  end=$(date +%s.%N)
  local entries
  entries=$(python3 -c "import json;print(json.load(open('$dir/datastore.json'))['entries'])")
  printf '%s\t%s\t%.1f\t%.0f\n' "$name" "$entries" "$(python3 -c "print($end - $start)")" "$(du -sm "$dir" | cut -f1)"
}

stores=()
for n in $SIZES; do stores+=("ds-$n"); done
stores+=(ds-train)
if [[ -z ${SKIP_BUILD:-} ]]; then
  printf 'datastore\tentries\tbuild_s\tMiB\n' >"$OUT/build.tsv"
  for n in $SIZES; do
    say "datastore over the first $n training tokens"
    rm -rf "$RUN/ds-$n"
    build_store "ds-$n" --max-tokens "$n" >>"$OUT/build.tsv"
  done
  say "datastore over the whole training split"
  rm -rf "$RUN/ds-train"
  build_store ds-train >>"$OUT/build.tsv"
  cat "$OUT/build.tsv"
fi

# the eval table's rows: k lambda tokens loss perplexity
[[ -z ${SKIP_KNN:-} ]] && printf 'datastore\ttemperature\tk\tlambda\tloss\n' >"$OUT/knn.tsv"
for s in "${stores[@]}"; do
  [[ -n ${SKIP_KNN:-} ]] && break
  for t in $TEMPERATURES; do
    say "$s, T = $t"
    "$BIN" eval "$RUN" --max-tokens "$VAL_TOKENS" --knn "$RUN/$s" --knn-k "$KS" --knn-lambda "$LAMBDAS" \
      --knn-temperature "$t" --knn-ef "$EF" | tee "$OUT/eval-$s-T$t.log" |
      awk -v s="$s" -v t="$t" '$1 ~ /^[0-9-]+$/ && NF == 5 { print s "\t" t "\t" $1 "\t" $2 "\t" $4 }' >>"$OUT/knn.tsv"
  done
done

[[ -n ${SKIP_SEARCH:-} ]] && exit 0
printf 'ef\trecall\tms_per_query\n' >"$OUT/search.tsv"
for ef in $EFS; do
  say "search at ef $ef"
  "$BIN" eval "$RUN" --max-tokens "$VAL_TOKENS" --knn "$RUN/ds-train" --knn-k 64 --knn-lambda 0.2 \
    --knn-ef "$ef" --knn-recall "$RECALL" >"$OUT/search-ef$ef.log"
  recall=$(awk '/recall@/ { print $(NF-3) }' "$OUT/search-ef$ef.log")
  ms=$(awk '/ms per query/ { for (i = 1; i <= NF; i++) if ($i == "ms") print $(i-1) }' "$OUT/search-ef$ef.log")
  printf '%s\t%s\t%s\n' "$ef" "$recall" "$ms" >>"$OUT/search.tsv"
done
cat "$OUT/search.tsv"

if [[ $EXACT_TOKENS -gt 0 ]]; then
  printf 'search\tms_per_query\tloss\n' >"$OUT/exact.tsv"
  for search in exact hnsw; do
    args=(--knn-exact)
    [[ $search == hnsw ]] && args=(--knn-ef "$EF")
    say "the first $EXACT_TOKENS validation tokens, $search search"
    "$BIN" eval "$RUN" --max-tokens "$EXACT_TOKENS" --knn "$RUN/ds-train" --knn-k 64 --knn-lambda 0.5 \
      --knn-temperature 3 "${args[@]}" >"$OUT/exact-$search.log"
    ms=$(awk '/ms per query/ { for (i = 1; i <= NF; i++) if ($i == "ms") print $(i-1) }' "$OUT/exact-$search.log")
    loss=$(awk '$1 == "64" && NF == 5 { print $4 }' "$OUT/exact-$search.log")
    printf '%s\t%s\t%s\n' "$search" "$ms" "$loss" >>"$OUT/exact.tsv"
  done
  cat "$OUT/exact.tsv"
fi
