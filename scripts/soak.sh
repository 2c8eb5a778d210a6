#!/usr/bin/env bash
# Long-run health (issue 28): train the 2.7 M-parameter character GPT (configs/gpt-shakespeare-char.toml)
# for a fixed wall-clock time, with evaluation and checkpoints every 500 steps and two checkpoints
# kept, and sample its memory and disk use every INTERVAL seconds. At the end the run is stopped
# the way a user stops it (Ctrl-C: SIGINT, which writes a checkpoint), and a summary says whether
# the resident memory stayed flat and the run directory stayed bounded.
#
# Usage: scripts/soak.sh [MINUTES]        (default 120)
# Environment:
#   INTERVAL          seconds between samples (default 30)
#   OUT               the run directory and soak.csv go here (default runs/soak)
#   NICE              niceness of the training (default 0; the soak measures memory and disk, not speed)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
#
# soak.csv: elapsed_s,step,rss_kib,peak_rss_kib,run_dir_bytes,checkpoints
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/lib/runs.sh

MINUTES="${1:-120}"
INTERVAL="${INTERVAL:-30}"
OUT="${OUT:-runs/soak}"
NICE="${NICE:-0}"
[[ "$MINUTES" =~ ^[1-9][0-9]*$ ]] || { echo "error: MINUTES must be a positive integer, got '$MINUTES'" >&2; exit 2; }
[[ "$INTERVAL" =~ ^[1-9][0-9]*$ ]] || { echo "error: INTERVAL must be a positive integer, got '$INTERVAL'" >&2; exit 2; }

BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
[[ -x $BIN ]] || build_and_fetch
[[ -f data/shakespeare/input.txt ]] || bash datasets/shakespeare/fetch.sh

mkdir -p "$OUT"
run="$OUT/run"
[[ ! -e $run ]] || { echo "error: $run exists: remove it or choose another OUT" >&2; exit 2; }
# The shipped config with more steps than the time allows (the schedule is irrelevant here).
cfg="$OUT/soak.toml"
sed -e 's/^steps = .*/steps = 1000000/' configs/gpt-shakespeare-char.toml >"$cfg"
printf 'keep_checkpoints = 2\n' >>"$cfg"
grep -q '^eval_interval = 500$' "$cfg" && grep -q '^checkpoint_interval = 500$' "$cfg" ||
  { echo "error: $cfg no longer evaluates and checkpoints every 500 steps" >&2; exit 1; }

csv="$OUT/soak.csv"
echo "elapsed_s,step,rss_kib,peak_rss_kib,run_dir_bytes,checkpoints" >"$csv"
nice -n "$NICE" "$BIN" train "$cfg" --out "$run" --no-progress >"$OUT/train.log" 2>&1 &
pid=$!
# Ctrl-C in the terminal reaches the training too, which saves a checkpoint and stops; the
# script waits for it and still writes the summary (a second INT from here would make the
# training stop without its checkpoint).
user_stop=0
trap 'user_stop=1' INT
start=$(date +%s)
deadline=$((start + MINUTES * 60))
sample() {
  local now rss hwm step bytes ckpts
  now=$(($(date +%s) - start))
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo "")
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo "")
  [[ $rss =~ ^[0-9]+$ && $hwm =~ ^[0-9]+$ ]] || return 1
  step=$(tail -n 1 "$run/metrics.csv" 2>/dev/null | cut -d, -f1)
  [[ $step =~ ^[0-9]+$ ]] || step=0
  bytes=$(du -sb "$run" 2>/dev/null | cut -f1)
  [[ $bytes =~ ^[0-9]+$ ]] || bytes=0
  ckpts=$(find "$run/checkpoints" -mindepth 1 -maxdepth 1 -type d -name 'step-*' 2>/dev/null | wc -l)
  echo "$now,$step,$rss,$hwm,$bytes,$ckpts" >>"$csv"
}
while kill -0 "$pid" 2>/dev/null && (($(date +%s) < deadline)); do
  sample || break
  sleep "$INTERVAL"
done
reached=0
if kill -0 "$pid" 2>/dev/null && ((user_stop == 0)); then
  sample || true
  reached=1
  kill -INT "$pid"
fi
set +e
# a trapped INT interrupts `wait`: wait again until the training has ended
while :; do
  wait "$pid"
  status=$?
  kill -0 "$pid" 2>/dev/null || break
done
set -e
echo "training exited with $status; the end of $OUT/train.log:" >&2
tail -n 3 "$OUT/train.log" >&2

python3 - "$csv" "$run" <<'PY'
import csv, os, sys
rows = list(csv.DictReader(open(sys.argv[1])))
if not rows:
    sys.exit("no samples")
def at(sec):
    return min(rows, key=lambda r: abs(int(r["elapsed_s"]) - sec))
ten, last = at(600), rows[-1]
mib = lambda kib: int(kib) / 1024
print(f"samples: {len(rows)} over {int(last['elapsed_s']) / 60:.1f} min, last step {last['step']}")
print(f"RSS at {int(ten['elapsed_s'])} s: {mib(ten['rss_kib']):.1f} MiB (peak so far {mib(ten['peak_rss_kib']):.1f})")
print(f"RSS at {int(last['elapsed_s'])} s: {mib(last['rss_kib']):.1f} MiB (peak {mib(last['peak_rss_kib']):.1f})")
after = [r for r in rows if int(r["elapsed_s"]) >= 600]
if after:
    lo = min(mib(r["rss_kib"]) for r in after); hi = max(mib(r["rss_kib"]) for r in after)
    print(f"RSS from 10 min to the end: {lo:.1f} to {hi:.1f} MiB")
sizes = [int(r["run_dir_bytes"]) for r in rows]
print(f"run directory: at most {max(sizes) / 2**20:.1f} MiB, at the end {sizes[-1] / 2**20:.1f} MiB; "
      f"checkpoint directories at most {max(int(r['checkpoints']) for r in rows)}")
ckpts = os.path.join(sys.argv[2], "checkpoints")
final = sorted(os.listdir(ckpts)) if os.path.isdir(ckpts) else []
print(f"checkpoints on disk after the stop: {' '.join(final) or 'none'}")
PY
# Healthy: stopped at the deadline (or by the user) with its checkpoint, exit code 130.
if ((status != 130 || (reached == 0 && user_stop == 0))); then
  echo "error: the training ended on its own before the deadline (exit $status): see $OUT/train.log" >&2
  exit 1
fi
((user_stop == 0)) || exit 130
