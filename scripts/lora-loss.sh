#!/usr/bin/env bash
# Issue 60 point 4, the loss: from one base run, full fine-tuning and LoRA (r = 8, α = 16, every
# projection adapted) for the same STEPS, each at its own learning rates (a sweep: LoRA usually
# wants a higher rate, B starting at zero), and the validation loss each reaches on the held-out
# tenth of the data (the same text for every run: the config's split, one seed).
#
# Usage: scripts/lora-loss.sh [CONFIG] [BASE_STEPS] [STEPS]
#   FULL_LRS (default "3e-4 1e-3 3e-3") and LORA_LRS (default "1e-3 3e-3 1e-2") in the environment.
set -euo pipefail
CONFIG=$(realpath "${1:-configs/llama-baby-shakespeare-char.toml}")
BASE_STEPS=${2:-500}
STEPS=${3:-200}
FULL_LRS=${FULL_LRS:-3e-4 1e-3 3e-3}
LORA_LRS=${LORA_LRS:-1e-3 3e-3 1e-2}
BIN=${VARIORUM:-${CARGO_TARGET_DIR:-target}/release/variorum}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u +%F); $(basename "$CONFIG"), base $BASE_STEPS steps, fine-tuning $STEPS steps"
"$BIN" train "$CONFIG" --out "$WORK/base" --max-steps "$BASE_STEPS" --no-progress --no-report 2> /dev/null
echo "| fine-tuning | lr | validation loss | tokens/s |"
echo "|---|---|---|---|"
run() { # name lr extra
  printf 'extends = "%s"\n[train]\nlr = %s\nmin_lr = %s\n%s' "$CONFIG" "$2" "$(python3 -c "print($2 / 10)")" "$3" > "$WORK/$1-$2.toml"
  "$BIN" train "$WORK/$1-$2.toml" --init-from "$WORK/base" --out "$WORK/$1-$2" --max-steps "$STEPS" --no-progress --no-report 2> /dev/null
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"| $1 | $2 | {s['final_val_loss']:.4f} | {s['tokens_per_sec']:,.0f} |\")" "$WORK/$1-$2/summary.json"
}
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"| (base) | | {s['final_val_loss']:.4f} | |\")" "$WORK/base/summary.json"
for lr in $FULL_LRS; do run full "$lr" ""; done
for lr in $LORA_LRS; do
  run lora-r8 "$lr" $'[train.lora]\nrank = 8\nalpha = 16\ntargets = ["q", "k", "v", "out", "up", "gate", "down"]\n'
done
