#!/usr/bin/env python3
"""A GPT-2-small-shaped transformers model with random weights, for measurements at real size
(scripts/hf-125m.sh, scripts/lora-vs-peft.sh): 12 layers of 768, 1,024 positions, and a BPE
tokenizer trained on the fixture corpus and padded with added tokens to GPT-2's 50,257 rows, so
that every id the model can choose decodes to the same text on both sides.

Usage: gpt2_125m.py OUT [SCALE]   (SCALE multiplies every matrix: 4 keeps greedy tokens away
from near-ties; default 1)
"""

import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

out = sys.argv[1]
scale = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
text = open("crates/variorum-train/tests/fixtures/hf/export/corpus.txt").read()
tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.add_tokens([f"<t{i}>" for i in range(tok.get_vocab_size(), 50257)])
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12, bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(cfg).eval()
if scale != 1.0:
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
model.save_pretrained(out)
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)
n = sum(p.numel() for p in model.parameters())
print(f"model: GPT-2 small shape, {n / 1e6:.1f} M parameters, {n * 4 / 2**20:.0f} MiB in f32")
