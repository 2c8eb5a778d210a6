#!/usr/bin/env bash
# System packages variorum needs beyond the Rust toolchain (Debian/Ubuntu):
#   mesa-vulkan-drivers  lavapipe, a software Vulkan driver: --device wgpu without a GPU
#   fonts-dejavu-core    a font for the loss-curve plot
#   chromium-headless-shell  a headless browser: the run report's test loads the page in it
# With `--features ndarray` (the ndarray backend, opt-in): add libopenblas-dev and pkg-config,
# or run this script with NDARRAY=1.
set -euo pipefail
pkgs=(mesa-vulkan-drivers fonts-dejavu-core chromium-headless-shell)
[ "${NDARRAY:-0}" = 1 ] && pkgs+=(libopenblas-dev pkg-config)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: please install the equivalents of: ${missing[*]}" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "system-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
