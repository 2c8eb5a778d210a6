#!/usr/bin/env bash
# Fetches the 'library' corpus (datasets/library/README.md): bash datasets/library/fetch.sh
set -euo pipefail
command -v python3 >/dev/null 2>&1 || { echo "datasets/library/fetch.sh: python3 (with pip) is needed" >&2; exit 1; }
exec python3 "$(dirname "$0")/fetch.py"
