# Sourced by scripts/compare-pytorch.sh and scripts/bench-generate.sh: the reference virtualenv
# with torch, and the Shakespeare corpus. Uses $PYTHON, $VENV, $DATA and a `say` function.

ensure_reference_venv() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
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
