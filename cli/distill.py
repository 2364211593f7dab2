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
import sys
from dataclasses import asdict
from pathlib import Path

from attnmt.cli.args import Parser, number, program_name
from attnmt.cli.translate import add_runtime_flags, add_search_flags
from attnmt.common.errors import UserError, exit_status

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


def teacher_languages(args: argparse.Namespace) -> tuple[str, str]:
    """(source, target) from the flags, else from the first teacher's training config. Flags
    must name the teacher's languages (any form; translate.py's rule, `check_language_flags`):
    they are the corpus files' suffixes, and another language's would be translated by a
    model that does not know it."""
    import torch

    from attnmt.checkpoint import resolve_checkpoint
    from attnmt.data.languages import model_languages
    from attnmt.engine.runs import check_language_flags

    # load_engine checks the file; mmap reads only the entries looked at
    stored = torch.load(resolve_checkpoint(args.teacher[0]), mmap=True, weights_only=True)
    check_language_flags(args.src_lang, args.tgt_lang, *model_languages(stored))
    if args.src_lang and args.tgt_lang:
        return args.src_lang, args.tgt_lang
    config = stored.get("config") or {}
    data = config.get("data") or {}
    src, tgt = args.src_lang or data.get("src_lang"), args.tgt_lang or data.get("tgt_lang")
    if not src or not tgt:
        raise UserError(
            f"--teacher {args.teacher[0]} does not say its languages; give --src-lang and "
            "--tgt-lang (the corpus files' suffixes, e.g. en and de)"
        )
    return src, tgt


def run(args: argparse.Namespace) -> None:
    from attnmt.cli.translate import check_sampling_flags, runtime_options, search_from_flags
    from attnmt.common import runtime
    from attnmt.decoding.translator import Translator
    from attnmt.engine.runs import load_model, run_decoding
    from attnmt.training.distill import distill_corpus

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    flags = search_from_flags(args)
    check_sampling_flags(args)
    options = runtime_options(args, PROG)
    model, tokenizer, device = load_model(options, args.teacher)
    src, tgt = teacher_languages(args)
    cfg, precision, _ = run_decoding(options, flags, args.teacher[0], device)
    if tokenizer.languages:  # a multilingual imported teacher: its codes for this pair
        tokenizer = tokenizer.for_languages(args.src_lang, args.tgt_lang)
    translator = Translator(model, tokenizer, cfg, device)
    settings = {
        "teachers": [str(Path(t).resolve()) for t in args.teacher],
        "src_lang": src,
        "tgt_lang": tgt,
        "search": asdict(cfg),
        "precision": precision,
        "quantize": args.quantize,
    }

    def translate(lines: list[str]) -> list[list[str]]:
        with runtime.autocast(translator.device.type, precision):
            found = translator.translate_nbest(lines)
        return [[hyp.text for hyp in hyps] for hyps in found]

    def log(line: str) -> None:
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    out = distill_corpus(
        translate, args.data_dir, args.out, src, tgt, settings, args.chunk_lines, log,
        args.keep_original, cfg.nbest,
    )  # fmt: skip
    log(f"done: train.py data.dir={out} trains on the teacher's translations")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: run(args))
