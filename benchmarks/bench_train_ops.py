"""Dropout and the training loss, forward + backward on the CPU, ours beside PyTorch's.

Why the two kernels of `model/kernels.py` exist in their form: `F.dropout` draws one
Bernoulli sample per element, and autograd through log-softmax + gather + mean makes several
passes over the (tokens, vocabulary) float32 tensor. Prints the median milliseconds of
forward + backward per case, interleaved (A B, B A, ...), and ours / PyTorch's.

    python -m benchmarks.bench_train_ops                      # (64, 32, 256) bf16, vocab 8000
    python -m benchmarks.bench_train_ops --dtype float32 --threads 4
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F

from attnmt.model.kernels import dropout, label_smoothed_cross_entropy
from benchmarks import peers

PAD = 0


def autograd_loss(logits, target, eps):
    """The formula with plain autograd (what model/kernels.py computed before its
    hand-written backward)."""
    log_probs = F.log_softmax(logits.float(), dim=-1)
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -log_probs.mean(dim=-1)
    keep = target.ne(PAD)
    nll = nll.masked_fill(~keep, 0.0).sum()
    return (1.0 - eps) * nll + eps * smooth.masked_fill(~keep, 0.0).sum()


compare = partial(peers.compare_ops, table=peers.OpTable(unit="ms", warmup=1, width=34))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--len", type=int, default=32)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    print(
        f"torch {torch.__version__}, {args.threads} threads, {args.dtype}, "
        f"activations ({args.batch}, {args.len}, {args.dim}), vocabulary {args.vocab}"
    )

    x = torch.randn(args.batch, args.len, args.dim, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)

    def ours_dropout():
        dropout(x, args.p).backward(grad)

    def torch_dropout():
        F.dropout(x, args.p, True).backward(grad)

    compare(f"dropout p={args.p} fwd+bwd", ours_dropout, torch_dropout, args.rounds * args.repeats)

    logits = torch.randn(args.batch, args.len, args.vocab, dtype=dtype, requires_grad=True)
    target = torch.randint(1, args.vocab, (args.batch, args.len))
    target[:, -args.len // 8 :] = PAD  # some padding, as in a batch

    def ours_loss():
        label_smoothed_cross_entropy(logits, target, PAD, 0.1).loss.backward()

    def torch_loss():
        autograd_loss(logits, target, 0.1).backward()

    compare(
        "label-smoothed loss fwd+bwd",
        ours_loss,
        torch_loss,
        args.rounds * max(args.repeats // 2, 1),
    )


if __name__ == "__main__":
    main()
