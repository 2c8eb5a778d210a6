#!/usr/bin/env bash
# Generation speed of variorum against a PyTorch reference, with and without a KV cache.
#
# The model (MODEL):
#   gpt    the baby-Shakespeare character GPT (4 pre-LN blocks × 4 heads × 128, learned positions,
#          GELU, tied embeddings) with a 1024-token context, configs/gpt-ctx1024-char.toml; the
#          reference is scripts/reference/generate_gpt.py (the same architecture in plain PyTorch);
#   llama  the LLaMA-style baby (rotary positions, RMSNorm, SwiGLU, 2 key/value heads),
#          configs/llama-ctx1024-char.toml; the reference is x-transformers' own generate
#          (scripts/reference/generate_xtransformers.py).
# Trained for a single step (speed does not depend on the weights). For each context C
# (default 256 and 1024) both sides continue a 16-token prompt by C - 16 tokens, greedily, so the
# window never slides, once with the cache and once recomputing the whole sequence per token.
# variorum: `variorum generate` (tokens/s from its stderr line), median of REPEATS runs.
# PyTorch: the reference above (same architecture, random weights), median of REPEATS runs. Both run one after the other, never concurrently.
#
# Environment:
#   MODEL             gpt (default) or llama
#   CONTEXTS          space-separated contexts, prompt + new tokens (default "256 1024"; at most 1024)
#   PROMPT_LEN        prompt tokens (default 16; variorum's prompt is the corpus' first PROMPT_LEN characters)
#   REPEATS           runs per setting, median kept (default 3)
#   OUT               where bench-generate.json and the logs go (default runs/bench-generate)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
#   PYTORCH_THREADS   torch.set_num_threads for the reference (default 2)
#   PYTHON            interpreter used to create the virtualenv (default python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/reference/prepare.sh

CONTEXTS="${CONTEXTS:-256 1024}"
PROMPT_LEN="${PROMPT_LEN:-16}"
REPEATS="${REPEATS:-3}"
MODEL="${MODEL:-gpt}"
case "$MODEL" in
  gpt)
    CONFIG="configs/gpt-ctx1024-char.toml"
    REF_SCRIPT="scripts/reference/generate_gpt.py"
    DESCRIPTION="configs/gpt-ctx1024-char.toml (4 layers x 4 heads x 128, pre-LN, learned positions, GELU, tied)" ;;
  llama)
    CONFIG="configs/llama-ctx1024-char.toml"
    REF_SCRIPT="scripts/reference/generate_xtransformers.py"
    DESCRIPTION="configs/llama-ctx1024-char.toml (4 layers x 4 heads (2 kv) x 128, rope, rms-norm, swiglu, tied); reference x-transformers" ;;
  *) echo "error: MODEL must be gpt or llama, got '$MODEL'" >&2; exit 2 ;;
esac
OUT="${OUT:-runs/bench-generate$([[ "$MODEL" == gpt ]] || echo "-$MODEL")}"
MAX_CONTEXT=1024 # model.seq_len of $CONFIG

is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

is_count "$PROMPT_LEN" || { echo "error: PROMPT_LEN must be a positive integer, got '$PROMPT_LEN'" >&2; exit 2; }
is_count "$REPEATS" || { echo "error: REPEATS must be a positive integer, got '$REPEATS'" >&2; exit 2; }
read -r -a contexts <<<"$CONTEXTS"
[[ ${#contexts[@]} -gt 0 ]] || { echo "error: CONTEXTS is empty" >&2; exit 2; }
for c in "${contexts[@]}"; do
  if ! is_count "$c" || ((c <= PROMPT_LEN || c > MAX_CONTEXT)); then
    echo "error: each context must be an integer in ($PROMPT_LEN, $MAX_CONTEXT], got '$c'" >&2
    exit 2
  fi
done

# 1. Reference virtualenv with torch (as scripts/compare-pytorch.sh).
ensure_reference_venv

# 2. Corpus.
ensure_corpus

# 3. variorum (built only when missing).
if [[ ! -x "$BIN" ]]; then
  say "building variorum (release)"
  cargo test --release --workspace --no-run
fi
if [[ ! -x "$BIN" ]]; then
  echo "error: $BIN not found after the build" >&2
  exit 1
fi

mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/variorum-bench-generate.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
RUN_DIR="$WORK/run"

# 4. A throwaway run of the 1024-context model.
say "variorum: one training step of $CONFIG (throwaway weights)"
if ! "$BIN" train "$CONFIG" --out "$RUN_DIR" --max-steps 1 --no-progress >"$OUT/train.log" 2>&1; then
  cat "$OUT/train.log" >&2
  echo "error: variorum train failed (log: $OUT/train.log)" >&2
  exit 1
fi

# The prompt: the corpus' first PROMPT_LEN characters (one token each with the char tokenizer).
PROMPT="$(python3 -c 'import sys; sys.stdout.write(open(sys.argv[1], encoding="utf-8").read(int(sys.argv[2])))' "$DATA" "$PROMPT_LEN")"

# tokens/s from a line like "300 tokens in 0.08 s: 3802.9 tokens/s (KV cache)"; checks the count.
parse_rate() {
  python3 - "$1" "$2" <<'PY'
import re
import sys

path, expected = sys.argv[1], int(sys.argv[2])
text = open(path, encoding="utf-8", errors="replace").read()
found = re.findall(r"(\d+) tokens in [0-9.]+ s: ([0-9.]+) tokens/s", text)
if not found:
    sys.exit(f"error: no tokens/s line in {path}:\n{text}")
count, rate = found[-1]
if int(count) != expected:
    sys.exit(f"error: {path}: {count} tokens generated, expected {expected}")
print(rate)
PY
}

# 5. variorum generate: every context, both modes, REPEATS runs each.
VAR_RATES="$WORK/variorum-rates.tsv" # context, mode, tokens/s (one line per run)
: >"$VAR_RATES"
for c in "${contexts[@]}"; do
  n=$((c - PROMPT_LEN))
  for mode in cache no_cache; do
    flags=()
    [[ "$mode" == no_cache ]] && flags=(--no-cache)
    for ((r = 1; r <= REPEATS; r++)); do
      "$BIN" generate "$RUN_DIR" --prompt "$PROMPT" --max-new-tokens "$n" --temperature 0 \
        --device cpu ${flags[@]+"${flags[@]}"} >"$WORK/gen.out" 2>"$WORK/gen.err" || {
        cat "$WORK/gen.err" >&2
        echo "error: variorum generate failed (context $c, $mode)" >&2
        exit 1
      }
      rate="$(parse_rate "$WORK/gen.err" "$n")"
      printf '%s\t%s\t%s\n' "$c" "$mode" "$rate" >>"$VAR_RATES"
      say "variorum | context $c | $mode | run $r/$REPEATS | $rate tokens/s"
      [[ $r -eq 1 ]] && cp "$WORK/gen.out" "$OUT/variorum-$c-$mode.txt"
    done
  done
  if ! cmp -s "$OUT/variorum-$c-cache.txt" "$OUT/variorum-$c-no_cache.txt"; then
    say "warning: variorum's text with and without the cache differs at context $c (see $OUT/variorum-$c-*.txt)"
  fi
done

# 6. The PyTorch reference, same settings.
say "PyTorch reference: contexts ${contexts[*]}, $REPEATS runs each, $PYTORCH_THREADS threads"
ref_rc=0
"$VENV/bin/python" "$REF_SCRIPT" \
  --contexts "$(IFS=,; echo "${contexts[*]}")" --prompt-len "$PROMPT_LEN" \
  --repeats "$REPEATS" --threads "$PYTORCH_THREADS" >"$OUT/pytorch.log" 2>&1 || ref_rc=$?
cat "$OUT/pytorch.log" >&2
grep '^RESULT ' "$OUT/pytorch.log" | tail -n 1 | sed 's/^RESULT //' >"$OUT/pytorch.json" || true
if [[ ! -s "$OUT/pytorch.json" ]]; then
  echo "error: the reference printed no RESULT line (see $OUT/pytorch.log)" >&2
  exit 1
fi
if [[ $ref_rc -ne 0 ]]; then
  say "warning: the reference exited with $ref_rc (its cache and no-cache tokens differ?); see $OUT/pytorch.log"
fi

# 7. Table and bench-generate.json.
python3 - "$VAR_RATES" "$OUT/pytorch.json" "$OUT/bench-generate.json" "$PROMPT_LEN" "$REPEATS" "$DESCRIPTION" <<'PY'
import json
import statistics
import sys

rates_path, ref_path, out_path, prompt_len, repeats, description = sys.argv[1:7]
runs = {}
with open(rates_path) as f:
    for line in f:
        context, mode, rate = line.split("\t")
        runs.setdefault((int(context), mode), []).append(float(rate))
with open(ref_path) as f:
    ref = json.load(f)
ref_by_context = {s["context"]: s for s in ref["settings"]}

rows = []
for (context, mode), var_runs in runs.items():
    setting = ref_by_context[context]
    var_tps = statistics.median(var_runs)
    ref_tps = float(setting[mode]["tokens_per_sec"])
    rows.append({
        "context": context,
        "prompt_tokens": int(prompt_len),
        "new_tokens": context - int(prompt_len),
        "mode": mode,
        "variorum_tokens_per_sec": var_tps,
        "pytorch_tokens_per_sec": ref_tps,
        "ratio": var_tps / ref_tps if ref_tps > 0 else None,
        "variorum_runs": var_runs,
        "pytorch_runs": setting[mode].get("runs_tokens_per_sec"),
        "pytorch_tokens_match": setting.get("tokens_match"),
    })

result = {
    "model": description,
    "repeats": int(repeats),
    "statistic": "median tokens/s (new tokens over the whole call, prompt included)",
    "pytorch": {"torch": ref.get("torch"), "threads": ref.get("threads"), "tokens_match": ref.get("tokens_match")},
    "rows": rows,
}
with open(out_path, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")

label = {"cache": "cache", "no_cache": "no cache"}
print()
print(f"{'context':>8}  {'mode':<9}{'variorum tok/s':>16}{'PyTorch tok/s':>16}{'ratio':>8}")
for r in rows:
    ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "n/a"
    print(f"{r['context']:>8}  {label[r['mode']]:<9}{r['variorum_tokens_per_sec']:>16,.1f}"
          f"{r['pytorch_tokens_per_sec']:>16,.1f}{ratio:>8}")
print()
print("ratio = variorum / PyTorch (median of %s runs each)" % repeats)
print(f"written: {out_path}")
PY
