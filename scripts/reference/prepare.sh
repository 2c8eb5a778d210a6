# Sourced by scripts/compare-pytorch.sh and scripts/bench-generate.sh (from the repository root):
# their shared settings, the reference virtualenv with torch, and the Shakespeare corpus.

PYTORCH_THREADS="${PYTORCH_THREADS:-2}"
PYTHON="${PYTHON:-python3}"
VENV=".venv-reference"
DATA="data/shakespeare/input.txt"
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
BIN="$TARGET_DIR/release/variorum"

say() { printf '==> %s\n' "$*" >&2; }

ensure_reference_venv() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c 'import torch, x_transformers' >/dev/null 2>&1; then
    say "installing scripts/reference/requirements.txt into $VENV (torch from PyPI is several GB)"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -r scripts/reference/requirements.txt
  fi
}

ensure_corpus() {
  if [[ ! -f "$DATA" ]]; then
    say "fetching the Shakespeare corpus"
    bash datasets/shakespeare/fetch.sh
  fi
  if [[ ! -f "$DATA" ]]; then
    echo "error: $DATA is still missing after datasets/shakespeare/fetch.sh" >&2
    exit 1
  fi
}
