"""Score translations against references: sacreBLEU BLEU and chrF with their signatures, and the
Transformer paper's tokenized, compound-split BLEU (`evaluation/paper_bleu.py`).

    python scripts/score.py --hyp RUN/hyp.newstest2014.de --ref WMT14/newstest2014.de

Both files hold detokenized text, one sentence per line, line-aligned (what translate.py and
train.py write, and the raw references). The two BLEU numbers differ: sacreBLEU's is the one to
compare with other work today; the paper's 27.3 (base) and 28.4 (big) are the other one.
"""

from __future__ import annotations

import argparse
import sys

from attnmt.cli.args import Parser, program_name
from attnmt.common.errors import UserError, exit_status
from attnmt.common.files import read_lines
from attnmt.evaluation.bleu import corpus_bleu, corpus_chrf
from attnmt.evaluation.paper_bleu import paper_bleu

PROG = program_name("score.py")


def build_parser() -> argparse.ArgumentParser:
    # the docstring's first paragraph, whole: its first line alone stops mid-sentence
    summary = " ".join(__doc__.split("\n\n")[0].split())
    parser = Parser(prog=PROG, description=summary)
    add = parser.add_argument
    add("--hyp", required=True, metavar="FILE", help="translations, one per line (UTF-8)")
    add("--ref", required=True, metavar="FILE", help="references, line-aligned with --hyp")
    return parser


def run(args: argparse.Namespace) -> None:
    hyps, refs = read_lines(args.hyp, "--hyp"), read_lines(args.ref, "--ref")
    if len(hyps) != len(refs):
        raise UserError(
            f"--hyp has {len(hyps)} lines but --ref has {len(refs)}; give line-aligned files"
        )
    bleu, chrf, paper = corpus_bleu(hyps, refs), corpus_chrf(hyps, refs), paper_bleu(hyps, refs)
    print(f"sentences        {len(hyps)}")
    print(f"sacreBLEU BLEU   {bleu.score:.2f}  {bleu.signature}")
    print(f"sacreBLEU chrF   {chrf.score:.2f}  {chrf.signature}")
    print(f"paper BLEU       {paper.score:.2f}  {paper.signature}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
