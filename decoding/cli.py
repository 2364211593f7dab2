"""The `translate.py` command line: its flags and what a run does.

The search flags (`--beam`, `--length-penalty`, `--lp-type`, `--max-len-a`, `--max-len-b`,
`--nbest`, `--batch-size`) are generated from the fields of `SearchConfig`, so their defaults,
limits and help are the dataclass's. Flags, paths and `--ref` are checked before torch is
imported (the input's text is checked as it is read, since it is streamed); every user mistake
raises `UserError` (or exits 2 for a bad flag), one line, no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import Field, fields
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    BinaryIO,
    Literal,
    NamedTuple,
    get_args,
    get_origin,
    get_type_hints,
)

from common.errors import UserError
from common.files import atomic_open, read_lines
from decoding.config import SearchConfig
from decoding.inputs import Input, open_input

if TYPE_CHECKING:  # heavy imports (torch) wait until the flags and inputs are checked
    from decoding.translator import TextHypothesis, Translator

PROG = "translate.py"
PRECISIONS = ("fp32", "bf16", "fp16")
QUANTIZE = ("none", "int8")

# What the command line adds to a field's help (the output format is the CLI's business).
_CLI_HELP = {
    "nbest": "; above 1 prints 'INDEX ||| TRANSLATION ||| SCORE' lines (INDEX 0-based, best "
    "first; an empty input gets one empty hypothesis), so line counts differ from the input",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number(kind: type, minimum: float | None) -> Callable[[str], int | float]:
    """An argparse type: an int or float, at least `minimum` when given."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    return parse


def _flag(f: Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_search_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per `SearchConfig` field (dest = the field name), with its default and help."""
    types = get_type_hints(SearchConfig)
    flags = {f.name: _flag(f) for f in fields(SearchConfig)}
    for f in fields(SearchConfig):
        text = f.metadata["help"] + _CLI_HELP.get(f.name, "")
        for name, flag in flags.items():  # help names other options by field name
            text = text.replace(name, flag)
        kind = types[f.name]
        if get_origin(kind) is Literal:
            spec = {"choices": get_args(kind)}
        else:
            metavar = flags[f.name].lstrip("-").replace("-", "_").upper()
            spec = {"type": _number(kind, f.metadata["min"]), "metavar": metavar}
        parser.add_argument(
            flags[f.name],
            dest=f.name,
            default=f.default,
            help=f"{text} (default: {f.default})",
            **spec,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Translate sentences with a trained encoder-decoder Transformer.",
        epilog="Input: positional sentences, else --input FILE, else standard input; one "
        "sentence per line. Output: one translation per input line, in input order, on stdout "
        "(or --output), written as the translation goes. A progress bar (sentences/s) goes to "
        "stderr when it is a terminal and the input is a file.",
    )
    add = parser.add_argument
    add("sentences", nargs="*", help="sentences to translate (default: --input or stdin)")
    add(
        "-c",
        "--checkpoint",
        required=True,
        action="append",
        help="run dir (uses checkpoints/best.pt, else last.pt) or .pt file; repeat it to "
        "translate with an ensemble (at each step the models' log-probabilities are averaged, "
        "then renormalised; the checkpoints must share one tokenizer, their sizes may differ)",
    )
    add_search_flags(parser)
    add(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto = cuda when available, else cpu (default: auto)",
    )
    add(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="autocast dtype during search: bf16 runs on CPU and recent GPUs, fp16 on GPUs "
        "(and CPUs where torch supports it) (default: fp32)",
    )
    add(
        "--quantize",
        choices=QUANTIZE,
        default="none",
        help="int8: dynamic int8 quantization of every linear layer (torch.ao), CPU only "
        "(default: none)",
    )
    add(
        "--inter-threads",
        type=_number(int, 1),
        default=1,
        metavar="N",
        help="search N batches at once, one thread each, torch's CPU threads divided among them "
        "(CTranslate2's inter_threads); same output, more sentences/s where one batch cannot "
        "keep every core busy (default: 1)",
    )
    add("--input", metavar="FILE", help="read sentences from FILE (UTF-8, one per line)")
    add(
        "--buffer-size",
        type=_number(int, 1),
        default=10000,
        metavar="N",
        help="a file (--input, or stdin redirected from one) is read and translated N lines at "
        "a time, length-sorted within them, so memory stays bounded; from a pipe or terminal, "
        "each line is translated as soon as it arrives, about N at most at once when lines "
        "arrive faster (default: 10000)",
    )
    add(
        "--output", metavar="FILE", help="write translations to FILE (atomically) instead of stdout"
    )
    add(
        "--ref",
        metavar="FILE",
        help="reference translations: print sacreBLEU BLEU and chrF to stderr",
    )
    add(
        "--tag",
        metavar="TAG",
        help="put TAG (one of the model's tags, e.g. <2de> for a multilingual model's target "
        "language; train.py's data.corpora.*.tag) before every non-empty input line",
    )
    add(
        "--plot-attention",
        metavar="PNG",
        help="save the cross-attention heatmap (last layer, mean over heads) of the "
        "first non-empty input sentence; with several -c, the first checkpoint's attention "
        "over the ensemble's translation",
    )
    return parser


def search_config(args: argparse.Namespace) -> SearchConfig:
    """The `SearchConfig` the search flags describe."""
    if args.nbest > args.beam_size:
        raise UserError(f"--nbest {args.nbest} needs --beam >= {args.nbest}; raise --beam")
    return SearchConfig(**{f.name: getattr(args, f.name) for f in fields(SearchConfig)})


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


def check_quantize(quantize: str, device: str, precision: str) -> None:
    if quantize == "none":
        return
    if device != "cpu":
        raise UserError(f"--quantize {quantize} runs on the CPU only; add --device cpu")
    if precision != "fp32":
        raise UserError(
            f"--quantize {quantize} computes in int8/fp32; drop --precision {precision}"
        )


def format_output(nbest: list[list[TextHypothesis]], n: int, start: int = 0) -> str:
    """Plain translations, or Moses-style n-best lines `i ||| translation ||| score` (`i`
    counts input lines from 0; the first of `nbest` is input line `start`)."""
    if n == 1:
        return "".join(f"{hyps[0].text}\n" for hyps in nbest)
    return "".join(
        f"{start + i} ||| {h.text} ||| {h.score:.4f}\n"
        for i, hyps in enumerate(nbest)
        for h in hyps
    )


def check_ref_count(path: str, n_refs: int, n_inputs: int) -> None:
    if n_refs != n_inputs:
        raise UserError(
            f"--ref {path} has {n_refs} lines but the input has {n_inputs}; "
            "pass the reference file that matches the input line by line"
        )


def run(args: argparse.Namespace) -> None:
    """Translate what `args` (from `build_parser`) asks for; raises `UserError` on a mistake.

    The input is read and translated a batch at a time (`decoding.inputs`) and each batch's
    translations are written (and flushed) before the next batch is read. `--output` is
    written to a temp file renamed into place at the end, so an error or Ctrl-C leaves any
    previous file intact.
    """
    cfg = search_config(args)
    check_writable(args.output, "--output")
    check_writable(args.plot_attention, "--plot-attention")
    sentences = [" ".join(s.splitlines()) for s in args.sentences]
    refs = None if args.ref is None else read_lines(args.ref, "--ref")
    with open_input(sentences, args.input, args.buffer_size) as source:
        progress = not source.interactive and not sentences and sys.stderr.isatty()
        n_lines = source.count_lines() if refs is not None or progress else None
        if refs is not None and n_lines is not None:  # a file: fail before loading the model
            check_ref_count(args.ref, len(refs), n_lines)
        from common import runtime

        device = runtime.resolve_device(args.device, "--device", strict_auto=False).type
        check_quantize(args.quantize, device, args.precision)
        runtime.check_autocast(device, args.precision, "--precision")
        precision = runtime.autocast(device, args.precision)

        from common.memory import keep_freed_memory
        from decoding.translator import Translator
        from engine import load_engine

        if device == "cpu":  # the device type: "cpu" or "cuda"
            keep_freed_memory()  # search steps reuse freed blocks instead of page-faulting
        model, tokenizer = load_engine(args.checkpoint, device, args.quantize)
        if args.tag is not None and args.tag not in tokenizer.tags:
            known = ", ".join(tokenizer.tags) or "none"
            raise UserError(f"--tag {args.tag} is not one of this model's tags ({known})")
        translator = Translator(model, tokenizer, cfg, device, args.inter_threads)
        output = atomic_open(args.output) if args.output else nullcontext(sys.stdout.buffer)
        with output as out, precision:
            keep = refs is not None
            done = translate_input(
                translator, source, out, cfg.nbest, keep, n_lines, progress, args.tag
            )
            if refs is not None:  # a pipe: its line count is known only now
                check_ref_count(args.ref, len(refs), done.lines)
    if refs is not None:
        report_scores(done.hyps, refs)
    if args.plot_attention:
        with precision:
            plot_first(translator, done.first, args.plot_attention)


class Translated(NamedTuple):
    lines: int  # input lines translated
    hyps: list[str]  # their best translations, when asked to keep them (for --ref)
    first: str | None  # the first non-empty input line (for --plot-attention)


def translate_input(
    translator: Translator,
    source: Input,
    out: BinaryIO,
    nbest: int,
    keep: bool = False,
    total: int | None = None,
    progress: bool = False,
    tag: str | None = None,
) -> Translated:
    """Translate `source` a batch at a time, writing and flushing each batch's translations to
    `out` before reading the next; a progress bar (`total` lines) on stderr if `progress`;
    `tag` and a space before each non-empty line."""
    from tqdm import tqdm

    hyps: list[str] = []
    first, done = None, 0
    with tqdm(
        total=total, unit="sent", desc="translating", file=sys.stderr, disable=not progress
    ) as bar:
        for lines in source.batches():
            tagged = [f"{tag} {x}" if tag and x.strip() else x for x in lines]
            results = translator.translate_nbest(tagged, progress=bar.update)
            out.write(format_output(results, nbest, start=done).encode("utf-8"))
            out.flush()
            done += len(lines)
            if first is None:
                first = next((line for line in lines if line.strip()), None)
            if keep:
                hyps.extend(best[0].text for best in results)
    return Translated(done, hyps, first)


def report_scores(hyps: list[str], refs: list[str]) -> None:
    from evaluation.bleu import corpus_bleu, corpus_chrf

    if not hyps:
        print(f"{PROG}: warning: no input lines, nothing to score", file=sys.stderr)
        return
    print(f"BLEU = {corpus_bleu(hyps, refs)}", file=sys.stderr)
    print(f"chrF = {corpus_chrf(hyps, refs)}", file=sys.stderr)


def plot_first(translator: Translator, first: str | None, path: str) -> None:
    from decoding.plot import plot_attention

    if first is None:
        print(f"{PROG}: warning: every input line is empty; no attention plot", file=sys.stderr)
        return
    attn = translator.attention_for(first)
    title = "cross-attention (last layer, mean over heads)"
    plot_attention(attn.src_pieces, attn.tgt_pieces, attn.cross_attn, path, title=title)
