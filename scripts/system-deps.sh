#!/usr/bin/env bash
# System packages variorum needs beyond the Rust toolchain (Debian/Ubuntu):
#   libopenblas-dev      OpenBLAS for the ndarray backend (--device ndarray)
#   mesa-vulkan-drivers  lavapipe, a software Vulkan driver: --device wgpu without a GPU
#   fonts-dejavu-core    a font for the loss-curve plot
#   pkg-config           finds OpenBLAS at build time
#   chromium-headless-shell  a headless browser: the run report's test loads the page in it
set -euo pipefail
pkgs=(libopenblas-dev mesa-vulkan-drivers fonts-dejavu-core pkg-config chromium-headless-shell)
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
