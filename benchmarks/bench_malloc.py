"""Our search with and without `common.memory.keep_freed_memory` (what `translate.py` sets on
the CPU), each in a process of its own, timed interleaved (`benchmarks.peers`).

    python -m benchmarks.bench_malloc -c RUN_DIR --src test.en --limit 320 --beams 1,5
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import peers
from benchmarks.bench_translate import csv_ints
from checkpoint import load_for_inference, resolve_checkpoint
from common.errors import exit_status
from common.files import read_lines
from decoding.config import SearchConfig

KEEP, DEFAULT = "keep freed memory", "malloc defaults"


def main(argv: list[str] | None = None) -> int:
    return exit_status("bench_malloc.py", lambda: run(argv))


def run(argv: list[str] | None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-c", "--checkpoint", required=True, help="run dir or .pt file")
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--limit", type=int, default=320, help="first N sentences (default: 320)")
    p.add_argument(
        "--beams", type=csv_ints, default=[1, 5], help="comma-separated beam sizes (default: 1,5)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    path = str(resolve_checkpoint(args.checkpoint))
    _, tokenizer, _ = load_for_inference(path)
    lines = read_lines(args.src, "--src")[: args.limit]
    src_ids = tokenizer.encode_src([line.strip() for line in lines])
    cfgs = [SearchConfig(beam_size=b, batch_size=64) for b in args.beams]
    systems = {
        KEEP: peers.Isolated(peers.ours_from_checkpoint, (path, "none", 1, True), args.threads),
        DEFAULT: peers.Isolated(peers.ours_from_checkpoint, (path, "none", 1, False), args.threads),
    }
    cells = peers.compare(systems, src_ids, cfgs, args.repeats)
    print(
        f"{len(src_ids)} sentences of {args.src}, batches of 64, {args.threads} threads, "
        f"{args.repeats} interleaved repeats, each setting in a process of its own"
    )
    print("\n".join(peers.table(cells, KEEP)[0]))


if __name__ == "__main__":
    sys.exit(main())
