# Sourced by the experiment scripts (scripts/position-extrapolation.sh,
# scripts/memory-experiment.sh) from the repository root: build the binary, list a config
# family, and train a run unless it has finished (resuming one that was cut off).
# Expects BIN (the variorum binary).

say() { printf '==> %s\n' "$*" >&2; }

# The config names of a family directory, its base.toml left out; or check the given ones.
family_members() {
  local dir=$1 given=${2:-}
  if [[ -z $given ]]; then
    for f in "$dir"/*.toml; do local n; n=$(basename "$f" .toml); [[ $n == base ]] || echo "$n"; done
    return
  fi
  for n in $given; do
    [[ -f $dir/$n.toml ]] || { echo "error: no $dir/$n.toml" >&2; exit 2; }
    echo "$n"
  done
}

build_and_fetch() {
  [[ -f data/shakespeare/input.txt ]] || bash datasets/shakespeare/fetch.sh
  say "building variorum"
  cargo test --release --workspace --no-run >&2
}

# train_once CONFIG RUN_DIR LOG
train_once() {
  local cfg=$1 run=$2 log=$3 name
  name=$(basename "$run")
  if [[ -f $run/summary.json ]]; then
    say "$name: already trained"
    return
  fi
  say "$name: training"
  local resume=()
  [[ -d $run ]] && resume=(--resume)
  "$BIN" train "$cfg" --out "$run" --no-progress "${resume[@]}" >"$log" 2>&1 ||
    { echo "error: training $name failed; the end of $log:" >&2; tail -n 3 "$log" >&2; exit 1; }
}

# train_and_eval FAMILY_DIR NAME OUT: trains FAMILY_DIR/NAME.toml into OUT/NAME (once), evaluates
# it on the first EVAL_TOKENS validation tokens and appends "name params tokens/s val_loss" to
# OUT/results.tsv.
train_and_eval() {
  local dir=$1 r=$2 out=$3
  train_once "$dir/$r.toml" "$out/$r" "$out/$r.log"
  "$BIN" eval "$out/$r" --max-tokens "$EVAL_TOKENS" >"$out/$r.eval"
  python3 - "$out/$r/summary.json" "$out/$r.eval" "$r" >>"$out/results.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
lines = open(sys.argv[2]).read().splitlines()
loss = next(l.split()[3] for l in lines if l.strip() and not l.startswith("#") and l.split()[0].isdigit())
print(f"{sys.argv[3]}\t{s['params']}\t{s['tokens_per_sec']:.0f}\t{loss}")
PY
}
