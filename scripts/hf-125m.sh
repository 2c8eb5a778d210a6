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
"$PY" - "$WORK/hf" <<'EOF'
import sys, torch, transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
out = sys.argv[1]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
text = open("crates/variorum-train/tests/fixtures/hf/export/corpus.txt").read()
tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
# GPT-2's 50257 rows: the rest of the vocabulary as added tokens, so that every id the model
# can choose decodes to the same text on both sides
tok.add_tokens([f"<t{i}>" for i in range(tok.get_vocab_size(), 50257)])
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12, bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(cfg).eval()
with torch.no_grad():
    for p in model.parameters():
        if p.dim() >= 2:
            p.mul_(4.0)  # far from uniform, so greedy tokens are not near-ties
model.save_pretrained(out)
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)
n = sum(p.numel() for p in model.parameters())
print(f"model: GPT-2 small shape, {n / 1e6:.1f} M parameters, {n * 4 / 2**20:.0f} MiB in f32")
EOF

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
