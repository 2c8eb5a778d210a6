#!/usr/bin/env python3
"""PyTorch reference for variorum's generation speed (scripts/bench-generate.sh).

Builds the model of train_gpt.py (CharGPT: pre-LN GPT, learned positions, GELU, tied
embeddings), randomly initialised (generation speed does not depend on the weights), and
generates greedily from a prompt of random tokens in two modes:

  cache     a per-layer key/value cache: the prompt is run once, then every step feeds
            only the new token, which attends over the cached keys and values;
  no cache  the whole sequence is run through the model again for every new token.

Both modes must produce the same tokens. Each (context, mode) is timed --repeats times and
the median kept; tokens/s counts the new tokens over the whole call (prompt included), as
`variorum generate` does. The last line printed is

    RESULT {"settings": [{"context": ..., "cache": {"tokens_per_sec": ...}, "no_cache": {...}}, ...], ...}

Only the standard library and torch are used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# train_gpt.py only defines things at import time (its main() runs under __main__).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt import CharGPT, count_parameters, log  # noqa: E402


# --------------------------------------------------------------------------- KV cache


class KVCache:
    """Preallocated keys and values of every layer: (1, n_head, block_size, head_dim) each."""

    def __init__(self, model: CharGPT, n_head: int) -> None:
        n_embd = model.tok_emb.embedding_dim
        shape = (1, n_head, model.block_size, n_embd // n_head)
        self.k = [torch.zeros(shape) for _ in model.blocks]
        self.v = [torch.zeros(shape) for _ in model.blocks]
        self.len = 0  # positions filled


def forward_cached(model: CharGPT, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits of the last position of `idx` (1, t), the t tokens following the cache's contents.

    Reuses the modules of CharGPT; only the attention is rewritten to read and extend the cache.
    """
    _, t = idx.shape
    start = cache.len
    end = start + t
    if end > model.block_size:
        raise ValueError(f"sequence length {end} exceeds block_size {model.block_size}")
    pos = torch.arange(start, end)
    x = model.tok_emb(idx) + model.pos_emb(pos)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        h = attn.n_head
        b, _, c = x.shape
        q, k, v = attn.qkv(block.ln_attn(x)).split(c, dim=-1)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        cache.k[layer][:, :, start:end] = k.view(b, t, h, c // h).transpose(1, 2)
        cache.v[layer][:, :, start:end] = v.view(b, t, h, c // h).transpose(1, 2)
        keys = cache.k[layer][:, :, :end]
        values = cache.v[layer][:, :, :end]
        if t == 1:
            # a single query attends to every cached position: no mask
            y = F.scaled_dot_product_attention(q, keys, values)
        elif start == 0:
            # the prompt, on an empty cache: ordinary causal attention
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        else:
            raise ValueError("several new tokens on a non-empty cache are not needed here")
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + attn.proj(y)
        x = x + block.mlp(block.ln_mlp(x))
    cache.len = end
    return model.lm_head(model.ln_final(x[:, -1]))


# --------------------------------------------------------------------------- generation


def generate_cached(model: CharGPT, n_head: int, prompt: list[int], new_tokens: int) -> list[int]:
    cache = KVCache(model, n_head)
    logits = forward_cached(model, torch.tensor([prompt]), cache)
    out: list[int] = []
    for i in range(new_tokens):
        token = int(logits.argmax(-1).item())
        out.append(token)
        if i + 1 < new_tokens:
            logits = forward_cached(model, torch.tensor([[token]]), cache)
    return out


def generate_uncached(model: CharGPT, prompt: list[int], new_tokens: int) -> list[int]:
    seq = list(prompt)
    out: list[int] = []
    for _ in range(new_tokens):
        logits, _ = model(torch.tensor([seq]))  # causal, over the whole sequence
        token = int(logits[0, -1].argmax(-1).item())
        out.append(token)
        seq.append(token)
    return out


def timed(fn, *args) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    tokens = fn(*args)
    return time.perf_counter() - t0, tokens


# --------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--vocab", type=int, default=84, help="vocabulary size (Shakespeare characters: 84)")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--block_size", type=int, default=1024, help="position table size (speed does not depend on it)")
    p.add_argument("--contexts", default="256,1024", help="comma-separated: prompt + new tokens of each setting")
    p.add_argument("--prompt-len", type=int, default=16, help="random prompt tokens; new tokens = context - this")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per setting and mode (median kept)")
    p.add_argument("--warmup-tokens", type=int, default=8, help="untimed generation of this many tokens first, each mode; 0 = none")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0, help="seeds the initialisation and the prompts")
    args = p.parse_args(argv)
    try:
        args.contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        p.error(f"--contexts must be comma-separated integers, got {args.contexts!r}")
    if not args.contexts:
        p.error("--contexts is empty")
    for name in ("vocab", "n_layer", "n_head", "n_embd", "prompt_len", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup_tokens < 0:
        p.error("--warmup-tokens must be >= 0")
    for c in args.contexts:
        if c <= args.prompt_len:
            p.error(f"context {c} must exceed --prompt-len {args.prompt_len}")
    if args.block_size < max(args.contexts):
        p.error(f"--block_size {args.block_size} is below the largest context {max(args.contexts)}")
    return args


def main(argv=None, build=None) -> int:
    """Times both modes and prints the RESULT line. `build(args)` replaces the model (another
    reference, generate_xtransformers.py): it returns (model, cached, uncached), the two
    functions taking (prompt, new_tokens) and returning the new tokens, greedily."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if build is None:
        model = CharGPT(args.vocab, args.block_size, args.n_layer, args.n_head, args.n_embd)
        cached = lambda prompt, n: generate_cached(model, args.n_head, prompt, n)  # noqa: E731
        uncached = lambda prompt, n: generate_uncached(model, prompt, n)  # noqa: E731
    else:
        model, cached, uncached = build(args)
    model.eval()
    log(
        f"torch {torch.__version__} | threads {torch.get_num_threads()} | vocab {args.vocab} | "
        f"{args.n_layer} layers x {args.n_head} heads x {args.n_embd} | block_size {args.block_size} | "
        f"params {count_parameters(model)}"
    )
    gen = torch.Generator().manual_seed(args.seed)

    settings = []
    all_match = True
    with torch.no_grad():
        if args.warmup_tokens:
            warm = torch.randint(args.vocab, (args.prompt_len,), generator=gen).tolist()
            cached(warm, args.warmup_tokens)
            uncached(warm, args.warmup_tokens)
        for context in args.contexts:
            new_tokens = context - args.prompt_len
            prompt = torch.randint(args.vocab, (args.prompt_len,), generator=gen).tolist()
            modes = {
                "cache": lambda: cached(prompt, new_tokens),
                "no_cache": lambda: uncached(prompt, new_tokens),
            }
            setting = {"context": context, "prompt_len": args.prompt_len, "new_tokens": new_tokens}
            outputs = {}
            for mode, fn in modes.items():
                rates = []
                for r in range(args.repeats):
                    secs, tokens = timed(fn)
                    if r == 0:
                        outputs[mode] = tokens
                    elif tokens != outputs[mode]:
                        raise SystemExit(f"error: {mode} generation is not deterministic")
                    rates.append(new_tokens / max(secs, 1e-9))
                    log(f"context {context:5d} | {mode:8s} | run {r + 1}/{args.repeats} | "
                        f"{new_tokens} tokens in {secs:.2f} s: {rates[-1]:,.1f} tokens/s")
                setting[mode] = {"tokens_per_sec": statistics.median(rates), "runs_tokens_per_sec": rates}
            a, b = outputs["cache"], outputs["no_cache"]
            match = a == b
            setting["tokens_match"] = match
            if not match:
                all_match = False
                first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                setting["first_mismatch"] = first
                print(f"error: context {context}: cache and no-cache tokens differ from new token {first}",
                      file=sys.stderr, flush=True)
            log(f"context {context:5d} | median tokens/s: cache {setting['cache']['tokens_per_sec']:,.1f}, "
                f"no cache {setting['no_cache']['tokens_per_sec']:,.1f} | tokens match: {match}")
            settings.append(setting)

    result = {
        "settings": settings,
        "tokens_match": all_match,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "vocab_size": args.vocab,
        "n_layer": args.n_layer,
        "n_head": args.n_head,
        "n_embd": args.n_embd,
        "block_size": args.block_size,
        "seed": args.seed,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if all_match else 1


if __name__ == "__main__":
    sys.exit(main())
