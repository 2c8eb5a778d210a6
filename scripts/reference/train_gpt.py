#!/usr/bin/env python3
"""PyTorch reference trainer for variorum's `gpt-baby-shakespeare-char` preset.

A small, self-contained character-level GPT (GPT-2 style, pre-LayerNorm) trained
with AdamW, linear warm-up and cosine decay. It exists only to give variorum an
independent speed and loss baseline; see README.md beside this file for the exact
equivalence with configs/gpt-baby-shakespeare-char.toml.

Progress goes to stdout; the last line printed is

    RESULT {"tokens_per_sec": ..., "val_loss": ..., "train_loss": ..., "params": ..., "iters": ...}

Only the standard library and torch are used.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------- model


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one fused QKV projection, SDPA, output projection."""

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=True)
        self.proj = nn.Linear(n_embd, n_embd, bias=True)
        self.proj.is_residual_projection = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.n_head
        q, k, v = self.qkv(x).split(c, dim=-1)
        # (b, t, c) -> (b, h, t, c/h)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class FeedForward(nn.Module):
    """Position-wise MLP: Linear(d, 4d) -> exact GELU -> Linear(4d, d)."""

    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.up = nn.Linear(n_embd, 4 * n_embd, bias=True)
        self.down = nn.Linear(4 * n_embd, n_embd, bias=True)
        self.down.is_residual_projection = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x), approximate="none"))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(n_embd, eps=1e-5, bias=True)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_mlp = nn.LayerNorm(n_embd, eps=1e-5, bias=True)
        self.mlp = FeedForward(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        x = x + self.mlp(self.ln_mlp(x))
        return x


class CharGPT(nn.Module):
    """Token + learned absolute position embeddings, n_layer blocks, final LN, tied LM head."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_final = nn.LayerNorm(n_embd, eps=1e-5, bias=True)
        # The output projection has no bias (as in GPT-2) and shares its weight with tok_emb.
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight

        residual_std = 0.02 / math.sqrt(2 * n_layer)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                std = residual_std if getattr(module, "is_residual_projection", False) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        _, t = idx.shape
        if t > self.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_final(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def count_parameters(model: nn.Module) -> int:
    # Module.parameters() yields a shared (tied) tensor once.
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- data


def load_corpus(path: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    if not text:
        raise SystemExit(f"error: {path} is empty")
    vocab = sorted(set(text))  # over the WHOLE text, before splitting
    index = {ch: i for i, ch in enumerate(vocab)}
    data = torch.tensor([index[ch] for ch in text], dtype=torch.long)
    split = int(0.9 * len(data))
    return data[:split], data[split:], vocab


def random_batch(data: torch.Tensor, batch_size: int, block_size: int, gen: torch.Generator):
    # Start offsets uniform in [0, len - block_size - 1], so that targets stay in range.
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=gen)
    x = torch.stack([data[s : s + block_size] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + block_size] for s in starts.tolist()])
    return x, y


def fixed_windows(data: torch.Tensor, n_windows: int, block_size: int) -> list[int]:
    """Evenly spaced, deterministic window starts over the split (independent of any RNG)."""
    last = len(data) - block_size - 1
    if last < 0:
        raise SystemExit(
            f"error: validation split has {len(data)} tokens, need at least block_size + 1 = {block_size + 1}"
        )
    if n_windows == 1:
        return [0]
    return [(i * last) // (n_windows - 1) for i in range(n_windows)]


@torch.no_grad()
def evaluate(model: nn.Module, data: torch.Tensor, starts: list[int], block_size: int, batch_size: int, device) -> float:
    """Mean cross-entropy over every target position of the fixed windows."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(starts), batch_size):
        chunk = starts[i : i + batch_size]
        x = torch.stack([data[s : s + block_size] for s in chunk]).to(device)
        y = torch.stack([data[s + 1 : s + 1 + block_size] for s in chunk]).to(device)
        logits, _ = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum")
        total += loss.item()
        count += y.numel()
    model.train(was_training)
    return total / count


# --------------------------------------------------------------------------- optimisation


def learning_rate(it: int, lr: float, min_lr: float, warmup_iters: int, max_iters: int) -> float:
    """LR used for optimiser step `it` (0-based).

    Linear warm-up from 0: lr * it / warmup_iters for it < warmup_iters; then cosine decay
    from lr (at it = warmup_iters) to min_lr (at it = max_iters).
    """
    if it < warmup_iters:
        return lr * it / warmup_iters
    if it >= max_iters:
        return min_lr
    progress = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def make_optimizer(model: nn.Module, lr: float, betas, eps: float, weight_decay: float) -> torch.optim.AdamW:
    # Decay every parameter with >= 2 dimensions (Linear weights and both embeddings);
    # biases and LayerNorm gains/biases are not decayed.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


# --------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", default="data/shakespeare/input.txt", help="UTF-8 text corpus")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=12)
    p.add_argument("--max_iters", type=int, default=2000)
    p.add_argument("--eval_interval", type=int, default=250, help="steps per timing/eval interval")
    p.add_argument("--eval_iters", type=int, default=20, help="validation batches (eval_iters * batch_size fixed windows)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min_lr", type=float, default=None, help="default: lr / 10")
    p.add_argument("--warmup_iters", type=int, default=100)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--grad_clip", type=float, default=1.0, help="global-norm clip; 0 disables")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (the second GPU reference)")
    p.add_argument("--log_interval", type=int, default=50)
    args = p.parse_args(argv)
    if args.min_lr is None:
        args.min_lr = args.lr / 10
    for name in ("max_iters", "eval_interval", "eval_iters", "batch_size", "block_size", "threads", "log_interval"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    return args


def log(msg: str) -> None:
    print(msg, flush=True)


def main(argv=None, build_model=None) -> int:
    """Trains and prints the RESULT line. `build_model(vocab_size, args)` replaces the model (another
    reference, scripts/reference/train_xtransformers.py); it must return a module whose forward
    takes (idx, targets) and returns (logits, loss), as CharGPT's does."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    train_data, val_data, vocab = load_corpus(args.data)
    if len(train_data) <= args.block_size:
        raise SystemExit(f"error: training split has {len(train_data)} tokens, need more than block_size {args.block_size}")
    val_starts = fixed_windows(val_data, args.eval_iters * args.batch_size, args.block_size)

    if build_model is None:
        model = CharGPT(len(vocab), args.block_size, args.n_layer, args.n_head, args.n_embd)
    else:
        model = build_model(len(vocab), args)
    model = model.to(device)
    model.train()
    n_params = count_parameters(model)
    optimizer = make_optimizer(model, args.lr, (args.beta1, args.beta2), args.eps, args.weight_decay)
    if args.compile:
        # after the optimizer took the parameters; the compiled module shares them
        model = torch.compile(model)
    batch_gen = torch.Generator().manual_seed(args.seed)

    log(
        f"torch {torch.__version__} | threads {torch.get_num_threads()} | device {device} | "
        f"vocab {len(vocab)} | train {len(train_data)} tokens | val {len(val_data)} tokens | "
        f"{len(val_starts)} val windows | params {n_params}"
    )

    tokens_per_step = args.batch_size * args.block_size
    interval_rates: list[float] = []  # tokens/s of each interval, training steps only
    interval_seconds = 0.0
    interval_steps = 0
    interval_loss_sum = 0.0
    train_seconds_total = 0.0
    last_train_loss = float("nan")
    val_history: list[list[float]] = []
    val_loss = float("nan")

    for it in range(args.max_iters):
        lr = learning_rate(it, args.lr, args.min_lr, args.warmup_iters, args.max_iters)
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = random_batch(train_data, args.batch_size, args.block_size, batch_gen)
        x, y = x.to(device), y.to(device)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        loss_value = loss.item()  # also synchronises the device before the clock stops
        dt = time.perf_counter() - t0

        interval_seconds += dt
        interval_steps += 1
        interval_loss_sum += loss_value
        train_seconds_total += dt
        step = it + 1

        if step % args.log_interval == 0 and step % args.eval_interval != 0:
            log(f"step {step:5d} | loss {loss_value:.4f} | lr {lr:.2e} | {dt * 1000:.1f} ms/step")

        if step % args.eval_interval == 0 or step == args.max_iters:
            rate = interval_steps * tokens_per_step / interval_seconds
            interval_rates.append(rate)
            last_train_loss = interval_loss_sum / interval_steps
            val_loss = evaluate(model, val_data, val_starts, args.block_size, args.batch_size, device)
            val_history.append([step, val_loss])
            log(
                f"step {step:5d} | train loss {last_train_loss:.4f} (interval mean) | val loss {val_loss:.4f} | "
                f"lr {lr:.2e} | {rate:,.0f} tok/s"
            )
            interval_seconds, interval_steps, interval_loss_sum = 0.0, 0, 0.0

    # The first interval includes warm-up (allocator, thread pools); leave it out when possible.
    steady = interval_rates[1:] if len(interval_rates) > 1 else interval_rates
    result = {
        "tokens_per_sec": statistics.median(steady),
        "val_loss": val_loss,
        "train_loss": last_train_loss,
        "params": n_params,
        "iters": args.max_iters,
        "interval_tokens_per_sec": interval_rates,
        "val_loss_history": val_history,
        "train_seconds": train_seconds_total,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "vocab_size": len(vocab),
        "device": str(device),
        "device_mib": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
        "compiled": args.compile,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
