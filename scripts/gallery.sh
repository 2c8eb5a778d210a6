#!/usr/bin/env bash
# The README's pattern gallery: `variorum pattern` of each sparse or content-based kind's
# shipped config (configs/attention/, context 64: the variants sized for it), layer 0, drawn
# from the real modules into docs/gallery/<name>.png. A kind that cannot be drawn is reported
# and skipped.
#
# Environment:
#   OUT    where the pictures go (default docs/gallery)
#   KINDS  config names of configs/attention (default: the list below)
#   CARGO_TARGET_DIR  cargo's target dir (default: target)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-docs/gallery}"
BIN="${CARGO_TARGET_DIR:-target}/release/variorum"
source scripts/lib/runs.sh

KINDS=$(family_members configs/attention "${KINDS:-full sliding-window-16 local-16 blockwise-16 strided-8 fixed-8 bigbird-8 longformer-16 low-rank-band multi-scale-small poolingformer memory-compressed prob-sparse lsh-16 routing-16 sinkhorn-16 linear hard-coded-gaussian}")
say "building variorum"
cargo test --release --workspace --no-run >&2
mkdir -p "$OUT"
for k in $KINDS; do
  if "$BIN" pattern "configs/attention/$k.toml" --len 64 --out "$OUT/$k.png" >"$OUT/.$k.txt" 2>&1; then
    cat "$OUT/.$k.txt"
  else
    echo "skipped $k: $(tail -n 1 "$OUT/.$k.txt")" >&2
  fi
  rm -f "$OUT/.$k.txt"
done
