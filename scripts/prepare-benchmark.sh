#!/usr/bin/env bash
# docs/data.md's figures, both sides in one run, interleaved:
#  - `variorum prepare` against Python `tokenizers`' encode_batch and a nanoGPT-style prepare
#    (tokenize, then np.memmap uint16) on the same JSON Lines files (SIZE_MB, default 1 GB, in
#    64 files, generated locally) with the same tokenizer.json; the token counts must agree;
#  - peak resident memory of prepare at 10 MB and SIZE_MB;
#  - training from a 10 MB and a SIZE_MB prepared corpus: start-up (a 1-step run), peak memory,
#    tokens/s; and from the same 10 MB read into memory (data.path), the path as it was.
# Needs the release binary and a Python with scripts/reference/requirements.txt (PY=...).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
: "${CARGO_TARGET_DIR:=$HOME/.cache/variorum-target}"
BIN=${BIN:-$CARGO_TARGET_DIR/release/variorum}
PY=${PY:-python3}
WORK=${WORK:-/tmp/variorum-prepare-bench}
SIZE_MB=${SIZE_MB:-1024}
REPS=${REPS:-2}
STEPS=${STEPS:-200}
PARTS=${PARTS:-prepare,train}   # which halves to run
TEXT=$(realpath "${TEXT:-${VARIORUM_DATA:-data}/shakespeare/input.txt}")
mkdir -p "$WORK"
cd "$WORK"
lscpu | grep "Model name"
nproc
[ -d small ] || "$PY" "$root/scripts/lib/make_jsonl_corpus.py" "$TEXT" small 10 4 1
[ -d big ] || "$PY" "$root/scripts/lib/make_jsonl_corpus.py" "$TEXT" big "$SIZE_MB" 64 2
du -sh small big

prepare_cfg() { # name glob prepared tokenizer-section
  printf '[data]\nsources = [{ path = "%s", text_field = "text" }]\nprepared = "%s"\nval_fraction = 0.01\n%s\n' "$2" "$3" "$4" > "$1"
}
# the tokenizer: byte-level BPE of 8,192 tokens learnt by prepare from the small corpus
prepare_cfg learn.toml 'small/*.jsonl' learn-prep $'[data.tokenizer]\nkind = "bpe"\nvocab_size = 8192'
[ -f tok.json ] || { "$BIN" prepare learn.toml > /dev/null && cp learn-prep/tokenizer.json tok.json; }
file_tok=$'[data.tokenizer]\nkind = "file"\npath = "tok.json"'
prepare_cfg small.toml 'small/*.jsonl' small-prep "$file_tok"
prepare_cfg big.toml 'big/*.jsonl' big-prep "$file_tok"

results=$WORK/results.tsv
: > "$results"
measure() { # label command...: wall seconds and peak RSS (KiB) into results.tsv
  local label=$1
  shift
  /usr/bin/time -f "%e %M" -o time.out "$@" > out.log 2> err.log || { cat err.log; exit 1; }
  echo -e "$label\t$(cat time.out)" | tee -a "$results"
}

[[ $PARTS == *prepare* ]] && for rep in $(seq "$REPS"); do
  rm -rf big-prep ng
  measure "prepare-big variorum" "$BIN" prepare big.toml
  measure "prepare-big tokenizers-encode-batch" "$PY" "$root/scripts/reference/prepare_reference.py" encode-batch tok.json ng big/*.jsonl
  cp out.log encode-batch.json
  measure "prepare-big nanogpt-memmap" "$PY" "$root/scripts/reference/prepare_reference.py" nanogpt tok.json ng big/*.jsonl
  cp out.log nanogpt.json
  rm -rf small-prep
  measure "prepare-small variorum" "$BIN" prepare small.toml
done
# the same tokens: ours (training + validation, an end-of-text token after each document) and
# nanoGPT-style's
[[ $PARTS == *prepare* ]] && "$PY" - <<'PY'
import json
i = json.load(open("big-prep/index.json"))
ours = sum(s["train_tokens"] + s["val_tokens"] for s in i["shards"])
ng = json.load(open("nanogpt.json"))["tokens"]
print(f"tokens: variorum {ours}, nanoGPT-style {ng}")
assert ours == ng, "the token counts differ"
PY

# training: the same tiny model from each corpus
train_cfg() { # name data-section
  printf '[model]\nd_model = 64\nn_layers = 2\nseq_len = 128\n[model.attention]\nkind = "full"\nn_heads = 4\n%s\n[train]\nsteps = %s\nbatch_size = 16\neval_interval = 100\neval_batches = 2\nlog_interval = 50\nsample_tokens = 0\n' "$2" "$STEPS" > "$1"
}
"$PY" -c "
import json, glob
with open('small.txt', 'w') as out:
    for f in sorted(glob.glob('small/*.jsonl')):
        for line in open(f):
            out.write(json.loads(line)['text'])
"
train_cfg train-small.toml $'[data]\nprepared = "small-prep"\nval_fraction = 0.01\n'"$file_tok"
train_cfg train-big.toml $'[data]\nprepared = "big-prep"\nval_fraction = 0.01\n'"$file_tok"
train_cfg train-memory.toml $'[data]\npath = "small.txt"\nval_fraction = 0.01\n'"$file_tok"
[[ $PARTS == *train* ]] && for rep in $(seq "$REPS"); do
  for which in small big memory; do
    rm -rf "run-$which" "start-$which"
    measure "start-$which" "$BIN" train "train-$which.toml" --out "start-$which" --max-steps 1 --no-report
    measure "train-$which" "$BIN" train "train-$which.toml" --out "run-$which" --no-report
    "$PY" -c "import json; print('tokens/s-$which', json.load(open('run-$which/summary.json'))['tokens_per_sec'])" | tee -a "$results"
  done
done
"$PY" - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if parts[0].startswith("tokens/s"):
        rows.setdefault(parts[0], []).append((float(parts[1]), 0))
    else:
        label = " ".join(parts[:-2])
        rows.setdefault(label, []).append((float(parts[-2]), int(parts[-1])))
for label, v in rows.items():
    s = statistics.median(x for x, _ in v)
    m = statistics.median(y for _, y in v) / 1024
    print(f"{label:40s} median {s:10.2f}  (n={len(v)}, min {min(x for x,_ in v):.2f}, max {max(x for x,_ in v):.2f})  peak RSS {m:8.1f} MiB")
PY
