"""PyTorch's attention on the CPU or a CUDA GPU (--device cuda), the outside reference of
`variorum bench-attention`.

One point per process (its peak memory is its own): forward + backward at one sequence length,
batch 1, causal, median of --reps timed runs after one untimed run. Two modes:

- `layer`: what `variorum bench-attention` measures: the fused QKV projection, multi-head
  `scaled_dot_product_attention`, the output projection, the input's gradient;
- `attention`: `scaled_dot_product_attention` alone, q, k, v as leaves.

--window W > 0 hides keys more than W − 1 back with a dense boolean mask: sliding-window attention
as PyTorch runs it on a CPU (FlexAttention, its block-sparse path, has no CPU backward).

On CUDA the time waits for the GPU (synchronize after each step) and "device_mib" is the peak of
torch.cuda.max_memory_allocated during the timed steps.

Prints one line: RESULT {"mode", "window", "len", "ms", "peak_mib", "device_mib", "device", "torch"}.
"""

import argparse
import json
import resource
import statistics
import time

import torch
import torch.nn.functional as F


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["layer", "attention"], default="layer")
    p.add_argument("--len", type=int, required=True)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.set_default_device(dev)
    cuda = dev.type == "cuda"
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    n, d, h = a.len, a.d_model, a.heads
    dh = d // h
    mask = None
    if a.window > 0:
        i = torch.arange(n)
        dist = i[:, None] - i[None, :]
        mask = (dist >= 0) & (dist < a.window)  # True = may attend

    def attend(q, k, v):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    if a.mode == "layer":
        qkv = torch.nn.Linear(d, 3 * d)
        out = torch.nn.Linear(d, d)
        x = torch.randn(1, n, d, requires_grad=True)

        def step():
            q, k, v = qkv(x).view(1, n, 3, h, dh).permute(2, 0, 3, 1, 4)
            y = attend(q, k, v).transpose(1, 2).reshape(1, n, d)
            out(y).sum().backward()
            return x.grad.sum().item()
    else:
        q, k, v = (torch.randn(1, h, n, dh, requires_grad=True) for _ in range(3))

        def step():
            attend(q, k, v).sum().backward()
            return q.grad.sum().item()

    def timed_step():
        step()
        if cuda:
            torch.cuda.synchronize()

    base = rss_mib()
    times = []
    for r in range(a.reps + 1):
        if cuda and r == 1:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        timed_step()
        if r > 0:
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    result = {
        "mode": a.mode,
        "window": a.window,
        "len": n,
        "ms": statistics.median(times) * 1e3,
        "peak_mib": max(peak, 0.0),
        "device_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
