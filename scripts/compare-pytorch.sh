#!/usr/bin/env bash
# Train the same character model with a PyTorch reference and with variorum, one after the other
# (interleaved), RUNS times, and compare training throughput (tokens/s, median of
# the runs), peak resident memory (median) and final validation loss (first run).
#
# Sizes (SIZE):
#   baby   configs/gpt-baby-shakespeare-char.toml  — 4 layers × 4 heads × 128, context 64, batch 12
#   small  configs/gpt-small-shakespeare-char.toml — 6 layers × 6 heads × 384, context 256, batch 64
#   llama  configs/llama-baby-shakespeare-char.toml — the baby size with rotary positions, RMSNorm,
#          SwiGLU (d_ff 512) and 2 key/value heads; the reference is x-transformers with the same
#          recipe (scripts/reference/train_xtransformers.py), the others scripts/reference/train_gpt.py
#
# Environment:
#   SIZE              baby (default), small or llama
#   ITERS             training iterations for both (default 2000 for baby, 10 for small)
#   RUNS              runs of each side (default 1); tokens/s and peak memory are their medians
#   OUT               where compare.json and the logs go (default runs/compare-pytorch-$SIZE)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
#   PYTORCH_THREADS   torch.set_num_threads for the reference (default 2)
#   PYTHON            interpreter used to create the virtualenv (default python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/reference/prepare.sh

SIZE="${SIZE:-baby}"
case "$SIZE" in
  baby) CONFIG="configs/gpt-baby-shakespeare-char.toml"; REF_ARGS=(); DEFAULT_ITERS=2000
    REF_SCRIPT="scripts/reference/train_gpt.py" ;;
  llama) CONFIG="configs/llama-baby-shakespeare-char.toml"; REF_ARGS=(); DEFAULT_ITERS=2000
    REF_SCRIPT="scripts/reference/train_xtransformers.py" ;;
  small)
    CONFIG="configs/gpt-small-shakespeare-char.toml"
    REF_ARGS=(--n_layer 6 --n_head 6 --n_embd 384 --block_size 256 --batch_size 64 --eval_interval 5)
    REF_SCRIPT="scripts/reference/train_gpt.py"
    DEFAULT_ITERS=10 ;;
  *) echo "error: SIZE must be baby, small or llama, got '$SIZE'" >&2; exit 2 ;;
esac
ITERS="${ITERS:-$DEFAULT_ITERS}"
RUNS="${RUNS:-1}"
OUT="${OUT:-runs/compare-pytorch-$SIZE}"

for v in ITERS RUNS; do
  case "${!v}" in
    '' | *[!0-9]* | 0) echo "error: $v must be a positive integer, got '${!v}'" >&2; exit 2 ;;
  esac
done

# 1. Reference virtualenv with torch.
ensure_reference_venv

# 2. Corpus.
ensure_corpus

# 3. variorum.
say "building variorum (release)"
cargo test --release --workspace --no-run
if [[ ! -x "$BIN" ]]; then
  echo "error: $BIN not found after the build" >&2
  exit 1
fi

mkdir -p "$OUT"
RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/variorum-compare.XXXXXX")"
trap 'rm -rf "$RUN_DIR"' EXIT

# 4. Both trainings, one after the other (never concurrently: they would share the cores).
# /usr/bin/time -f %M: the peak resident set of each process, KiB.
for run in $(seq 1 "$RUNS"); do
  say "PyTorch reference ($SIZE), run $run/$RUNS: $ITERS iterations"
  /usr/bin/time -f '%M' -o "$OUT/pytorch-$run.rss" "$VENV/bin/python" "$REF_SCRIPT" \
    --data "$DATA" --max_iters "$ITERS" --threads "$PYTORCH_THREADS" "${REF_ARGS[@]}" | tee "$OUT/pytorch-$run.log"
  grep '^RESULT ' "$OUT/pytorch-$run.log" | tail -n 1 | sed 's/^RESULT //' >"$OUT/pytorch-$run.json"
  if [[ ! -s "$OUT/pytorch-$run.json" ]]; then
    echo "error: the reference printed no RESULT line (see $OUT/pytorch-$run.log)" >&2
    exit 1
  fi

  say "variorum ($SIZE), run $run/$RUNS: $ITERS steps"
  rm -rf "$RUN_DIR/run"
  /usr/bin/time -f '%M' -o "$OUT/variorum-$run.rss" \
    "$BIN" train "$CONFIG" --out "$RUN_DIR/run" --max-steps "$ITERS" 2>&1 | tee "$OUT/variorum-$run.log"
  if [[ ! -f "$RUN_DIR/run/summary.json" ]]; then
    echo "error: variorum wrote no summary.json (see $OUT/variorum-$run.log)" >&2
    exit 1
  fi
  cp "$RUN_DIR/run/summary.json" "$OUT/variorum-$run.json"
done

# 5. Table and compare.json.
python3 - "$OUT" "$RUNS" "$ITERS" "$SIZE" <<'PY'
import json
import statistics
import sys

out, runs, iters, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def load(side, run):
    with open(f"{out}/{side}-{run}.json") as f:
        result = json.load(f)
    with open(f"{out}/{side}-{run}.rss") as f:
        result["peak_rss_mib"] = int(f.read().split()[-1]) / 1024
    return result


ref = [load("pytorch", r) for r in range(1, runs + 1)]
var = [load("variorum", r) for r in range(1, runs + 1)]
ref_tps = [float(r["tokens_per_sec"]) for r in ref]
var_tps = [float(r["tokens_per_sec"]) for r in var]
ref_mib = [r["peak_rss_mib"] for r in ref]
var_mib = [r["peak_rss_mib"] for r in var]
ref_loss, var_loss = float(ref[0]["val_loss"]), float(var[0]["final_val_loss"])
med = statistics.median
result = {
    "size": size,
    "iters": iters,
    "runs": runs,
    "pytorch": {
        "tokens_per_sec": med(ref_tps),
        "tokens_per_sec_runs": ref_tps,
        "peak_rss_mib": med(ref_mib),
        "val_loss": ref_loss,
        "params": ref[0].get("params"),
        "torch": ref[0].get("torch"),
        "threads": ref[0].get("threads"),
    },
    "variorum": {
        "tokens_per_sec": med(var_tps),
        "tokens_per_sec_runs": var_tps,
        "peak_rss_mib": med(var_mib),
        "val_loss": var_loss,
        "steps": var[0].get("steps"),
    },
    "tokens_per_sec_ratio": med(var_tps) / med(ref_tps),
    "peak_rss_ratio": med(var_mib) / med(ref_mib),
    "val_loss_diff": var_loss - ref_loss,
}
with open(f"{out}/compare.json", "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")

print()
print(f"{size}, {iters} steps, {runs} run(s) each")
print(f"{'':28}{'PyTorch':>14}{'variorum':>14}")
print(f"{'tokens/s (median)':28}{med(ref_tps):>14,.0f}{med(var_tps):>14,.0f}")
print(f"{'peak RSS MiB (median)':28}{med(ref_mib):>14,.0f}{med(var_mib):>14,.0f}")
print(f"{'final val loss (run 1)':28}{ref_loss:>14.4f}{var_loss:>14.4f}")
print()
print(f"tokens/s ratio variorum / PyTorch: {result['tokens_per_sec_ratio']:.3f}")
print(f"peak memory ratio variorum / PyTorch: {result['peak_rss_ratio']:.3f}")
print(f"val loss difference variorum - PyTorch: {var_loss - ref_loss:+.4f}")
print(f"written: {out}/compare.json")
PY
