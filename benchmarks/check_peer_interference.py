"""Does running CTranslate2 in this process slow our decoder down? (Why `benchmarks.peers`
runs each system in a process of its own.)

Times ours (`translate.py`'s search, greedy) `--repeats` times, then CTranslate2 float32 on
the same sentences, then ours again, all in this one process, and prints sentences/s of
each call with the CPU time of every thread that worked (from /proc, Linux): with a shared
OpenMP runtime, torch's worker threads go from busy the whole call to sleeping part of it.
The CTranslate2 figures it prints are slowed the other way (torch has run here first: see
`benchmarks.peers.ct2_from_folder`); they are not CTranslate2's speed.

    python -m benchmarks.check_peer_interference -c RUN_DIR --src test.en --limit 512
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import peers
from checkpoint import load_for_inference
from common.files import read_lines
from decoding.config import SearchConfig
from engine import Engine
from exporting.ct2 import export_ct2


def thread_ticks() -> dict[str, int]:
    """CPU clock ticks (user + system) of each thread of this process; {} off Linux."""
    ticks = {}
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        ticks[tid] = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def timed(name: str, search, src_ids: list[list[int]], cfg: SearchConfig) -> float:
    before, start = thread_ticks(), time.perf_counter()
    search(src_ids, cfg)
    wall = time.perf_counter() - start
    after = thread_ticks()
    busy = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
    busy = [b for b in busy if b > 0]
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    print(
        f"{name:<16} {len(src_ids) / wall:7.1f} sent/s   wall {wall:6.2f} s   "
        f"busy threads (s): {' '.join(f'{b / hz:.2f}' for b in busy)}",
        flush=True,
    )
    return len(src_ids) / wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-c", "--checkpoint", required=True, help="run dir or .pt file")
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--limit", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_for_inference(args.checkpoint)  # exported as it is
    lines = read_lines(args.src, "--src")[: args.limit]
    src_ids = tokenizer.encode_src([line.strip() for line in lines])
    cfg = SearchConfig(beam_size=1, batch_size=64)
    ours = peers.ours_system(Engine(model), tokenizer)  # as translate.py loads it
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        export_ct2(model, tokenizer, Path(tmp), "float32")
        ct2 = peers.ct2_system(Path(tmp), tokenizer, args.threads)
        ours(src_ids[:64], cfg)  # warm-up
        first = [timed("ours", ours, src_ids, cfg) for _ in range(args.repeats)]
        for _ in range(args.repeats):
            timed("ctranslate2", ct2, src_ids, cfg)
        then = [timed("ours, after", ours, src_ids, cfg) for _ in range(args.repeats)]
    low, high = min(then) / max(first), max(then) / min(first)
    print(f"ours after CTranslate2 ran in this process / before: {low:.2f}-{high:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
