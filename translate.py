#!/usr/bin/env python
"""Translate with a trained checkpoint: sentences as arguments, from a file, or from stdin.

    python translate.py -c RUN_DIR "A man rides a bike." "Two dogs play in the snow."
    echo "A man rides a bike." | python translate.py -c RUN_DIR
    python translate.py -c RUN_DIR --input test.en --output hyp.de --ref test.de --beam 5
    python translate.py -c RUN_DIR --plot-attention attn.png "A man rides a bike."
    python translate.py -c RUN_DIR --quantize int8 --device cpu --input test.en

(RUN_DIR: a run of the default experiment, English -> German.)

One translation per input line, in order (an empty line gives an empty line), written as the
input is read: a file `--buffer-size` lines at a time, a pipe or terminal line by line. Every
user mistake ends with one line on stderr, `translate.py: error: <problem>; <fix>`, and exit
status 1 (2 for bad flags), never a traceback. The flags and the run live in `decoding/cli.py`.
"""

from __future__ import annotations

import logging
import sys

from common.errors import exit_status
from decoding.cli import PROG, build_parser, run


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    return exit_status(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
