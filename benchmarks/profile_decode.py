#!/usr/bin/env python
"""Where decoding time goes: `torch.profiler` over one search of a batch of real sentences.

Translates the first `--limit` input sentences (one search batch, length-sorted as
`translate.py` does) once to warm up, then once under the profiler, and prints the top ops by
self CPU time (what each op spends itself, its children excluded) and the wall time.

Usage:
    python -m benchmarks.profile_decode -c RUN_DIR --input test.en --beam 5
    python -m benchmarks.profile_decode -c RUN_DIR --input test.en --beam 1 --rows 25
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from attnmt.common.files import read_lines
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.translator import Translator

ROOT = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="profile_decode.py", description=__doc__.split("\n")[0])
    add = p.add_argument
    add("-c", "--checkpoint", required=True, help="run dir or .pt file")
    add("--input", required=True, help="source sentences, one per line")
    add("--beam", type=int, default=5, help="beam size; 1 = greedy (default: 5)")
    add("--limit", type=int, default=64, help="sentences, searched as one batch (default: 64)")
    add("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    add("--rows", type=int, default=20, help="ops to list (default: 20)")
    add("--quantize", choices=("none", "int8"), default="none", help="dynamic int8 linears")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    from attnmt.engine import load_engine

    model, tokenizer = load_engine([args.checkpoint], "cpu", args.quantize)  # as translate.py
    lines = read_lines(args.input, "--input")[: args.limit]
    cfg = SearchConfig(beam_size=args.beam, batch_size=len(lines))
    translator = Translator(model, tokenizer, cfg)
    translator.translate(lines)  # warm-up
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        translator.translate(lines)
    wall = time.perf_counter() - start
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(f"{len(lines)} sentences, beam {args.beam}: {wall:.3f} s under the profiler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
