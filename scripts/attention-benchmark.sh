#!/usr/bin/env bash
# Linear-time attention against full attention, both ways the papers measure it:
#
# 1. efficiency: `variorum bench-attention` on one layer of each config of configs/attention/
#    (d_model 256, 4 heads, batch 1): forward + backward time and peak memory at L = 1k … 16k,
#    and the cost of decoding one token after 1k, 4k, 16k tokens of context;
# 2. quality: each config trained alike (the baby character model, context 64, 1000 steps) and
#    evaluated on the first 131,072 validation characters.
#
# Writes OUT/bench/ (attention-bench.md, .json and four PNGs: time, peak memory, memory needed,
# decoding), OUT/<name>/ (a finished run is not trained again), OUT/<name>.eval and
# OUT/results.tsv.
#
# Environment:
#   FAMILY            the config directory (default configs/attention; configs/masked holds the
#                     masked-LM family, where the kinds without a causal form train)
#   OUT               where results go (default runs/<family name>)
#   RUNS              space-separated config names (default: all of FAMILY but base)
#   LENGTHS, CONTEXTS comma-separated lengths (defaults 1024,…,16384 and 1024,4096,16384)
#   COMPOSED=1        also measure every point with the CPU kernels off (bench-attention
#                     --composed: each kind's composed path) into OUT/bench-composed/
#   SKIP_BENCH=1, SKIP_TRAIN=1, SKIP_REFERENCE=1   leave out a part (the reference is PyTorch's
#                     scaled_dot_product_attention at the same lengths, one layer and the
#                     attention alone, causal and with a dense sliding-window mask of 256, into
#                     OUT/bench/pytorch.tsv; it installs torch into .venv-reference)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FAMILY="${FAMILY:-configs/attention}"
OUT="${OUT:-runs/$(basename "$FAMILY")}"
EVAL_TOKENS="${EVAL_TOKENS:-131072}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

RUNS=$(family_members "$FAMILY" "${RUNS:-}")
build_and_fetch
mkdir -p "$OUT"

if [[ -z ${SKIP_BENCH:-} ]]; then
  say "benchmarking one layer of each kind"
  configs=()
  for r in $RUNS; do configs+=("$FAMILY/$r.toml"); done
  "$BIN" bench-attention "${configs[@]}" --out "$OUT/bench" \
    --lengths "${LENGTHS:-1024,2048,4096,8192,16384}" --contexts "${CONTEXTS:-1024,4096,16384}" |
    tee "$OUT/bench.txt"
fi

if [[ -z ${SKIP_BENCH:-} && -n ${COMPOSED:-} ]]; then
  say "benchmarking the same points with the CPU kernels off"
  "$BIN" bench-attention "${configs[@]}" --composed --out "$OUT/bench-composed" \
    --lengths "${LENGTHS:-1024,2048,4096,8192,16384}" --contexts "${CONTEXTS:-1024,4096,16384}" |
    tee "$OUT/bench-composed.txt"
fi

if [[ -z ${SKIP_REFERENCE:-} ]]; then
  say "PyTorch's scaled_dot_product_attention at the same lengths (one process per point)"
  (
    source scripts/reference/prepare.sh
    ensure_reference_venv
    mkdir -p "$OUT/bench"
    printf 'mode\twindow\tlen\tms\tpeak_mib\ttorch\n' >"$OUT/bench/pytorch.tsv"
    IFS=, read -ra lengths <<<"${LENGTHS:-1024,2048,4096,8192,16384}"
    for mode in layer attention; do
      for window in 0 256; do
        for len in "${lengths[@]}"; do
          "$VENV/bin/python" scripts/reference/attention_layer.py --mode "$mode" --window "$window" --len "$len" \
            --threads "$PYTORCH_THREADS" | grep '^RESULT ' | sed 's/^RESULT //' |
            "$VENV/bin/python" -c 'import json, sys
r = json.loads(sys.stdin.read())
print("\t".join(str(r[k]) if not isinstance(r[k], float) else f"{r[k]:.1f}" for k in ["mode", "window", "len", "ms", "peak_mib", "torch"]))' |
            tee -a "$OUT/bench/pytorch.tsv"
        done
      done
    done
  )
fi

if [[ -z ${SKIP_TRAIN:-} ]]; then
  printf 'run\tparams\ttrain_tokens_per_s\tval_loss\n' >"$OUT/results.tsv"
  for r in $RUNS; do
    train_and_eval "$FAMILY" "$r" "$OUT"
  done
  column -t -s $'\t' "$OUT/results.tsv"
fi
