"""The `scripts/distill.py` command line: a teacher translates a corpus's training sources into
a corpus for a student (sequence-level knowledge distillation; `training.distill`).

    python scripts/distill.py --teacher RUN [--teacher RUN2 ...] --data-dir DIR --out OUT
    python train.py experiment=multi30k_en_de_student data.dir=OUT

Several `--teacher`s translate as an ensemble (their log-probabilities averaged at each step:
`translate.py -c A -c B`); a run imported from Transformers (`scripts/import_hf.py`) is a
teacher like any other. The languages are the teacher run's `data.src_lang`/`data.tgt_lang`
unless `--src-lang`/`--tgt-lang` say otherwise (a multilingual imported teacher needs them).
Killed and run again with the same flags, it resumes (`training.distill`). With `--nbest N`,
each source gets its N best translations (N samples with `--sampling`) as N pairs.
"""

from __future__ import annotations

import argparse

from attnmt.cli.args import Parser, number, program_name
from attnmt.cli.translate import add_runtime_flags, add_search_flags
from attnmt.common.errors import exit_status

PROG = program_name("distill.py")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Translate a corpus's training sources with a teacher (or an ensemble) "
        "into a corpus folder for training a student.",
    )
    add = parser.add_argument
    add(
        "--teacher",
        required=True,
        action="append",
        metavar="RUN",
        help="teacher run dir or checkpoint; repeat it for an ensemble",
    )
    add(
        "--data-dir",
        required=True,
        metavar="DIR",
        help="corpus folder of <split>.<lang> files (as train.py's data.dir)",
    )
    add(
        "--out",
        required=True,
        metavar="OUT",
        help="folder for the distilled corpus: train.<src> as given, train.<tgt> the "
        "teacher's translations, the other files copied",
    )
    add("--src-lang", metavar="CODE", help="source language (default: the teacher run's)")
    add("--tgt-lang", metavar="CODE", help="target language (default: the teacher run's)")
    add(
        "--chunk-lines",
        type=number(int, 1),
        default=10_000,
        metavar="N",
        help="lines translated (length-sorted) and saved at a time; a resumed run loses at "
        "most one chunk (default: 10000)",
    )
    add(
        "--keep-original",
        action="store_true",
        help="train.<src> and train.<tgt> also hold the corpus's own pairs, after the "
        "teacher's: the student learns from both (docs/distillation.md)",
    )
    add("--threads", type=number(int, 1), metavar="N", help="torch CPU threads (default: torch's)")
    add_search_flags(parser, _NBEST_HELP)  # --beam, ...: the first teacher run's by default
    add_runtime_flags(parser)
    return parser


# What --nbest does here (translate.py prints the hypotheses; this writes them as pairs).
_NBEST_HELP = (
    "; above 1, each source becomes that many pairs: train.<tgt> holds its N best "
    "translations (N samples with --sampling), best first, and train.<src> repeats the source "
    "N times (a source with fewer hypotheses, as an empty line, repeats its last)"
)


def run(args: argparse.Namespace) -> None:
    from attnmt.cli.translate import check_sampling_flags, runtime_options, search_from_flags
    from attnmt.training.teachers import DistillOptions, distill

    flags = search_from_flags(args)
    check_sampling_flags(args)
    options = DistillOptions(
        tuple(args.teacher), args.data_dir, args.out, flags, runtime_options(args, PROG),
        args.src_lang, args.tgt_lang, args.chunk_lines, args.keep_original, args.threads,
    )  # fmt: skip
    distill(options)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: run(args))
