"""Distilling with a teacher (or an ensemble of teachers), what `scripts/distill.py` runs: the
teachers loaded as translate.py loads them (`engine.runs`), the languages checked, and the
corpus translated (`training.distill.distill_corpus`)."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig
from attnmt.engine.runs import RuntimeOptions, check_language_flags, load_model, run_decoding


@dataclass(frozen=True)
class DistillOptions:
    """What `distill` does (distill.py's flags of the same names)."""

    teachers: tuple[str, ...]  # run dirs or checkpoints: several are an ensemble
    data_dir: str
    out: str
    search: SearchConfig  # the search flags (the first teacher run's decoding fills the rest)
    runtime: RuntimeOptions
    src_lang: str | None = None
    tgt_lang: str | None = None
    chunk_lines: int = 10_000
    keep_original: bool = False
    threads: int | None = None  # torch CPU threads (None: torch's)


def teacher_languages(options: DistillOptions) -> tuple[str, str]:
    """(source, target) from the options, else from the first teacher's training config.
    They must name the teacher's languages (any form; translate.py's rule,
    `check_language_flags`): they are the corpus files' suffixes, and another language's
    would be translated by a model that does not know it."""
    import torch

    from attnmt.checkpoint import resolve_checkpoint
    from attnmt.data.languages import model_languages

    teacher, src_lang, tgt_lang = options.teachers[0], options.src_lang, options.tgt_lang
    # load_engine checks the file; mmap reads only the entries looked at
    stored = torch.load(resolve_checkpoint(teacher), mmap=True, weights_only=True)
    check_language_flags(src_lang, tgt_lang, *model_languages(stored))
    if src_lang and tgt_lang:
        return src_lang, tgt_lang
    config = stored.get("config") or {}
    data = config.get("data") or {}
    src, tgt = src_lang or data.get("src_lang"), tgt_lang or data.get("tgt_lang")
    if not src or not tgt:
        raise UserError(
            f"--teacher {teacher} does not say its languages; give --src-lang and "
            "--tgt-lang (the corpus files' suffixes, e.g. en and de)"
        )
    return src, tgt


def distill(options: DistillOptions) -> None:
    """Translate the corpus's training sources with the teachers into `options.out`."""
    from attnmt.common import runtime
    from attnmt.decoding.translator import Translator
    from attnmt.training.distill import distill_corpus

    if options.threads:
        import torch

        torch.set_num_threads(options.threads)
    prog, teachers = options.runtime.prog, list(options.teachers)
    model, tokenizer, device = load_model(options.runtime, teachers)
    src, tgt = teacher_languages(options)
    cfg, precision, _ = run_decoding(options.runtime, options.search, teachers[0], device)
    if tokenizer.languages:  # a multilingual imported teacher: its codes for this pair
        tokenizer = tokenizer.for_languages(options.src_lang, options.tgt_lang)
    translator = Translator(model, tokenizer, cfg, device)
    settings = {
        "teachers": [str(Path(t).resolve()) for t in teachers],
        "src_lang": src,
        "tgt_lang": tgt,
        "search": asdict(cfg),
        "precision": precision,
        "quantize": options.runtime.quantize,
    }

    def translate(lines: list[str]) -> list[list[str]]:
        with runtime.autocast(translator.device.type, precision):
            found = translator.translate_nbest(lines)
        return [[hyp.text for hyp in hyps] for hyps in found]

    def log(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stderr, flush=True)

    out = distill_corpus(
        translate, options.data_dir, options.out, src, tgt, settings, options.chunk_lines, log,
        options.keep_original, cfg.nbest,
    )  # fmt: skip
    log(f"done: train.py data.dir={out} trains on the teacher's translations")
