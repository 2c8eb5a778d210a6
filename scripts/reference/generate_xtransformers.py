#!/usr/bin/env python3
"""x-transformers reference for variorum's generation speed with the LLaMA-style model
(scripts/bench-generate.sh, MODEL=llama).

The model of train_xtransformers.py (rotary positions over the whole head, RMSNorm, SwiGLU, two
key/value heads, no biases, tied embeddings, SDPA attention), randomly initialised, generating
greedily with x-transformers' own AutoregressiveWrapper.generate: `cache_kv=True` (its key/value
cache) and `cache_kv=False` (the whole sequence again per token). Timing, checks and the RESULT
line are generate_gpt.py's (its main, with this model).

    python generate_xtransformers.py --contexts 256,1024 --repeats 3 --threads 2 [--kv_heads 2]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from x_transformers import AutoregressiveWrapper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate_gpt  # noqa: E402
from train_xtransformers import XTransformersLM  # noqa: E402


def build(args, kv_heads: int, ff_mult: int):
    lm = XTransformersLM(args.vocab, args, kv_heads, ff_mult)
    wrapper = AutoregressiveWrapper(lm.net)

    def generate(prompt: list[int], new_tokens: int, cache_kv: bool) -> list[int]:
        out = wrapper.generate(torch.tensor([prompt]), new_tokens, temperature=0.0, cache_kv=cache_kv)
        return out[0].tolist()

    return (
        lm,
        lambda prompt, n: generate(prompt, n, True),
        lambda prompt, n: generate(prompt, n, False),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--kv_heads", type=int, default=2)
    p.add_argument("--ff_mult", type=int, default=4)
    own, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    if own.kv_heads < 1 or own.ff_mult < 1:
        p.error("--kv_heads and --ff_mult must be >= 1")
    return generate_gpt.main(rest, build=lambda args: build(args, own.kv_heads, own.ff_mult))


if __name__ == "__main__":
    sys.exit(main())
