"""A decoding step's heavy ops on the CPU, ours beside PyTorch's default, at search shapes.

Why `decoding.search.topk` exists: torch's CPU `topk` does not vectorise, where a chunked
search over `amax` does. Also the normaliser of the next-token scores: one `log_softmax` pass
against `logsumexp`. Rows are a step's decoder rows: 64 sentences greedy (64) or beam 5 (320).
Prints the median microseconds per call of each, interleaved (A B, B A, ...), and
theirs / ours. (oneDNN's pre-packed linear layers were measured here too, 1.23-1.77x alone on
one CPU, but gained nothing on real sentences and were removed: docs/benchmarks.md.)

    python -m benchmarks.bench_decode_ops                       # d_model 256, ff 1024, vocab 8000
    python -m benchmarks.bench_decode_ops --rows 64 320 --threads 4
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch

from attnmt.decoding.search import topk
from benchmarks import peers

compare = partial(peers.compare_ops, table=peers.OpTable(unit="us", warmup=3, width=42))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 320])
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--beam", type=int, default=5, help="top-k is 1 and 2 x beam")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, float32, vocabulary {args.vocab}")
    V = args.vocab
    with torch.inference_mode():
        for rows in args.rows:
            print(f"-- {rows} rows")
            logits = torch.randn(rows, V)
            for k in sorted({1, 2 * args.beam}):
                compare(
                    f"top-{k} of ({rows}, {V})",
                    lambda k=k, z=logits: topk(z, k),
                    lambda k=k, z=logits: z.topk(k, dim=-1),
                    args.repeats,
                )
            compare(
                f"log_softmax vs logsumexp ({rows}, {V})",
                lambda z=logits: torch.log_softmax(z, dim=-1),
                lambda z=logits: z.logsumexp(dim=-1, keepdim=True),
                args.repeats,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
