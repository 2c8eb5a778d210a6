#!/usr/bin/env bash
# The Decision Transformer's measurements (docs/decision-transformer.md), one run after another:
# offline data from behaviour policies of mixed quality on the key-to-door gridworld; the
# Decision Transformer (configs/decision/key-door.toml) and behaviour cloning with the same
# network (key-door-bc.toml) on all of it and on a tenth of it; the Decision Transformer with one
# step of context; each played at several target returns, actions sampled and greedy.
#
#   scripts/decision-transformer.sh [OUT] [SEEDS]
#
# OUT (default /tmp/decision-transformer) receives the data, the runs and results.tsv
# (run, seed, target, mode, mean return, std, success; appended to when it exists, and a run
# already finished is not trained again); SEEDS (default "1 2") seed training and rollouts. Expects target/release/variorum (cargo build --release).
set -euo pipefail
OUT=${1:-/tmp/decision-transformer}
SEEDS=${2:-1 2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=${VARIORUM:-$ROOT/target/release/variorum}
mkdir -p "$OUT"
cd "$OUT"

[ -f full.jsonl ] || "$V" trajectories --out full.jsonl --episodes 2000 --seed 0 | tee full.txt
[ -f tenth.jsonl ] || "$V" trajectories --out tenth.jsonl --episodes 200 --seed 0 | tee tenth.txt

# name, base config, data, extra [model] line, extra [train] line: on a tenth of the data the
# models overfit long before 6,000 steps (validation loss rising from step ~1,000), so they stop
# at 2,000
variants=(
  "dt|key-door.toml|full.jsonl||"
  "bc|key-door-bc.toml|full.jsonl||"
  "dt-k1|key-door.toml|full.jsonl|seq_len = 3|"
  "dt-tenth|key-door.toml|tenth.jsonl||steps = 2000"
  "bc-tenth|key-door-bc.toml|tenth.jsonl||steps = 2000"
)
[ -f results.tsv ] || echo -e "run\tseed\ttarget\tmode\treturn\tstd\tsuccess" > results.tsv
for seed in $SEEDS; do
  for v in "${variants[@]}"; do
    IFS='|' read -r name base data extra train_extra <<< "$v"
    cfg="$OUT/$name-$seed.toml"
    {
      echo "extends = \"$ROOT/configs/decision/$base\""
      echo "[model]"
      if [ -n "$extra" ]; then echo "$extra"; fi
      echo "[data]"
      echo "trajectories = \"$OUT/$data\""
      echo "[train]"
      echo "seed = $seed"
      if [ -n "$train_extra" ]; then echo "$train_extra"; fi
    } > "$cfg"
    run="$OUT/$name-$seed"
    [ -f "$run/summary.json" ] || "$V" train "$cfg" --out "$run" --no-progress 2>&1 | tail -1
    for mode in sampled greedy; do
      flag=""; [ $mode = greedy ] && flag="--greedy"
      "$V" rollout "$run" --episodes 200 --seed "$seed" $flag > /dev/null
      python3 - "$run/rollouts.json" "$name" "$seed" "$mode" >> results.tsv <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for t in r["targets"]:
    target = "-" if t["target"] is None else f'{t["target"]:+.2f}'
    print(f'{sys.argv[2]}\t{sys.argv[3]}\t{target}\t{sys.argv[4]}\t{t["mean"]:+.3f}\t{t["std"]:.3f}\t{100*t["success"]:.1f}')
PY
    done
  done
done
column -t -s $'\t' results.tsv
