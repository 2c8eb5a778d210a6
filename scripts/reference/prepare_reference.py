#!/usr/bin/env python3
"""The Python side of scripts/prepare-benchmark.sh: the same JSON Lines files tokenized with
the same tokenizer.json by Hugging Face `tokenizers` (pinned in requirements.txt), two ways.

  encode-batch  read each file, `Tokenizer.encode_batch` its texts 1,024 at a time (the
                parallel Rust encoder behind Python), count the tokens;
  nanogpt       nanoGPT's prepare.py shape: tokenize every document, append the end-of-text
                id, then write all ids as uint16 into one np.memmap train.bin (tiktoken
                cannot load a tokenizer.json, so the encoder is `tokenizers`' as above).

Usage: prepare_reference.py MODE TOKENIZER_JSON OUT_DIR FILE...   Prints tokens and seconds."""
import json
import os
import sys
import time

import numpy as np
from tokenizers import Tokenizer

mode, tok_path, out, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
start = time.perf_counter()
tok = Tokenizer.from_file(tok_path)
eot = tok.token_to_id("<|endoftext|>")
BATCH = 1024


def documents(path):
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)["text"]


def batches(path):
    batch = []
    for d in documents(path):
        batch.append(d)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


tokens = 0
if mode == "encode-batch":
    for f in files:
        for b in batches(f):
            tokens += sum(len(e.ids) for e in tok.encode_batch(b, add_special_tokens=False))
elif mode == "nanogpt":
    arrays = []
    for f in files:
        for b in batches(f):
            for e in tok.encode_batch(b, add_special_tokens=False):
                arrays.append(np.array(e.ids + [eot], dtype=np.uint16))
    tokens = sum(len(a) for a in arrays)
    os.makedirs(out, exist_ok=True)
    arr = np.memmap(os.path.join(out, "train.bin"), dtype=np.uint16, mode="w+", shape=(tokens,))
    at = 0
    for a in arrays:
        arr[at : at + len(a)] = a
        at += len(a)
    arr.flush()
else:
    sys.exit(f"unknown mode {mode}")
print(json.dumps({"mode": mode, "tokens": tokens, "seconds": time.perf_counter() - start}))
