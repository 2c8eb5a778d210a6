#!/usr/bin/env python3
"""x-transformers reference for variorum's `llama-baby-shakespeare-char` preset.

The same data, recipe, timing and RESULT line as train_gpt.py (whose training loop this reuses),
with the model a PyTorch user would build for a LLaMA-style decoder: x-transformers'
TransformerWrapper + Decoder with rotary positions (over the whole head; x-transformers pairs
dimensions (2k, 2k + 1), variorum's `layout = "interleaved"`), RMSNorm, a SwiGLU feed-forward (ff_glu +
ff_swish, inner width ff_mult · dim = 512), two key/value heads shared by the query heads, no
biases, tied embeddings, no absolute positions, and attention through PyTorch's fused
scaled_dot_product_attention (`attn_flash=True`; x-transformers' default forms the score matrix
with einsums, slower). x-transformers' own initialisation is kept.

    python train_xtransformers.py --data input.txt --max_iters 2000 --threads 2 [--kv_heads 2] [--ff_mult 4]

Every other option is train_gpt.py's.
"""

from __future__ import annotations

import argparse
import sys

import torch.nn as nn
import torch.nn.functional as F
from x_transformers import Decoder, TransformerWrapper

import train_gpt


class XTransformersLM(nn.Module):
    """TransformerWrapper whose forward returns (logits, loss) as train_gpt's loop expects."""

    def __init__(self, vocab_size: int, args, kv_heads: int, ff_mult: int) -> None:
        super().__init__()
        if args.n_embd % args.n_head != 0:
            raise SystemExit(f"error: n_embd ({args.n_embd}) must be divisible by n_head ({args.n_head})")
        self.net = TransformerWrapper(
            num_tokens=vocab_size,
            max_seq_len=args.block_size,
            use_abs_pos_emb=False,
            tie_embedding=True,
            attn_layers=Decoder(
                dim=args.n_embd,
                depth=args.n_layer,
                heads=args.n_head,
                attn_dim_head=args.n_embd // args.n_head,
                attn_kv_heads=kv_heads,
                attn_flash=True,
                rotary_pos_emb=True,
                rotary_emb_dim=args.n_embd // args.n_head,  # the whole head, as ours (its default is half)
                use_rmsnorm=True,
                ff_glu=True,
                ff_swish=True,
                ff_mult=ff_mult,
                ff_no_bias=True,
            ),
        )

    def forward(self, idx, targets=None):
        logits = self.net(idx)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def main(argv=None) -> int:
    # our two options; the rest (and --help's) are train_gpt's
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--kv_heads", type=int, default=2, help="key/value heads shared by the query heads")
    p.add_argument("--ff_mult", type=int, default=4, help="SwiGLU inner width = ff_mult * n_embd")
    own, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    if own.kv_heads < 1 or own.ff_mult < 1:
        p.error("--kv_heads and --ff_mult must be >= 1")
    return train_gpt.main(rest, build_model=lambda vocab, args: XTransformersLM(vocab, args, own.kv_heads, own.ff_mult))


if __name__ == "__main__":
    sys.exit(main())
