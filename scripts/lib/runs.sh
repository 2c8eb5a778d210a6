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
  "$BIN" eval "$out/$r" ${EVAL_TOKENS:+--max-tokens "$EVAL_TOKENS"} >"$out/$r.eval"
  python3 - "$out/$r/summary.json" "$out/$r.eval" "$r" >>"$out/results.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
rows = [l.split() for l in open(sys.argv[2]).read().splitlines() if l.strip() and not l.startswith("#")]
# the column headed "loss" (text windows and graph examples print different tables)
at = rows[0].index("loss")
loss = next(r[at] for r in rows[1:] if r[0].isdigit())
print(f"{sys.argv[3]}\t{s['params']}\t{s['tokens_per_sec']:.0f}\t{loss}")
PY
}

# train_seeded DIR NAME SEED OUT [LABEL]: trains DIR/NAME.toml with train.seed = SEED as
# OUT/[LABEL-]NAME-sSEED (once), evaluates it (train_and_eval) and appends
# "[label] name seed params tokens/s val_loss" to OUT/results.tsv. Expects ROOT.
train_seeded() {
  local dir=$1 r=$2 seed=$3 out=$4 label=${5:-}
  local name="${label:+$label-}$r-s$seed" last
  mkdir -p "$out/configs"
  printf 'extends = "%s"\n\n[train]\nseed = %s\n' "$ROOT/$dir/$r.toml" "$seed" >"$out/configs/$name.toml"
  train_and_eval "$out/configs" "$name" "$out"
  # train_and_eval's row starts with the run's name: split it into label, kind and seed
  last=$(tail -n 1 "$out/results.tsv")
  sed -i '$d' "$out/results.tsv"
  printf '%s%s\t%s\t%s\n' "${label:+$label$'\t'}" "$r" "$seed" "$(cut -f2- <<<"$last")" >>"$out/results.tsv"
}
