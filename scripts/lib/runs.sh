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
  cargo build --release -p variorum-cli >&2
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
