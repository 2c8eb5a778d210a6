#!/usr/bin/env bash
# Token mixers against softmax attention (docs/mixers.md):
#
# 1. quality and speed: each mixer config trained like full attention (the baby character model,
#    context 64, 1000 steps) with two seeds, and evaluated on the first 131,072 validation
#    characters: next-token mixers from configs/attention/, FNet and the bidirectional forms from
#    configs/masked/ (the masked objective);
# 2. cost growth: `variorum bench-attention` on one layer of each (d_model 256, batch 1): forward +
#    backward time and peak memory at L = 1k … 16k (the Hopfield mixer, which forms `steps` L × L
#    matrices per head and keeps them for the backward, and the bidirectional set, whose full
#    attention is composed, to 8k), and decoding one token after 1k,
#    4k, 16k tokens of context for the causal ones.
#
# Writes OUT/results.tsv (family, run, seed, params, train tokens/s, validation loss),
# OUT/<family>-<name>-s<seed>/ (a finished run is not trained again) and OUT/bench-*/ (tables,
# JSON, plots).
#
# Environment:
#   OUT               where results go (default runs/mixers)
#   SEEDS             space-separated seeds (default "1337 7")
#   CAUSAL, MASKED    space-separated config names of configs/attention/ and configs/masked/
#   LENGTHS           comma-separated lengths (default 1024,…,16384)
#   SKIP_BENCH=1, SKIP_TRAIN=1   leave out a part
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/mixers}"
SEEDS="${SEEDS:-1337 7}"
CAUSAL="${CAUSAL:-full gmlp amlp mlp-mixer lightweight-conv dynamic-conv hopfield hopfield-lookup}"
MASKED="${MASKED:-full fnet gmlp mlp-mixer}"
LENGTHS="${LENGTHS:-1024,2048,4096,8192,16384}"
EVAL_TOKENS="${EVAL_TOKENS:-131072}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

build_and_fetch
mkdir -p "$OUT/configs"

if [[ -z ${SKIP_TRAIN:-} ]]; then
  printf 'family\trun\tseed\tparams\ttrain_tokens_per_s\tval_loss\n' >"$OUT/results.tsv"
  # seeds interleaved, so that the machine's drift falls on every kind alike
  for seed in $SEEDS; do
    for family in attention masked; do
      names=$CAUSAL
      [[ $family == masked ]] && names=$MASKED
      for r in $names; do
        train_seeded "configs/$family" "$r" "$seed" "$OUT" "$family"
      done
    done
  done
  column -t -s $'\t' "$OUT/results.tsv"
fi

if [[ -z ${SKIP_BENCH:-} ]]; then
  say "one layer of each causal mixer"
  causal=()
  for r in $CAUSAL; do [[ $r == hopfield ]] || causal+=("configs/attention/$r.toml"); done
  "$BIN" bench-attention "${causal[@]}" --out "$OUT/bench-causal" --lengths "$LENGTHS" \
    --contexts 1024,4096,16384 | tee "$OUT/bench-causal.txt"
  short=$(tr ',' '\n' <<<"$LENGTHS" | awk '$1 <= 8192' | paste -sd,)
  if [[ " $CAUSAL " == *" hopfield "* ]]; then
    say "the Hopfield mixer beside full attention, to 8k"
    "$BIN" bench-attention configs/attention/full.toml configs/attention/hopfield.toml --out "$OUT/bench-hopfield" \
      --lengths "$short" --contexts 1024,4096 | tee "$OUT/bench-hopfield.txt"
  fi
  say "one layer of each bidirectional mixer"
  masked=()
  for r in $MASKED; do masked+=("configs/masked/$r.toml"); done
  # bidirectional full attention is the composed path (L x L matrices: 5.3 GiB at 8k): to 8k
  "$BIN" bench-attention "${masked[@]}" --out "$OUT/bench-masked" --lengths "$short" --contexts 1024 |
    tee "$OUT/bench-masked.txt"
fi
