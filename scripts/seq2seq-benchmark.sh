#!/usr/bin/env bash
# Encoder–decoder models (docs/encoder-decoder.md):
#
# 1. paired text: each config of configs/seq2seq/reverse*.toml (words and their reversals)
#    trained with two seeds; `variorum eval` on the 300 held-out words: loss per target token,
#    chrF of the greedy and 4-beam decodes, and the words reversed exactly;
# 2. span corruption on Complete Shakespeare (configs/seq2seq/span-shakespeare.toml): one run,
#    its loss per target token and chrF of the restored spans;
# 3. decoding: `variorum generate --source` on the span model with the encoder output and the
#    cross-attention keys/values kept (default) against --no-cache (encoder and prefix again for
#    every token), interleaved, REPS times each; the median tokens/s of each.
#
# Writes OUT/results.tsv, OUT/span.tsv, OUT/decoding.tsv and the runs under OUT.
#
# Environment:
#   OUT               where results go (default runs/seq2seq)
#   SEEDS             space-separated seeds (default "1337 7")
#   REPS              decoding repetitions (default 5)
#   SKIP_PAIRS=1, SKIP_SPAN=1, SKIP_DECODING=1   leave out a part
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-runs/seq2seq}"
SEEDS="${SEEDS:-1337 7}"
REPS="${REPS:-5}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

build_and_fetch
mkdir -p "$OUT/configs"

# the eval table's data row: examples, target tokens, loss, perplexity, decoded, chrF
eval_row() { "$BIN" eval "$@" | awk '$1 ~ /^[0-9]+$/ { print $3 "\t" $6; exit }'; }

if [[ -z ${SKIP_PAIRS:-} ]]; then
  printf 'config\tseed\tparams\ttrain_tokens_per_s\tval_loss\tchrF_greedy\tchrF_4_beams\texact\n' >"$OUT/results.tsv"
  for seed in $SEEDS; do
    for r in reverse reverse-cross-linear reverse-cross-performer reverse-post-ln; do
      name="$r-s$seed"
      printf 'extends = "%s"\n\n[train]\nseed = %s\n' "$ROOT/configs/seq2seq/$r.toml" "$seed" >"$OUT/configs/$name.toml"
      train_once "$OUT/configs/$name.toml" "$OUT/$name" "$OUT/$name.log"
      greedy=$(eval_row "$OUT/$name" --decode 300)
      beams=$(eval_row "$OUT/$name" --decode 300 --beams 4 | cut -f2)
      # held-out words reversed exactly (greedy)
      exact=$(tail -n 300 configs/seq2seq/reverse.tsv | while IFS=$'\t' read -r src tgt; do
        [[ $("$BIN" generate "$OUT/$name" --source "$src" --temperature 0 2>/dev/null) == "$tgt" ]] && echo 1
      done | wc -l)
      python3 - "$OUT/$name/summary.json" "$r" "$seed" "$greedy" "$beams" "$exact" >>"$OUT/results.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
loss, chrf = sys.argv[4].split("\t")
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{s['params']}\t{s['tokens_per_sec']:.0f}\t{loss}\t{chrf}\t{sys.argv[5]}\t{sys.argv[6]}/300")
PY
    done
  done
  column -t -s $'\t' "$OUT/results.tsv"
fi

if [[ -z ${SKIP_SPAN:-} ]]; then
  train_once configs/seq2seq/span-shakespeare.toml "$OUT/span-shakespeare" "$OUT/span-shakespeare.log"
  printf 'run\tparams\ttrain_tokens_per_s\tval_loss\tchrF_greedy\n' >"$OUT/span.tsv"
  row=$(eval_row "$OUT/span-shakespeare" --decode 320)
  python3 - "$OUT/span-shakespeare/summary.json" "$row" >>"$OUT/span.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"span-shakespeare\t{s['params']}\t{s['tokens_per_sec']:.0f}\t" + sys.argv[2])
PY
  column -t -s $'\t' "$OUT/span.tsv"
fi

if [[ -z ${SKIP_DECODING:-} ]]; then
  run="$OUT/span-shakespeare"
  # a source of 120 characters (the span model's context is 128)
  src=$(head -c 2000 data/shakespeare/input.txt | tr '\n' ' ' | cut -c 1-120)
  : >"$OUT/decoding.raw"
  for _ in $(seq "$REPS"); do
    for mode in cached no-cache; do
      flag=(); [[ $mode == no-cache ]] && flag=(--no-cache)
      "$BIN" generate "$run" --source "$src" --temperature 0 --max-new-tokens 127 "${flag[@]}" 2>&1 >/dev/null |
        awk -v m="$mode" '/tokens\/s/ { print m "\t" $1 "\t" $6 }' >>"$OUT/decoding.raw"
    done
  done
  python3 - "$OUT/decoding.raw" >"$OUT/decoding.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines() if l]
print("mode\ttokens_written\tmedian_tokens_per_s\truns")
for mode in ("cached", "no-cache"):
    r = [x for x in rows if x[0] == mode]
    print(f"{mode}\t{r[0][1]}\t{statistics.median(float(x[2]) for x in r):.1f}\t{len(r)}")
PY
  column -t -s $'\t' "$OUT/decoding.tsv"
fi
