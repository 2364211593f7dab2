"""Attention forward + backward on the CPU at Multi30k's lengths, by kernel and dtype.

Why attention under bf16 autocast on the CPU does not use `F.scaled_dot_product_attention`
(model/attention.py, `MultiHeadAttention.attend`): SDPA's CPU kernel is slower in bf16 than in
fp32, most of all its backward, while plain bf16 matmuls with an fp32 softmax are faster than
either. Prints the median milliseconds of forward + backward per case.

    python -m benchmarks.bench_attention                 # B=112 H=4 T=18 S=17 Dh=64, 2 threads
    python -m benchmarks.bench_attention --batch 64 --len 30 --threads 4
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F


def sdpa(q, k, v, mask, causal):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def sdpa_fp32(q, k, v, mask, causal):
    out = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal
    )
    return out.to(q.dtype)


def explicit_fp32_softmax(q, k, v, mask, causal):
    """What model/attention.py runs for bf16 on the CPU: matmuls in q's dtype, fp32 softmax."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), -1).to(v.dtype), v)


KERNELS = {"sdpa": sdpa, "sdpa in fp32": sdpa_fp32, "explicit": explicit_fp32_softmax}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=112, help="sentences (B)")
    parser.add_argument("--len", type=int, default=18, help="tokens per sentence (S = T)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, H, L, Dh = args.batch, args.heads, args.len, args.head_dim
    mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
    mask[::3, ..., -(L // 4) :] = False  # a third of the sentences end in padding
    cases = {"self, padding mask": (mask, False), "causal": (None, True)}
    print(f"B={B} H={H} S=T={L} Dh={Dh}, {args.threads} threads, torch {torch.__version__}")
    print(f"{'dtype':9s} {'kernel':13s} {'case':19s} {'fwd+bwd ms':>10s}")
    for dtype in (torch.float32, torch.bfloat16):
        for name, kernel in KERNELS.items():
            for case, (m, causal) in cases.items():
                times = []
                for _ in range(args.repeats):
                    q, k, v = (
                        torch.randn(B, H, L, Dh, dtype=dtype, requires_grad=True) for _ in range(3)
                    )
                    start = time.perf_counter()
                    kernel(q, k, v, m, causal).float().sum().backward()
                    times.append(time.perf_counter() - start)
                median = statistics.median(times[3:]) * 1000
                print(f"{str(dtype)[6:]:9s} {name:13s} {case:19s} {median:10.2f}")


if __name__ == "__main__":
    main()
