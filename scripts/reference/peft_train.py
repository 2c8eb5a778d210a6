#!/usr/bin/env python3
"""Fine-tunes a transformers causal LM the way scripts/lora-vs-peft.sh fine-tunes it with
variorum, for the comparison: AdamW, batch 1, windows of SEQ tokens of the shakespeare dataset ($VARIORUM_DATA/shakespeare/input.txt),
LoRA by PEFT (r > 0; alpha = 2r, on GPT-2's c_attn, c_proj and c_fc: variorum's q, k, v, out,
up and down) or every weight (r = 0). Prints one JSON line: the median tokens/s of the steps
after the first (as variorum's summary reports it), the peak resident memory (MiB), and the
number of trained parameters.

Usage: peft_train.py MODEL_DIR RANK STEPS [SEQ] [LR]
"""

import json
import os
import resource
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    model_dir, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    seq = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
    lr = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-4
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    if rank > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                 target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True))
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(trained, lr=lr, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8)
    data = os.environ.get("VARIORUM_DATA", "data")
    text = open(os.path.join(data, "shakespeare", "input.txt")).read()
    ids = AutoTokenizer.from_pretrained(model_dir)(text[: 40 * seq * 8])["input_ids"]
    rates = []
    for step in range(steps):
        start = (step * 7919 * seq) % (len(ids) - seq - 1)
        x = torch.tensor([ids[start : start + seq + 1]])
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).logits[0], x[0, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        rates.append(seq / (time.perf_counter() - t0))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens_per_sec": statistics.median(rates[1:]), "peak_rss_mib": peak,
                      "trained": sum(p.numel() for p in trained), "loss": float(loss)}))


if __name__ == "__main__":
    main()
