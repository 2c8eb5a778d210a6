#!/usr/bin/env bash
# Train the same baby-Shakespeare character GPT with the PyTorch reference
# (scripts/reference/train_gpt.py) and with variorum
# (configs/gpt-baby-shakespeare-char.toml), one after the other, and compare
# training throughput (tokens/s) and final validation loss.
#
# Environment:
#   ITERS             training iterations for both (default 2000)
#   OUT               where compare.json and the logs go (default runs/compare-pytorch)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
#   PYTORCH_THREADS   torch.set_num_threads for the reference (default 2)
#   PYTHON            interpreter used to create the virtualenv (default python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/reference/prepare.sh

ITERS="${ITERS:-2000}"
OUT="${OUT:-runs/compare-pytorch}"
CONFIG="configs/gpt-baby-shakespeare-char.toml"

case "$ITERS" in
  '' | *[!0-9]*) echo "error: ITERS must be a positive integer, got '$ITERS'" >&2; exit 2 ;;
esac

# 1. Reference virtualenv with torch.
ensure_reference_venv

# 2. Corpus.
ensure_corpus

# 3. variorum.
say "building variorum (release)"
cargo build --release -p variorum-cli
if [[ ! -x "$BIN" ]]; then
  echo "error: $BIN not found after the build" >&2
  exit 1
fi

mkdir -p "$OUT"
RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/variorum-compare.XXXXXX")"
trap 'rm -rf "$RUN_DIR"' EXIT

# 4. Both trainings, one after the other (never concurrently: they would share the cores).
say "PyTorch reference: $ITERS iterations"
"$VENV/bin/python" scripts/reference/train_gpt.py \
  --data "$DATA" --max_iters "$ITERS" --threads "$PYTORCH_THREADS" | tee "$OUT/pytorch.log"
grep '^RESULT ' "$OUT/pytorch.log" | tail -n 1 | sed 's/^RESULT //' >"$OUT/pytorch.json"
if [[ ! -s "$OUT/pytorch.json" ]]; then
  echo "error: the reference printed no RESULT line (see $OUT/pytorch.log)" >&2
  exit 1
fi

say "variorum: $ITERS steps"
"$BIN" train "$CONFIG" --out "$RUN_DIR" --max-steps "$ITERS" 2>&1 | tee "$OUT/variorum.log"
if [[ ! -f "$RUN_DIR/summary.json" ]]; then
  echo "error: variorum wrote no $RUN_DIR/summary.json (see $OUT/variorum.log)" >&2
  exit 1
fi
cp "$RUN_DIR/summary.json" "$OUT/variorum-summary.json"

# 5. Table and compare.json.
python3 - "$OUT/pytorch.json" "$OUT/variorum-summary.json" "$OUT/compare.json" "$ITERS" <<'PY'
import json
import sys

ref_path, var_path, out_path, iters = sys.argv[1:5]
with open(ref_path) as f:
    ref = json.load(f)
with open(var_path) as f:
    var = json.load(f)

ref_tps = float(ref["tokens_per_sec"])
ref_loss = float(ref["val_loss"])
var_tps = float(var["tokens_per_sec"])
var_loss = float(var["final_val_loss"])

result = {
    "iters": int(iters),
    "pytorch": {
        "tokens_per_sec": ref_tps,
        "val_loss": ref_loss,
        "train_loss": ref.get("train_loss"),
        "params": ref.get("params"),
        "iters": ref.get("iters"),
        "torch": ref.get("torch"),
        "threads": ref.get("threads"),
    },
    "variorum": {
        "tokens_per_sec": var_tps,
        "val_loss": var_loss,
        "steps": var.get("steps"),
    },
    "tokens_per_sec_ratio": var_tps / ref_tps if ref_tps > 0 else None,
    "val_loss_diff": var_loss - ref_loss,
}
with open(out_path, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")

ratio = result["tokens_per_sec_ratio"]
print()
print(f"{'':24}{'PyTorch':>14}{'variorum':>14}")
print(f"{'tokens/s (median)':24}{ref_tps:>14,.0f}{var_tps:>14,.0f}")
print(f"{'final val loss':24}{ref_loss:>14.4f}{var_loss:>14.4f}")
print(f"{'steps':24}{str(ref.get('iters')):>14}{str(var.get('steps')):>14}")
print()
print(f"tokens/s ratio variorum / PyTorch: {ratio:.3f}" if ratio is not None else "tokens/s ratio: n/a")
print(f"val loss difference variorum - PyTorch: {var_loss - ref_loss:+.4f}")
print(f"written: {out_path}")
PY
