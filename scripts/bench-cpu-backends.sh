#!/usr/bin/env bash
# Which CPU backend is faster for training here? Runs `variorum bench` on each CPU backend, one
# after the other, for the given configs (default: the baby GPT), and prints median tokens/s.
# The winner is what `--device cpu` means (crates/variorum-cli/src/device.rs, CPU_DEFAULT).
set -euo pipefail
cd "$(dirname "$0")/.."
# ndarray is opt-in: this script builds the binary with it (its own build of Burn's features;
# scripts/system-deps.sh with NDARRAY=1 installs OpenBLAS).
cargo build --release -p variorum-cli --features ndarray
bin="${CARGO_TARGET_DIR:-target}/release/variorum"
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/gpt-baby-shakespeare-char.toml)
printf '%-48s %-8s %12s %10s\n' config device tokens/s peak_MiB
for cfg in "${configs[@]}"; do
  for dev in flex ndarray; do
    json=$("$bin" bench "$cfg" --device "$dev" --steps "${STEPS:-40}" --warmup 5 --runs "${RUNS:-3}" --json)
    python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("%-48s %-8s %12.0f %10.0f" % (sys.argv[2], sys.argv[3], r["median_tokens_per_sec"], r["peak_rss_mib"] or 0))' "$json" "$cfg" "$dev"
  done
done
