#!/usr/bin/env bash
# Reversible blocks against the ordinary stack (configs/reversible/):
#
# 1. memory: `variorum bench` (peak resident memory and training tokens/s of whole training
#    steps, synthetic tokens) of the base model at context 2048, batch 1, with 2, 4, 8 and 16
#    blocks — ordinary pre-LN, reversible, reversible with a chunked feed-forward; each point in
#    a fresh process;
# 2. quality: each config of configs/reversible/ trained alike and evaluated on the first
#    131,072 validation characters.
#
# Writes OUT/memory.tsv, OUT/<name>/, OUT/<name>.eval and OUT/results.tsv.
#
# Environment:
#   OUT               where results go (default runs/reversible)
#   DEPTHS            space-separated block counts (default "2 4 8 16")
#   LEN               context of the memory benchmark (default 2048)
#   SKIP_BENCH=1, SKIP_TRAIN=1   leave out a part
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/reversible}"
EVAL_TOKENS="${EVAL_TOKENS:-131072}"
LEN="${LEN:-2048}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

build_and_fetch
mkdir -p "$OUT/configs"

if [[ -z ${SKIP_BENCH:-} ]]; then
  say "training memory against depth at context $LEN"
  printf 'block\tn_layers\tpeak_rss_mib\ttokens_per_s\n' >"$OUT/memory.tsv"
  for variant in pre-ln reversible reversible-chunked; do
    for n in ${DEPTHS:-2 4 8 16}; do
      cfg="$OUT/configs/$variant-$n.toml"
      cat >"$cfg" <<TOML
extends = "$ROOT/configs/reversible/$variant.toml"

[model]
n_layers = $n
seq_len = $LEN

[train]
batch_size = 1
TOML
      "$BIN" bench "$cfg" --steps 2 --warmup 1 --runs 1 --json >"$OUT/configs/$variant-$n.json"
      python3 - "$OUT/configs/$variant-$n.json" "$variant" "$n" >>"$OUT/memory.tsv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{r['peak_rss_mib']:.0f}\t{r['median_tokens_per_sec']:.0f}")
PY
      tail -n 1 "$OUT/memory.tsv" >&2
    done
  done
  column -t -s $'\t' "$OUT/memory.tsv"
fi

if [[ -z ${SKIP_TRAIN:-} ]]; then
  printf 'run\tparams\ttrain_tokens_per_s\tval_loss\n' >"$OUT/results.tsv"
  for r in $(family_members configs/reversible "${RUNS:-}"); do
    train_and_eval configs/reversible "$r" "$OUT"
  done
  column -t -s $'\t' "$OUT/results.tsv"
fi
