#!/usr/bin/env bash
# Training speed and peak memory of every attention kind and every position scheme at the baby
# size (context 64, batch 12, 4 layers × 128): one row per config under configs/attention/ and
# configs/positions/, so that a regression in any kind shows (docs/cpu-speed.md, "Every kind").
#
# Each config runs `variorum bench` in its own process (synthetic tokens; median tokens/s of RUNS
# runs of STEPS steps; the process's peak resident set). The baselines — attention/full.toml and
# positions/learned.toml, full attention with learned positions — run again before every EVERY
# configs, and each row's ratios are against the median of all their runs (this machine's speed
# drifts by ±20 % within minutes): tokens/s ÷ the baseline's, and achieved GFLOP/s (tokens/s per
# FLOP) ÷ the baseline's.
#
# Environment:
#   STEPS             timed steps per run (default 20)
#   RUNS              runs per config (default 3)
#   EVERY             configs between baseline runs (default 8)
#   ONLY              a regular expression: only configs whose path matches (default: all)
#   OUT               where kinds.json, kinds.md and the logs go (default runs/bench-kinds)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

STEPS="${STEPS:-20}"
RUNS="${RUNS:-3}"
EVERY="${EVERY:-8}"
ONLY="${ONLY:-.}"
OUT="${OUT:-runs/bench-kinds}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"

for v in STEPS RUNS EVERY; do
  case "${!v}" in
    '' | *[!0-9]* | 0) echo "error: $v must be a positive integer, got '${!v}'" >&2; exit 2 ;;
  esac
done

echo "==> building variorum (release; nothing to do when it is up to date)" >&2
cargo test --release --workspace --no-run
if [[ ! -x "$BIN" ]]; then
  echo "error: $BIN not found after the build" >&2
  exit 1
fi

mkdir -p "$OUT/logs"
: >"$OUT/results.jsonl"

n=0
bench() { # config, role
  local cfg="$1" role="$2" log
  n=$((n + 1))
  log="$OUT/logs/$n-$(echo "$cfg" | tr '/' '_').log"
  if "$BIN" bench "$cfg" --steps "$STEPS" --runs "$RUNS" --json >"$log.json" 2>"$log"; then
    python3 - "$cfg" "$role" "$log.json" >>"$OUT/results.jsonl" <<'PY'
import json
import sys

cfg, role, path = sys.argv[1:4]
report = json.load(open(path))
print(json.dumps({"config": cfg, "role": role, **report}))
PY
    echo "==> $cfg: $(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["median_tokens_per_sec"]), "tokens/s")' "$log.json")" >&2
  else
    echo "==> $cfg: failed (see $log)" >&2
    printf '%s\n' "{\"config\": \"$cfg\", \"role\": \"$role\", \"failed\": true}" >>"$OUT/results.jsonl"
  fi
}

mapfile -t configs < <(ls configs/attention/*.toml configs/positions/*.toml | grep -v '/base\.toml$' | grep -E -- "$ONLY")
[[ ${#configs[@]} -gt 0 ]] || { echo "error: no config matches ONLY='$ONLY'" >&2; exit 2; }

i=0
for cfg in "${configs[@]}"; do
  if ((i % EVERY == 0)); then
    bench configs/attention/full.toml baseline
    bench configs/positions/learned.toml baseline
  fi
  bench "$cfg" kind
  i=$((i + 1))
done
bench configs/attention/full.toml baseline
bench configs/positions/learned.toml baseline

python3 - "$OUT" "$STEPS" "$RUNS" <<'PY'
import json
import statistics
import subprocess
import sys

out, steps, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{out}/results.jsonl") if l.strip()]
base = [r for r in rows if r["role"] == "baseline" and not r.get("failed")]
if not base:
    sys.exit("error: every baseline run failed")
med = statistics.median
base_tps = med(r["median_tokens_per_sec"] for r in base)
base_gflops = med(r["median_gflops"] for r in base)
try:
    cpu = next(l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines() if l.startswith("Model name"))
except Exception:
    cpu = "unknown"

table = []
for r in rows:
    if r["role"] != "kind":
        continue
    name = r["config"].removeprefix("configs/").removesuffix(".toml")
    if r.get("failed"):
        table.append({"config": name, "failed": True})
        continue
    table.append({
        "config": name,
        "tokens_per_sec": r["median_tokens_per_sec"],
        "gflops": r["median_gflops"],
        "peak_rss_mib": r.get("peak_rss_mib"),
        "params": r.get("params"),
        "tokens_ratio": r["median_tokens_per_sec"] / base_tps,
        "per_flop_ratio": r["median_gflops"] / base_gflops,
    })
result = {
    "cpu": cpu,
    "steps": steps,
    "runs": runs,
    "baseline": {"configs": ["attention/full", "positions/learned"], "runs": len(base),
                 "tokens_per_sec": base_tps, "gflops": base_gflops,
                 "tokens_per_sec_runs": [r["median_tokens_per_sec"] for r in base]},
    "rows": table,
}
json.dump(result, open(f"{out}/kinds.json", "w"), indent=2)

lines = [
    f"CPU: {cpu}; `variorum bench`, {runs} runs × {steps} steps, medians; baseline (full attention, "
    f"learned positions) {base_tps:,.0f} tokens/s, {base_gflops:.1f} GFLOP/s (median of {len(base)} runs "
    f"spread through the run).",
    "",
    "| config | tokens/s | ÷ full | GFLOP/s | per FLOP ÷ full | peak MiB |",
    "|---|---|---|---|---|---|",
]
for t in table:
    if t.get("failed"):
        lines.append(f"| {t['config']} | failed | | | | |")
        continue
    peak = f"{t['peak_rss_mib']:,.0f}" if t["peak_rss_mib"] is not None else "n/a"
    lines.append(f"| {t['config']} | {t['tokens_per_sec']:,.0f} | {t['tokens_ratio']:.2f} | {t['gflops']:.1f} | "
                 f"{t['per_flop_ratio']:.2f} | {peak} |")
open(f"{out}/kinds.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"\nwritten: {out}/kinds.json, {out}/kinds.md")
PY
