#!/usr/bin/env bash
# Issue 53 point 6 on a GPT-2-small-shaped model (124 M parameters, random weights, f32): how long
# `variorum import` takes and its peak resident memory against the f32 weights' size, and greedy
# generation with the KV cache against transformers' `generate` on the same cores, in one run.
#
# Decoding speed is measured without loading: each side generates 1 and N new tokens from the
# same prompt, and (t_N - t_1) / (N - 1) is the time per token; the two sides alternate, REPS times,
# and the medians are reported. The tokens must be identical.
#
# Usage: scripts/hf-125m.sh [N] [REPS]   (needs the venv of scripts/reference/requirements.txt in
# $VENV, default .venv-reference, and a release build of the binary)
set -euo pipefail
N=${1:-64}
REPS=${2:-3}
VENV=${VENV:-.venv-reference}
BIN=${VARIORUM:-${CARGO_TARGET_DIR:-target}/release/variorum}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PY="$VENV/bin/python"

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u +%F)"
"$PY" scripts/lib/gpt2_125m.py "$WORK/hf" 4

weights=$(stat -c %s "$WORK/hf/model.safetensors")
/usr/bin/time -f "%e %M" -o "$WORK/time" "$BIN" import "$WORK/hf" --out "$WORK/run" > /dev/null
read -r secs kib < "$WORK/time"
echo "import: ${secs} s, peak RSS $((kib / 1024)) MiB = $(python3 -c "print(f'{$kib * 1024 / $weights:.2f}')") x the safetensors file ($((weights / 2**20)) MiB)"

PROMPT="Shall I compare thee to a summer's day?"
"$PY" - "$WORK" "$BIN" "$N" "$REPS" "$PROMPT" <<'EOF'
import json, statistics, subprocess, sys, time, torch, transformers
work, binary, n, reps, prompt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(int(subprocess.check_output(["nproc"])))
tok = transformers.AutoTokenizer.from_pretrained(f"{work}/hf")
model = transformers.GPT2LMHeadModel.from_pretrained(f"{work}/hf", dtype=torch.float32, attn_implementation="eager").eval()
ids = torch.tensor([tok(prompt)["input_ids"]])

def hf(k):
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k,
                             do_sample=False, use_cache=True, pad_token_id=0)
    return time.perf_counter() - t, out[0, ids.shape[1]:].tolist()

def ours(k):
    t = time.perf_counter()
    text = subprocess.run([binary, "generate", f"{work}/run", "--prompt", prompt, "--temperature", "0",
                           "--max-new-tokens", str(k)], check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t, text

theirs_tps, ours_tps = [], []
for _ in range(reps):
    (t1, _), (tn, hf_tokens) = hf(1), hf(n)
    theirs_tps.append((n - 1) / (tn - t1))
    (o1, _), (on, text) = ours(1), ours(n)
    ours_tps.append((n - 1) / (on - o1))
theirs_text = tok.decode(hf_tokens)
text = text.rstrip("\n")
same = theirs_text == text[len(prompt):] if text.startswith(prompt) else theirs_text == text
if not same:
    print(f"  transformers: {theirs_text[:160]!r}\n  variorum:     {text[:160]!r}")
print(f"greedy decoding, {n} new tokens after a {ids.shape[1]}-token prompt, medians of {reps} alternating runs:")
print(f"  transformers {transformers.__version__} (torch {torch.__version__}): {statistics.median(theirs_tps):.1f} tokens/s  {[round(x, 1) for x in theirs_tps]}")
print(f"  variorum: {statistics.median(ours_tps):.1f} tokens/s  {[round(x, 1) for x in ours_tps]}")
print(f"  ratio {statistics.median(ours_tps) / statistics.median(theirs_tps):.2f}; same text: {same}")
EOF
