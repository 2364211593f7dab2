"""Peak memory and time of one training forward + backward with and without activation
checkpointing (`trainer.activation_checkpointing`), each setting in a process of its own.

    python -m benchmarks.bench_activation_memory --model base --batch 64 --length 64

Each worker builds the model (random weights, a joint vocabulary of `--vocab`), runs one
forward + backward of a random batch (B x length source and target tokens, fp32, dropout on)
and reports its peak resident memory (`ru_maxrss`) and how much it grew over the resident
memory just before the forward; then it times `--repeats` more forward + backward passes.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from attnmt.model import ModelConfig, Transformer

ROOT = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    """This process's current resident memory (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    preset = yaml.safe_load((ROOT / "conf" / "model" / f"{args.model}.yaml").read_text())
    cfg = ModelConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, **preset)
    torch.manual_seed(0)
    model = Transformer(cfg).train()
    model.encoder.checkpoint_activations = model.decoder.checkpoint_activations = args.on
    src = torch.randint(4, args.vocab, (args.batch, args.length))
    tgt = torch.randint(4, args.vocab, (args.batch, args.length))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(src, tgt)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        loss.backward()

    before = _rss_mib()
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    return {
        "checkpointing": args.on,
        "peak_rss_mib": round(peak),
        "growth_mib": round(peak - before),
        "median_s": round(statistics.median(seconds), 3) if seconds else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="base", help="conf/model preset (default: base)")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=64, help="sentences (default: 64)")
    p.add_argument("--length", type=int, default=64, help="tokens per side (default: 64)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed passes after the first")
    p.add_argument("--worker", choices=["on", "off"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.on = args.worker == "on"
        print(json.dumps(worker(args)))
        return 0
    rows = []
    for setting in ("off", "on"):
        cmd = [sys.executable, "-m", "benchmarks.bench_activation_memory", *sys.argv[1:]]
        out = subprocess.run(
            [*cmd, "--worker", setting], cwd=ROOT, capture_output=True, text=True, check=True
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"model={args.model}, batch {args.batch} x {args.length} tokens a side, vocabulary "
        f"{args.vocab}, fp32, {args.threads} threads, one process per setting"
    )
    print(
        "| activation checkpointing | peak RSS MiB | growth in fwd+bwd MiB | fwd+bwd s (median) |"
    )
    print("|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['checkpointing']} | {r['peak_rss_mib']} | {r['growth_mib']} | {r['median_s']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
