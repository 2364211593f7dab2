#!/usr/bin/env python
"""Average the weights of several checkpoints into one (Vaswani et al. 2017, sec. 6.1).

    python scripts/average_checkpoints.py --run-dir RUN --last 5 --output RUN/checkpoints/avg5.pt
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt
    python translate.py -c RUN/checkpoints/avg5.pt --input test.de

`--last K` takes the K newest `RUN/checkpoints/step_<N>.pt` files by step number. Floating-point
weights are averaged in float32 and cast back to their dtype; other tensors (integer buffers)
come from the last input, as do the model config, the tokenizer and the run's decoding.
Optimizer and other training state are dropped: the result is for translation (and further
averaging), not for resuming training. Written atomically, loaded safely (`weights_only=True`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnmt.checkpoint import CheckpointError, save_checkpoint
from attnmt.checkpoint.average import average_checkpoints, last_step_checkpoints
from attnmt.cli.args import Parser, program_name

PROG = program_name("average_checkpoints.py")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-dir", type=Path, help="run dir whose checkpoints/step_*.pt to use")
    source.add_argument("--inputs", type=Path, nargs="+", help="checkpoint files to average")
    parser.add_argument("--last", type=int, help="with --run-dir: newest K (default 5)")
    parser.add_argument("--output", type=Path, required=True, help="where to write the average")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.last is not None and args.inputs:  # averaging every file given, it is unused
            raise CheckpointError(
                "--last counts a run dir's checkpoints; --inputs averages every file given: "
                "drop --last"
            )
        last = 5 if args.last is None else args.last
        if last < 1:
            raise CheckpointError(f"--last must be at least 1, got {last}")
        if not args.output.parent.is_dir():
            raise CheckpointError(
                f"--output directory {args.output.parent} does not exist; create it first"
            )
        paths = args.inputs or last_step_checkpoints(args.run_dir, last)
        save_checkpoint(args.output, average_checkpoints(paths))
    except CheckpointError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print(
        f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
