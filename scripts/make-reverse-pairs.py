#!/usr/bin/env python3
"""Writes configs/seq2seq/reverse.tsv, the paired-text example (docs/encoder-decoder.md).

Each line is `source<TAB>target`: a random word of 3-12 lowercase letters and the same word
reversed. A decoder must read the whole source to write the first target letter (the source's
last), so the task needs the encoder and cross-attention; a model that only copies or only
continues its own output cannot do it.

Usage: python3 scripts/make-reverse-pairs.py [N_PAIRS (3000)] [SEED (0)] > configs/seq2seq/reverse.tsv
(the shipped file is the defaults' output)
"""
import random
import string
import sys


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    for _ in range(n):
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 12)))
        print(f"{word}\t{word[::-1]}")


if __name__ == "__main__":
    main()
