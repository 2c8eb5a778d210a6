#!/usr/bin/env bash
# One-time setup: system packages, the Shakespeare corpus, and a release build of `variorum`.
# Usage: scripts/setup.sh            (then: target/release/variorum train configs/gpt-shakespeare-char.toml)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/system-deps.sh
datasets/shakespeare/fetch.sh
# The README's test command's own build: it builds the `variorum` binary too (the CLI tests run
# it), so training and `cargo test --release --workspace` afterwards share this one build of Burn.
# (`cargo build -p variorum-cli` resolves other features and would build Burn a second time.)
cargo test --release --workspace --no-run
bin="${CARGO_TARGET_DIR:-target}/release/variorum"
echo
echo "ready: $bin"
echo "train: $bin train configs/gpt-shakespeare-char.toml"
