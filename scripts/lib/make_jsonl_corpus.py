#!/usr/bin/env python3
"""Writes a corpus of JSON Lines files ({"id", "text"} per line) of about SIZE_MB megabytes in
FILES files, generated locally from a text (Shakespeare's paragraphs, drawn at random with a
fixed seed): the many-file, many-document shape of a FineWeb or TinyStories download, without
the download. Usage: make_jsonl_corpus.py TEXT OUT_DIR SIZE_MB FILES [SEED]"""
import json
import os
import random
import sys

text, out, size_mb, files = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
paragraphs = [p for p in open(text, encoding="utf-8").read().split("\n\n") if p.strip()]
rng = random.Random(seed)
os.makedirs(out, exist_ok=True)
per_file = size_mb * 1e6 / files
doc_id = 0
for f in range(files):
    written = 0
    with open(os.path.join(out, f"part-{f:04d}.jsonl"), "w", encoding="utf-8") as fh:
        while written < per_file:
            doc = "\n\n".join(rng.choice(paragraphs) for _ in range(rng.randint(1, 12))) + "\n"
            line = json.dumps({"id": doc_id, "text": doc}, ensure_ascii=False) + "\n"
            fh.write(line)
            written += len(line.encode("utf-8"))
            doc_id += 1
