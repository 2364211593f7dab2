#!/usr/bin/env python
"""How often the exported models' greedy outputs equal ours, on a real test set.

    python scripts/export_check.py -c RUN_DIR --src test2016.en
    python scripts/export_check.py -c RUN_DIR --src test2016.en --ref test2016.de --limit 200

Exports the checkpoint (as `scripts/export.py` does, into temporary folders) to Transformers
(MarianMTModel), CTranslate2 float32 and CTranslate2 int8, decodes `--src` greedily with each
and with ours (`translate.py --beam 1`), and prints, for each export, on how many sentences
its output ids are identical to ours, with the seconds it took (and BLEU/chrF with `--ref`).
Their speed against ours: `python -m benchmarks.benchmark --run RUN_DIR --peers ctranslate2`.
Every system gets our per-sentence length budget, int(max_len_a * src_len + max_len_b) tokens
(`exporting.hf.hf_search_ids` / `exporting.ct2.ct2_search_ids`), so a difference is a
difference in the
model's numbers, not in the search. An export that cannot run here (a pre-norm model for
Transformers, a package not installed) is reported as skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnmt.cli.args import Parser, program_name
from attnmt.common.errors import exit_status

PROG = program_name("export_check.py")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--checkpoint", required=True, help="run dir or .pt file")
    parser.add_argument("--src", required=True, type=Path, help="source sentences, one a line")
    parser.add_argument("--ref", type=Path, default=None, help="references: BLEU/chrF per system")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: library default)")
    return parser


def run(args: argparse.Namespace) -> list[str]:
    from attnmt.evaluation.bleu import corpus_bleu, corpus_chrf
    from attnmt.exporting.agreement import check_exports

    def metrics(hyps: list[str], refs: list[str]) -> str:
        bleu, chrf = corpus_bleu(hyps, refs).score, corpus_chrf(hyps, refs).score
        return f"  BLEU {bleu:.2f} chrF {chrf:.2f}"

    return check_exports(
        args.checkpoint, args.src, args.ref, args.limit, args.batch_size, args.threads, metrics
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
