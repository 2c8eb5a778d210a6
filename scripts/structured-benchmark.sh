#!/usr/bin/env bash
# Structured sparse attention against full attention (docs/structured-attention.md):
#
# 1. quality and speed: each config of configs/attention/ named in KINDS trained like full
#    attention (the baby character model, context 64, 1000 steps) with two seeds, evaluated on
#    the first 131,072 validation characters;
# 2. cost growth: `variorum bench-attention` on one layer of each (d_model 256, batch 1): forward
#    + backward time and peak memory at L = 1k … 16k, and decoding one token after 1k, 4k and
#    16k tokens of context; sliding-window (w = 256) beside them as the cheapest fixed pattern.
#
# Writes OUT/results.tsv (run, seed, params, train tokens/s, validation loss),
# OUT/<name>-s<seed>/ (a finished run is not trained again) and OUT/bench/ (tables, JSON, plots).
#
# Environment:
#   OUT               where results go (default runs/structured)
#   SEEDS             space-separated seeds (default "1337 7")
#   KINDS             config names of configs/attention/ (default "full bpt")
#   LENGTHS           comma-separated lengths (default 1024,…,16384)
#   SKIP_BENCH=1, SKIP_TRAIN=1   leave out a part
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/structured}"
SEEDS="${SEEDS:-1337 7}"
KINDS="${KINDS:-full bpt}"
LENGTHS="${LENGTHS:-1024,2048,4096,8192,16384}"
EVAL_TOKENS="${EVAL_TOKENS:-131072}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

build_and_fetch
mkdir -p "$OUT/configs"

if [[ -z ${SKIP_TRAIN:-} ]]; then
  printf 'run\tseed\tparams\ttrain_tokens_per_s\tval_loss\n' >"$OUT/results.tsv"
  # seeds interleaved, so that the machine's drift falls on every kind alike
  for seed in $SEEDS; do
    for r in $(family_members configs/attention "$KINDS"); do
      train_seeded configs/attention "$r" "$seed" "$OUT"
    done
  done
  column -t -s $'\t' "$OUT/results.tsv"
fi

if [[ -z ${SKIP_BENCH:-} ]]; then
  say "one layer of each, with sliding-window (w = 256) beside them"
  configs=()
  for r in $KINDS sliding-window; do configs+=("configs/attention/$r.toml"); done
  "$BIN" bench-attention "${configs[@]}" --out "$OUT/bench" --lengths "$LENGTHS" \
    --contexts 1024,4096,16384 | tee "$OUT/bench.txt"
fi
