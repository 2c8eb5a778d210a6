#!/usr/bin/env bash
# Graph-masked attention (docs/graph-attention.md):
#
# 1. quality and speed: each config of configs/graph/ (the min-trees example, masked objective)
#    trained with two seeds and evaluated on every validation example with its graph;
# 2. cost growth: `variorum bench-attention` on one layer (d_model 256, batch 1, bidirectional)
#    with a seeded random graph of DEGREE reads per position: `graph` (gathered neighbours, dot
#    and additive) against full attention masked densely by the same graph, and plain causal full
#    attention without a graph (its fused kernel, a second call), forward + backward time and
#    peak memory.
#
# Writes OUT/results.tsv (run, seed, params, train tokens/s, validation loss),
# OUT/<name>-s<seed>/ (a finished run is not trained again) and OUT/bench/ (tables, JSON, plots).
#
# Environment:
#   OUT               where results go (default runs/graph)
#   SEEDS             space-separated seeds (default "1337 7")
#   KINDS             config names of configs/graph/ (default: all)
#   LENGTHS           comma-separated lengths (default 1024,…,16384)
#   DEGREE            reads per position of the benchmark's graph (default 8)
#   SKIP_BENCH=1, SKIP_TRAIN=1   leave out a part
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/graph}"
SEEDS="${SEEDS:-1337 7}"
KINDS="${KINDS:-}"
LENGTHS="${LENGTHS:-1024,2048,4096,8192,16384}"
DEGREE="${DEGREE:-8}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

say "building variorum"
cargo test --release --workspace --no-run >&2
mkdir -p "$OUT/configs"

if [[ -z ${SKIP_TRAIN:-} ]]; then
  printf 'run\tseed\tparams\ttrain_tokens_per_s\tval_loss\n' >"$OUT/results.tsv"
  # seeds interleaved, so that the machine's drift falls on every config alike
  for seed in $SEEDS; do
    for r in base $(family_members configs/graph "$KINDS"); do
      train_seeded configs/graph "$r" "$seed" "$OUT"
    done
  done
  column -t -s $'\t' "$OUT/results.tsv"
fi

if [[ -z ${SKIP_BENCH:-} ]]; then
  say "one layer, a random graph of $DEGREE reads per position"
  bench="$OUT/bench-configs"
  mkdir -p "$bench"
  # d_model 256 for the layer; the masked objective runs it bidirectionally, as in training
  for r in base additive full; do cp "configs/graph/$r.toml" "$bench/graph-$r.toml"; done
  sed -i "s#extends = \"base.toml\"#extends = \"$ROOT/configs/graph/base.toml\"#" "$bench"/*.toml
  mv "$bench/graph-base.toml" "$bench/graph-dot.toml"
  mv "$bench/graph-full.toml" "$bench/full-graph-masked.toml"
  # plain full attention, no graph: the same layer on the fused kernel
  printf 'extends = "%s"\n\n[model.attention]\nkind = "full"\nn_heads = 4\n\n[model.objective]\nkind = "causal"\n' \
    "$ROOT/configs/graph/base.toml" >"$bench/full-causal-no-graph.toml"
  "$BIN" bench-attention "$bench/graph-dot.toml" "$bench/graph-additive.toml" "$bench/full-graph-masked.toml" \
    --out "$OUT/bench" --lengths "$LENGTHS" --contexts 1024 --graph-degree "$DEGREE" | tee "$OUT/bench.txt"
  # without --graph-degree: no graph on the mask, so full attention takes its fused kernel
  "$BIN" bench-attention "$bench/full-causal-no-graph.toml" --out "$OUT/bench-plain" --lengths "$LENGTHS" \
    --contexts 1024 | tee -a "$OUT/bench.txt"
fi
