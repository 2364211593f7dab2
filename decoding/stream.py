"""Translating (or scoring) a stream of lines, what `translate.py` runs: the input read and
translated a batch at a time (`decoding.inputs`), each batch's translations written and
flushed before the next batch is read, a `--prefix` or `--score` file read in step with it,
n-best lines, word alignments, scores, BLEU against references and the attention plot.

`translate_run` takes what to do (`TranslationRun`, built by the command line from its
flags) and how to load the model (called once the inputs are checked, so a bad file fails
before the model loads). Every user mistake raises `UserError`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, Protocol

from attnmt.common.errors import UserError
from attnmt.common.files import atomic_open, read_lines
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary
from attnmt.decoding.inputs import AlignedLines, Input, open_aligned, open_input

if TYPE_CHECKING:  # heavy imports (torch) wait until the inputs are checked
    from attnmt.decoding.scoring import TokenScores
    from attnmt.decoding.translator import TextHypothesis, Translator


@dataclass(frozen=True)
class TranslationRun:
    """What one `translate.py` run does besides loading the model (its flags, checked)."""

    sentences: tuple[str, ...] = ()  # given on the command line, one line each
    input: str | None = None  # --input FILE (else the sentences, else stdin)
    buffer_size: int = 10000
    output: str | None = None  # --output FILE, written atomically (else stdout)
    ref: str | None = None  # --ref FILE: BLEU and chrF on stderr
    score: str | None = None  # --score FILE: score its translations instead of translating
    token_scores: bool = False
    prefix: str | None = None  # --prefix FILE
    tab_prefix: bool = False
    glossary: str | None = None  # --glossary FILE
    split_sentences: bool = False
    src_lang: str | None = None  # the language --split-sentences splits by, when given
    tag: str | None = None
    print_alignment: bool = False
    alignment_layer: int | None = None
    plot_attention: str | None = None  # --plot-attention PNG
    inter_threads: int = 1
    prog: str = "translate.py"  # what warnings start with


class Loaded(Protocol):
    """What the model loader gives (`engine.runs.LoadedRun`)."""

    model: Any
    tokenizer: Any
    search: SearchConfig
    device: str
    precision: str  # the autocast precision
    sources: list[str]  # the model's source languages


class Translated(NamedTuple):
    lines: int  # input lines translated
    hyps: list[str]  # their best translations, when asked to keep them (for --ref)
    first: str | None  # the first non-empty input line (for --plot-attention)


class StreamOptions(NamedTuple):
    """What `translate_input` does besides translating each batch."""

    nbest: int  # hypotheses printed per sentence
    keep: bool  # keep the best translations (for --ref)
    prefixes: AlignedLines | None = None  # --prefix FILE
    tab_prefix: bool = False  # input lines are SOURCE<TAB>PREFIX
    align: bool = False  # --print-alignment
    layer: int | None = None  # --alignment-layer
    tag: str | None = None  # --tag: put before each non-empty line
    split: str | None = None  # --split-sentences: the ISO 639-1 code whose rules split lines
    glossary: Glossary | None = None  # --glossary: terms the translations must use


def translate_run(run: TranslationRun, load: Callable[[], Loaded]) -> None:
    """Translate (or score) what `run` asks for with the model `load()` gives; `--output` is
    written to a temp file renamed into place at the end, so an error or Ctrl-C leaves any
    previous file intact."""
    from attnmt.common.runtime import autocast

    sentences = [" ".join(s.splitlines()) for s in run.sentences]
    refs = None if run.ref is None else read_lines(run.ref, "--ref")
    side_flag, side_path = ("--score", run.score) if run.score else ("--prefix", run.prefix)
    glossary = None if run.glossary is None else Glossary.from_file(run.glossary)
    with open_input(sentences, run.input, run.buffer_size) as source:
        source.keep_cr = run.split_sentences  # it writes "\r\n" lines back as such
        progress = not source.interactive and not sentences and sys.stderr.isatty()
        counted = refs is not None or progress or side_path is not None
        n_lines = source.count_lines() if counted else None
        if refs is not None and n_lines is not None:  # a file: fail before loading the model
            check_ref_count(run.ref, len(refs), n_lines)
        with open_aligned(side_path, side_flag, n_lines) as side:
            loaded = load()
            translator = translator_of(loaded, run.inter_threads)
            output = atomic_open(run.output) if run.output else nullcontext(sys.stdout.buffer)
            with output as out, autocast(loaded.device, loaded.precision):
                if run.score:
                    assert side is not None
                    done = score_input(translator, source, out, side, run.token_scores, run.tag)
                else:
                    split = split_language(run, loaded.sources) if run.split_sentences else None
                    job = StreamOptions(
                        translator.search_cfg.nbest, refs is not None, side, run.tab_prefix,
                        run.print_alignment, run.alignment_layer, run.tag, split, glossary,
                    )  # fmt: skip
                    done = translate_input(translator, source, out, job, n_lines, progress)
                if side is not None:
                    side.check_end(done.lines)
                if refs is not None:  # a pipe: its line count is known only now
                    check_ref_count(run.ref, len(refs), done.lines)
    if refs is not None:
        report_scores(done.hyps, refs, run.prog)
    if run.plot_attention:
        with autocast(loaded.device, loaded.precision):
            plot_first(translator, done.first, run.plot_attention, run.prog)


def check_run(run: TranslationRun, search: SearchConfig, typed: frozenset[str]) -> None:
    """Options that cannot go together, and output paths that cannot be written, before
    anything is read or loaded: no flag is taken and then left unused. `search`: the search
    flags; `typed`: the fields of those typed, not defaulted."""
    if run.sentences and run.input is not None:  # open_input reads one of them only
        raise UserError(
            "sentences on the command line and --input FILE both give the input: keep one"
        )
    if run.score is not None:
        for flag, given in (
            ("--sampling", search.sampling),
            ("--prefix", run.prefix is not None),
            ("--tab-prefix", run.tab_prefix),
            ("--ref", run.ref is not None),
            ("--print-alignment", run.print_alignment),
            ("--nbest", search.nbest > 1),
            ("--beam", "beam_size" in typed),  # no search: --beam and the output budget
            ("--max-len-a", "max_len_a" in typed),  # mean nothing to a given translation
            ("--max-len-b", "max_len_b" in typed),
            ("--inter-threads", run.inter_threads > 1),
            ("--plot-attention", run.plot_attention is not None),
        ):
            if given:
                raise UserError(f"--score scores given translations: drop {flag}")
    elif run.token_scores:
        raise UserError("--token-scores goes with --score FILE; add --score or drop it")
    if search.sampling and "beam_size" in typed:  # it draws instead of searching
        raise UserError("--sampling draws each token instead of a beam search: drop --beam")
    if run.prefix is not None and run.tab_prefix:
        raise UserError("--prefix FILE and --tab-prefix both give prefixes; keep one")
    if run.glossary is not None and (search.sampling or run.score is not None):
        flag = "--sampling" if search.sampling else "--score"
        raise UserError(f"--glossary constrains beam or greedy search: drop {flag} or --glossary")
    if run.alignment_layer is not None and not run.print_alignment:
        raise UserError("--alignment-layer goes with --print-alignment; add it or drop the layer")
    if run.split_sentences:  # each of these is per input line, not per sentence
        for flag, given in (
            ("--score", run.score is not None),
            ("--prefix", run.prefix is not None),
            ("--tab-prefix", run.tab_prefix),
            ("--print-alignment", run.print_alignment),
            ("--nbest", search.nbest > 1),
        ):
            if given:
                raise UserError(
                    f"--split-sentences translates each sentence of a line on its own, which "
                    f"{flag} (per line) does not fit; drop {flag} or --split-sentences"
                )
    check_writable(run.output, "--output")
    check_writable(run.plot_attention, "--plot-attention")


def check_writable(path: str | None, flag: str) -> None:
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{flag} {path} is a directory; pass a file name")
    if not target.parent.is_dir():
        raise UserError(f"{flag} directory {target.parent} does not exist; create it first")
    if not os.access(target.parent, os.W_OK | os.X_OK):  # the temp file goes there too
        raise UserError(f"{flag} directory {target.parent} is not writable; pick another path")


def translator_of(loaded: Loaded, inter_threads: int = 1) -> Translator:
    """The loaded model in a `Translator`, searching with the decoding it was loaded with."""
    from attnmt.decoding.translator import Translator

    return Translator(loaded.model, loaded.tokenizer, loaded.search, loaded.device, inter_threads)


def check_ref_count(path: str, n_refs: int, n_inputs: int) -> None:
    if n_refs != n_inputs:
        raise UserError(
            f"--ref {path} has {n_refs} lines but the input has {n_inputs}; "
            "pass the reference file that matches the input line by line"
        )


def translate_input(
    translator: Translator,
    source: Input,
    out: BinaryIO,
    job: StreamOptions,
    total: int | None = None,
    progress: bool = False,
) -> Translated:
    """Translate `source` a batch at a time, writing and flushing each batch's translations to
    `out` before reading the next; a progress bar (`total` lines) on stderr if `progress`."""
    from tqdm import tqdm

    hyps: list[str] = []
    first, done = None, 0
    with tqdm(
        total=total, unit="sent", desc="translating", file=sys.stderr, disable=not progress
    ) as bar:
        for batch in source.batches():
            if job.split is not None:
                lines, first_sentence = translate_split(translator, batch, job, out)
                bar.update(len(lines))
                done += len(lines)
                first = first or first_sentence
                if job.keep:
                    hyps.extend(lines)
                continue
            lines, prefixes = batch, None
            if job.tab_prefix:
                lines, prefixes = split_tab_prefix(batch)
            elif job.prefixes is not None:
                prefixes = job.prefixes.take(len(batch))
            tagged = [f"{job.tag} {x}" if job.tag and x.strip() else x for x in lines]
            results = translator.translate_nbest(
                tagged, bar.update, prefixes, glossary=job.glossary
            )
            alignments = None
            if job.align:
                shift = bool(job.tag) or bool(translator.tokenizer.source_prefix())
                alignments = align_all(translator, tagged, results, job.layer, shift)
            out.write(format_output(results, job.nbest, done, alignments).encode("utf-8"))
            out.flush()
            done += len(lines)
            if first is None:  # with --tag, its attention is over the tagged source
                first = next((line for line in tagged if line.strip()), None)
            if job.keep:
                hyps.extend(best[0].text for best in results)
    return Translated(done, hyps, first)


def translate_split(
    translator: Translator, batch: list[str], job: StreamOptions, out: BinaryIO
) -> tuple[list[str], str | None]:
    """--split-sentences: every sentence of `batch`'s lines translated in one batch, each line
    rejoined with its own spacing and written with its own line end ("\\r\\n" lines come in
    with their "\\r"); (the translated lines, the first sentence)."""
    from attnmt.data.sentences import split_lines

    assert job.split is not None
    ends = ["\r\n" if line.endswith("\r") else "\n" for line in batch]  # as each line came
    parts = split_lines([line.removesuffix("\r") for line in batch], job.split)
    tagged = [f"{job.tag} {s}" if job.tag else s for s in parts.sentences]
    results = translator.translate_nbest(tagged, glossary=job.glossary)
    lines = parts.rejoin([nbest[0].text for nbest in results])
    out.write("".join(line + end for line, end in zip(lines, ends, strict=True)).encode("utf-8"))
    out.flush()
    return lines, tagged[0] if tagged else None


def split_language(run: TranslationRun, sources: list[str]) -> str:
    """The ISO 639-1 code whose rules --split-sentences uses: --src-lang's, else the model's
    source language (`sources`, when it has one); English, with a warning, when neither is
    known."""
    from attnmt.data.sentences import splitting_language

    code = run.src_lang
    if code is None:
        code = sources[0] if len(sources) == 1 else None
    lang, warning = splitting_language(code)
    if warning:
        print(f"{run.prog}: warning: --split-sentences: {warning}", file=sys.stderr)
    return lang


def split_tab_prefix(lines: list[str]) -> tuple[list[str], list[str]]:
    """`SOURCE<TAB>PREFIX` lines -> sources, prefixes (no tab: no prefix)."""
    pairs = [line.split("\t", 1) if "\t" in line else [line, ""] for line in lines]
    return [src for src, _ in pairs], [prefix for _, prefix in pairs]


def align_all(
    translator: Translator,
    lines: list[str],
    results: list[list[TextHypothesis]],
    layer: int | None,
    tagged: bool = False,
) -> list[list[str]]:
    """The word alignment of every hypothesis, Pharaoh-formatted, per sentence. `tagged`:
    each non-empty line starts with a --tag word, which the alignment leaves out (source words
    count from the first word after it)."""
    from attnmt.decoding.alignment import format_alignment

    src_ids = translator.tokenizer.encode_src([line.strip() for line in lines])
    pairs = [(i, hyp.tokens) for i, hyps in enumerate(results) for hyp in hyps]
    try:
        found = iter(translator.align([src_ids[i] for i, _ in pairs], [t for _, t in pairs], layer))
    except ValueError as e:  # a layer the model does not have
        raise UserError(f"--alignment-layer: {e}; pick another layer") from None
    shift = 1 if tagged else 0
    return [
        [format_alignment([(i - shift, j) for i, j in next(found) if i >= shift]) for _ in hyps]
        for hyps in results
    ]


def score_input(
    translator: Translator,
    source: Input,
    out: BinaryIO,
    translations: AlignedLines,
    per_token: bool,
    tag: str | None = None,
) -> Translated:
    """Score `translations` of `source` a batch at a time (`--score`), writing as it goes;
    `tag` (--tag) starts each non-empty source, as when translating."""
    done = 0
    for lines in source.batches():
        tagged = [f"{tag} {x}" if tag and x.strip() else x for x in lines]
        scores = translator.score(tagged, translations.take(len(lines)))
        out.write(format_scores(scores, per_token).encode("utf-8"))
        out.flush()
        done += len(lines)
    return Translated(done, [], None)


def format_output(
    nbest: list[list[TextHypothesis]],
    n: int,
    start: int = 0,
    alignments: list[list[str]] | None = None,
) -> str:
    """Plain translations, or Moses-style n-best lines `i ||| translation ||| score` (`i`
    counts input lines from 0; the first of `nbest` is input line `start`); with
    `alignments` (per sentence, per hypothesis), ` ||| alignment` ends each line."""
    lines = []
    for i, hyps in enumerate(nbest):
        for k, h in enumerate(hyps[:1] if n == 1 else hyps):
            line = h.text if n == 1 else f"{start + i} ||| {h.text} ||| {h.score:.4f}"
            if alignments is not None:
                line += f" ||| {alignments[i][k]}"
            lines.append(line + "\n")
    return "".join(lines)


def format_scores(scores: list[TokenScores], per_token: bool) -> str:
    """`score<TAB>log_prob<TAB>length[<TAB>token log-probs]` per pair."""
    lines = []
    for s in scores:
        line = f"{s.score:.4f}\t{s.log_prob:.4f}\t{len(s.token_log_probs)}"
        if per_token:
            line += "\t" + " ".join(f"{p:.4f}" for p in s.token_log_probs)
        lines.append(line + "\n")
    return "".join(lines)


def report_scores(hyps: list[str], refs: list[str], prog: str) -> None:
    from attnmt.evaluation.bleu import corpus_bleu, corpus_chrf

    if not hyps:
        print(f"{prog}: warning: no input lines, nothing to score", file=sys.stderr)
        return
    print(f"BLEU = {corpus_bleu(hyps, refs)}", file=sys.stderr)
    print(f"chrF = {corpus_chrf(hyps, refs)}", file=sys.stderr)


def plot_first(translator: Translator, first: str | None, path: str, prog: str) -> None:
    from attnmt.decoding.plot import plot_attention

    if first is None:
        print(f"{prog}: warning: every input line is empty; no attention plot", file=sys.stderr)
        return
    attn = translator.attention_for(first)
    title = "cross-attention (last layer, mean over heads)"
    plot_attention(attn.src_pieces, attn.tgt_pieces, attn.cross_attn, path, title=title)
