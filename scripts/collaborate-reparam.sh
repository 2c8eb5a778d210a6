#!/usr/bin/env bash
# Collaborative heads from a trained model (Cordonnier et al. 2020, §4: re-parameterise, then
# fine-tune): `variorum collaborate` turns the trained `full` baby model of
# scripts/scores-and-heads.sh (SOURCE) into collaborative heads of each width in DIMS, evaluates
# each at once, fine-tunes it for STEPS steps, and evaluates again; `full` itself is fine-tuned
# alike as the control (the extra steps alone lower the loss).
#
# Writes OUT/d<N>/ (converted), OUT/d<N>-ft/ (fine-tuned), OUT/full-ft/ and OUT/results.tsv.
#
# Environment:
#   SOURCE  a trained full-attention run (default runs/scores-and-heads/full-s1337)
#   OUT     default runs/collaborate;  DIMS  default "128 64 32";  STEPS  default 200
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SOURCE="${SOURCE:-runs/scores-and-heads/full-s1337}"
OUT="${OUT:-runs/collaborate}"
DIMS="${DIMS:-128 64 32}"
STEPS="${STEPS:-200}"
EVAL_TOKENS="${EVAL_TOKENS:-131072}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

[[ -f $SOURCE/model.bpk ]] || { echo "error: $SOURCE is not a finished run (train it with scripts/scores-and-heads.sh)" >&2; exit 2; }
build_and_fetch
mkdir -p "$OUT"

# the loss on the first EVAL_TOKENS validation tokens at the model's context
loss() { "$BIN" eval "$1" --max-tokens "$EVAL_TOKENS" | awk '!/^#/ && $1 ~ /^[0-9]+$/ { print $4; exit }'; }

# finetune RUN OUT_RUN: STEPS more steps from RUN's weights, a short warmup and a decay to a tenth
finetune() {
  local from=$1 to=$2
  [[ -f $to/summary.json ]] && return
  rm -rf "$to"
  printf 'extends = "%s"\n\n[train]\nsteps = %s\nwarmup_steps = 20\nlr = 3e-4\nmin_lr = 3e-5\neval_interval = %s\ncheckpoint_interval = %s\n' \
    "$ROOT/$from/config.toml" "$STEPS" "$STEPS" "$STEPS" >"$OUT/$(basename "$to").toml"
  say "$(basename "$to"): fine-tuning $STEPS steps"
  "$BIN" train "$OUT/$(basename "$to").toml" --init-from "$from" --out "$to" --no-progress >"$to.log" 2>&1
}

printf 'run\tshared_dim\tattention_params\tloss_converted\tloss_finetuned\n' >"$OUT/results.tsv"
finetune "$SOURCE" "$OUT/full-ft"
for d in $DIMS; do
  if [[ ! -f $OUT/d$d/model.bpk ]]; then
    rm -rf "$OUT/d$d"
    "$BIN" collaborate "$SOURCE" --out "$OUT/d$d" --shared-dim "$d" | tee "$OUT/d$d.txt"
  fi
  finetune "$OUT/d$d" "$OUT/d$d-ft"
  params=$(awk '/^attention parameters/ { print $5; exit }' "$OUT/d$d.txt")
  printf 'd%s\t%s\t%s\t%s\t%s\n' "$d" "$d" "$params" "$(loss "$OUT/d$d")" "$(loss "$OUT/d$d-ft")" >>"$OUT/results.tsv"
done
first=${DIMS%% *}
printf 'full\t-\t%s\t%s\t%s\n' "$(awk '/^attention parameters/ { print $3; exit }' "$OUT/d$first.txt")" \
  "$(loss "$SOURCE")" "$(loss "$OUT/full-ft")" >>"$OUT/results.tsv"
column -t -s $'\t' "$OUT/results.tsv"
