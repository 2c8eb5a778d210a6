#!/usr/bin/env python3
"""x-transformers reference for variorum's `llama-baby-shakespeare-char` preset.

The same data, recipe, timing and RESULT line as train_gpt.py (whose training loop this reuses),
with the model a PyTorch user would build for a LLaMA-style decoder: x-transformers'
TransformerWrapper + Decoder with rotary positions, RMSNorm, a SwiGLU feed-forward (ff_glu +
ff_swish, inner width ff_mult · dim = 512), two key/value heads shared by the query heads, no
biases, tied embeddings, no absolute positions. x-transformers' own initialisation is kept.

    python train_xtransformers.py --data input.txt --max_iters 2000 --threads 2 [--kv_heads 2]
"""

from __future__ import annotations

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
    argv = list(sys.argv[1:] if argv is None else argv)
    # our two options, the rest is train_gpt's
    own = {"--kv_heads": 2, "--ff_mult": 4}
    rest = []
    it = iter(argv)
    for a in it:
        name, eq, value = a.partition("=")
        if name in own:
            own[name] = int(value if eq else next(it))
        else:
            rest.append(a)
    return train_gpt.main(rest, build_model=lambda vocab, args: XTransformersLM(vocab, args, own["--kv_heads"], own["--ff_mult"]))


if __name__ == "__main__":
    sys.exit(main())
