#!/usr/bin/env bash
# variorum against PyTorch on one GPU, back to back in one run (docs/gpu.md):
#   1. one attention layer, forward + backward (d_model 256, 4 heads, batch 1, causal), time and
#      device memory: `variorum bench-attention --device $DEVICE` for full attention and two
#      efficient kinds against scripts/reference/attention_layer.py --device cuda
#      (scaled_dot_product_attention);
#   2. training throughput of the baby and small character GPTs: `variorum train --device $DEVICE`
#      against scripts/reference/train_gpt.py --device cuda, eager and torch.compile'd.
# Needs a built variorum (BIN) and Python with PyTorch on a CUDA machine; the corpus in data/.
#
# Environment:
#   BIN      the variorum binary (default target/release/variorum)
#   OUT      where the logs and results go (default runs/gpu-bench)
#   DEVICE   variorum's device (default wgpu)
#   LENGTHS  the attention layer's sequence lengths (default 1024,4096,16384,32768)
#   STEPS    training steps of each run (default 300; the small GPT runs a third of them)
#   PYTHON   the interpreter with torch (default python3)
#   SKIP_TORCH=1  variorum's side alone (the PyTorch figures of an earlier run stand)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${BIN:-target/release/variorum}"
OUT="${OUT:-runs/gpu-bench}"
DEVICE="${DEVICE:-wgpu}"
LENGTHS="${LENGTHS:-1024,4096,16384,32768}"
STEPS="${STEPS:-300}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
say() { echo "== $(date +%T) $*"; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  lscpu | grep -m1 "Model name"
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
} | tee "$OUT/machine.txt"

say "attention layer: variorum ($DEVICE)"
"$BIN" bench-attention configs/attention/full.toml configs/attention/sliding-window.toml \
  configs/attention/performer.toml --device "$DEVICE" --lengths "$LENGTHS" --contexts 1024,16384 \
  --tokens 32 --reps 3 --out "$OUT/attention" 2>&1 | tee "$OUT/attention.log"

say "attention layer: PyTorch (cuda)"
: >"$OUT/torch-attention.jsonl"
[[ "${SKIP_TORCH:-0}" == 1 ]] && LENGTHS_TORCH="" || LENGTHS_TORCH="${LENGTHS//,/ }"
for len in $LENGTHS_TORCH; do
  "$PYTHON" scripts/reference/attention_layer.py --device cuda --len "$len" --reps 3 2>&1 |
    grep '^RESULT ' | sed 's/^RESULT //' | tee -a "$OUT/torch-attention.jsonl"
done

train() { # size config steps reference-args...
  local size=$1 config=$2 steps=$3
  shift 3
  say "training $size: variorum ($DEVICE), $steps steps"
  rm -rf "$OUT/train-$size"
  "$BIN" train "$config" --device "$DEVICE" --out "$OUT/train-$size" --max-steps "$steps" \
    >"$OUT/variorum-$size.log" 2>&1
  tail -n 3 "$OUT/variorum-$size.log"
  [[ "${SKIP_TORCH:-0}" == 1 ]] && return
  for mode in eager compiled; do
    say "training $size: PyTorch (cuda, $mode), $steps steps"
    "$PYTHON" scripts/reference/train_gpt.py --device cuda --max_iters "$steps" \
      --eval_interval $((steps / 5)) "$@" $([[ $mode == compiled ]] && echo --compile) \
      >"$OUT/torch-$size-$mode.log" 2>&1
    grep '^RESULT ' "$OUT/torch-$size-$mode.log" | sed 's/^RESULT //' >"$OUT/torch-$size-$mode.json"
  done
}
train baby configs/gpt-baby-shakespeare-char.toml "$STEPS"
train small configs/gpt-small-shakespeare-char.toml $((STEPS / 3)) \
  --n_layer 6 --n_head 6 --n_embd 384 --block_size 256 --batch_size 64

say "summary"
"$PYTHON" - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for size in ["baby", "small"]:
    try:
        v = json.loads((out / f"train-{size}" / "summary.json").read_text())
        row = {"variorum": v.get("tokens_per_sec"), "variorum_val": v.get("final_val_loss")}
        for mode in ["eager", "compiled"]:
            t = json.loads((out / f"torch-{size}-{mode}.json").read_text())
            row[mode] = t["tokens_per_sec"]
            row[mode + "_mib"] = t.get("device_mib")
        row["ratio_eager"] = row["variorum"] / row["eager"]
        row["ratio_compiled"] = row["variorum"] / row["compiled"]
        print(size, json.dumps(row))
    except Exception as e:  # one failed side leaves the others' figures
        print(size, "incomplete:", e)
PY
