#!/usr/bin/env bash
# The scores-and-heads family (docs/scores-and-heads.md) against full attention: each config of
# configs/attention/ named in RUNS trained alike (the baby character model, context 64, 1000
# steps) with two seeds, evaluated on the first 131,072 validation characters; one plot of the
# seed-1337 runs' loss against the evaluation context; training tokens/s from `variorum bench`
# (medians of 3 runs of 20 steps, ROUNDS rounds interleaved over the configs).
#
# Writes OUT/<name>-s<seed>/ (a finished run is not trained again), OUT/results.tsv,
# OUT/bench.tsv, OUT/eval.txt and OUT/eval.png.
#
# Environment:
#   OUT     where results go (default runs/scores-and-heads)
#   RUNS    space-separated config names of configs/attention (default: the family and full)
#   SEEDS   default "1337 2";  ROUNDS  bench rounds (default 2);  SKIP_BENCH=1 leaves them out
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FAMILY=configs/attention
OUT="${OUT:-runs/scores-and-heads}"
EVAL_TOKENS="${EVAL_TOKENS:-131072}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

RUNS=$(family_members "$FAMILY" "${RUNS:-full talking-heads realformer lazyformer evolving gaussian-prior synthesizer synthesizer-random synthesizer-mixture collaborative hard-coded-gaussian full-relu full-sigmoid full-sparsemax full-entmax full-head-temperature}")
SEEDS="${SEEDS:-1337 2}"
build_and_fetch
mkdir -p "$OUT/configs"

printf 'run\tparams\ttrain_tokens_per_s\tval_loss\n' >"$OUT/results.tsv"
for seed in $SEEDS; do
  for r in $RUNS; do
    # a config that differs from the shipped one in its seed alone
    printf 'extends = "%s"\n\n[train]\nseed = %s\n' "$ROOT/$FAMILY/$r.toml" "$seed" >"$OUT/configs/$r-s$seed.toml"
    train_and_eval "$OUT/configs" "$r-s$seed" "$OUT"
  done
done
column -t -s $'\t' "$OUT/results.tsv"

first=${SEEDS%% *}
runs=()
for r in $RUNS; do runs+=("$OUT/$r-s$first"); done
"$BIN" eval "${runs[@]}" --seq-len 16,32,64 --max-tokens "$EVAL_TOKENS" --plot "$OUT/eval.png" | tee "$OUT/eval.txt"

if [[ -z ${SKIP_BENCH:-} ]]; then
  printf 'round\trun\ttokens_per_s\tpeak_rss_mib\n' >"$OUT/bench.tsv"
  for round in $(seq "${ROUNDS:-2}"); do
    for r in $RUNS; do
      say "bench $r (round $round)"
      "$BIN" bench "$FAMILY/$r.toml" --steps 20 --runs 3 --json |
        python3 -c '
import json, sys
j = json.load(sys.stdin)
print(sys.argv[1], sys.argv[2], round(j["median_tokens_per_sec"]), round(j.get("peak_rss_mib", 0), 1), sep="\t")
' "$round" "$r" >>"$OUT/bench.tsv"
    done
  done
  column -t -s $'\t' "$OUT/bench.tsv"
fi
