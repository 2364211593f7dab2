"""The `translate.py` command line: its flags and what a run does.

The search flags (`--beam`, `--length-penalty`, `--lp-type`, `--max-len-a`, `--max-len-b`,
`--nbest`, `--batch-size`, `--sampling`, `--topk`, `--topp`, `--temperature`, `--seed`) are
generated from the fields of `SearchConfig`, so their defaults, limits and help are the
dataclass's. Beside translating, a run can score given translations (`--score`), force a
target prefix (`--prefix`, `--tab-prefix`) and print word alignments (`--print-alignment`).
Flags, paths, their combinations, and the line counts of `--ref`, `--prefix` and `--score`
files are checked before torch is imported (the input's text is checked as it is read, since
it is streamed); every user mistake raises `UserError` (or exits 2 for a bad flag), one line,
no traceback.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from dataclasses import Field, fields
from typing import TYPE_CHECKING, Literal, get_args, get_origin, get_type_hints

from attnmt.cli.args import Parser, number, program_name
from attnmt.common.errors import UserError, exit_status
from attnmt.decoding.config import PRECISIONS, SearchConfig
from attnmt.decoding.stream import TranslationRun, check_run, translate_run

if TYPE_CHECKING:  # torch waits until the flags and inputs are checked
    from attnmt.engine.runs import LoadedRun, RuntimeOptions

PROG = program_name("translate.py")
QUANTIZE = ("none", "int8")

# What the command line adds to a field's help (the output format is the CLI's business).
_CLI_HELP = {
    "nbest": "; above 1 prints 'INDEX ||| TRANSLATION ||| SCORE' lines (INDEX 0-based, best "
    "first; an empty input gets one empty hypothesis), so line counts differ from the input",
    "sampling": "; beam_size is not used",
}
_SAMPLING_ONLY = ("topk", "topp", "temperature", "seed")  # flags that mean nothing without it


def _flag(f: Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


class _Given(argparse.Action):
    """Stores a flag's value (`const` for a flag that takes none) and adds its dest to
    `namespace.given`: the search flags and --precision a user typed win over the run's
    recorded decoding, the others come from it (`run_decoding`)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}


def add_search_flags(parser: argparse.ArgumentParser, nbest_help: str | None = None) -> None:
    """One flag per `SearchConfig` field (dest = the field name), with its default and help.
    A flag left out takes the run's recorded value (`run_decoding`), else this default.
    `nbest_help`: what --nbest's help adds, for a command that does other than print them."""
    types = get_type_hints(SearchConfig)
    flags = {f.name: _flag(f) for f in fields(SearchConfig)}
    added = {**_CLI_HELP, **({"nbest": nbest_help} if nbest_help is not None else {})}
    for f in fields(SearchConfig):
        text = f.metadata["help"] + added.get(f.name, "")
        for name, flag in flags.items():  # help names other options by field name
            if name != f.name or "_" in name:  # "random seed" in --seed's help, not "--seed"
                text = re.sub(rf"(?<![\w-]){name}(?![\w-])", flag, text)
        kind = types[f.name]
        if kind is bool:
            parser.add_argument(
                flags[f.name], dest=f.name, action=_Given, nargs=0, const=True, default=False,
                help=text,
            )  # fmt: skip
            continue
        if get_origin(kind) is Literal:
            spec = {"choices": get_args(kind)}
        else:
            metavar = flags[f.name].lstrip("-").replace("-", "_").upper()
            spec = {"type": number(kind, f.metadata["min"]), "metavar": metavar}
        parser.add_argument(
            flags[f.name],
            dest=f.name,
            action=_Given,
            default=f.default,
            help=f"{text} (default: the run's, else {f.default})",
            **spec,
        )


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """`--device`, `--precision`, `--quantize`, `--pack`: where and how the model runs (translate.py and
    serve.py; `load_model` reads them)."""
    add = parser.add_argument
    add(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto = cuda when available, else cpu (default: auto)",
    )
    add(
        "--precision",
        choices=PRECISIONS,
        action=_Given,
        default="fp32",
        help="autocast dtype during search: bf16 runs on CPU and recent GPUs, fp16 on GPUs "
        "(and CPUs where torch supports it) (default: the run's on the device type it was "
        "tested on and without --quantize, else fp32)",
    )
    add(
        "--quantize",
        choices=QUANTIZE,
        default="none",
        help="int8: dynamic int8 quantization of every linear layer (torch.ao), CPU only "
        "(default: none)",
    )
    add(
        "--pack",
        default="auto",
        metavar="GROUPS",
        help="CPU linear layers on oneDNN's pre-packed weights: auto (the groups that ran "
        "faster packed when timed on this CPU for this model's shapes, remembered in the user "
        "cache), off, all, or a comma list of generator, decoder, encoder, bf16 (default: auto)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    add_runtime_flags(parser)
    add(
        "--inter-threads",
        type=number(int, 1),
        default=1,
        metavar="N",
        help="search N batches at once, one thread each, torch's CPU threads divided among them "
        "(CTranslate2's inter_threads); same output, more sentences/s where one batch cannot "
        "keep every core busy (default: 1)",
    )
    add_file_flags(parser)
    add_prefix_flags(parser)
    add_output_flags(parser)
    add_language_flags(parser)
    add(
        "--plot-attention",
        metavar="PNG",
        help="save the cross-attention heatmap (last layer, mean over heads) of the "
        "first non-empty input sentence; with several -c, the first checkpoint's attention "
        "over the ensemble's translation",
    )
    return parser


def add_file_flags(parser: argparse.ArgumentParser) -> None:
    """Where sentences come from and translations go: --input, --buffer-size, --output, --ref."""
    add = parser.add_argument
    add("--input", metavar="FILE", help="read sentences from FILE (UTF-8, one per line)")
    add(
        "--split-sentences",
        action="store_true",
        help="each input line may hold several sentences: split them (sentencex, by the "
        "model's source language, or --src-lang), translate them, and rejoin each line's "
        "translations with its own spacing; still one output line per input line",
    )
    add(
        "--buffer-size",
        type=number(int, 1),
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


def add_prefix_flags(parser: argparse.ArgumentParser) -> None:
    """What is put before each input line or forced on its translation: --tag, --prefix,
    --tab-prefix."""
    add = parser.add_argument
    add(
        "--tag",
        metavar="TAG",
        help="put TAG (one of the model's tags, e.g. <2de> for a multilingual model's target "
        "language; train.py's data.corpora.*.tag) before every non-empty input line",
    )
    add(
        "--prefix",
        metavar="FILE",
        help="a target prefix per input line (UTF-8, line-aligned with the input; an empty "
        "line: no prefix): its subwords are forced, then the search (or sampling) goes on; "
        "the output includes the prefix",
    )
    add(
        "--tab-prefix",
        action="store_true",
        help="each input line is 'SOURCE<TAB>PREFIX' (a line without a tab has no prefix): "
        "--prefix for standard input and interactive use",
    )
    add(
        "--glossary",
        metavar="FILE",
        help="terminology: a TSV of 'source term<TAB>target term' lines; where a source term "
        "occurs in an input line (whole words, any case), the translation uses its target "
        "term as written (a term mapped to itself is kept untranslated); beam or greedy "
        "search with lexical constraints (see docs/translating.md)",
    )


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """What is printed instead of or beside the translations: --score, --token-scores,
    --print-alignment, --alignment-layer."""
    add = parser.add_argument
    add(
        "--score",
        metavar="FILE",
        help="no translation: score FILE's translations of the input (line-aligned), one "
        "line each: 'SCORE<TAB>LOG_PROB<TAB>LENGTH', LOG_PROB the sum of the log-probabilities "
        "of its subwords and EOS, LENGTH their count, SCORE = LOG_PROB / the length penalty "
        "of --length-penalty/--lp-type (what --nbest prints for the same translation)",
    )
    add(
        "--token-scores",
        action="store_true",
        help="with --score: a fourth column, each subword's log-probability then EOS's, "
        "space-separated",
    )
    add(
        "--print-alignment",
        action="store_true",
        help="append ' ||| ALIGNMENT' to each translation: word-level 'i-j' pairs (source word "
        "i, target word j, 0-based, whitespace words) from cross-attention, each target word "
        "to the source word it attends to most",
    )
    add(
        "--alignment-layer",
        type=int,
        metavar="N",
        help="decoder layer whose cross-attention (mean over heads) --print-alignment uses, "
        "0-based, negative from the top (default: the penultimate; see docs/translating.md)",
    )


def add_language_flags(parser: argparse.ArgumentParser) -> None:
    """The language pair: --src-lang, --tgt-lang (`language_pair`)."""
    add = parser.add_argument
    add(
        "--src-lang",
        metavar="CODE",
        help="source language: ISO 639-1 (en), ISO 639-3 (eng), BCP-47 (en-US) or the model's "
        "own code (NLLB: eng_Latn); one of the model's languages (a bilingual model's is "
        "checked, a multilingual imported model's is chosen; see docs/translating.md)",
    )
    add(
        "--tgt-lang",
        metavar="CODE",
        help="target language, in any of those forms (de, deu, de-DE; NLLB: deu_Latn; OPUS-MT: "
        "deu for >>deu<<); a multilingual imported model's language token is forced and not "
        "printed",
    )


def search_from_flags(args: argparse.Namespace) -> SearchConfig:
    """The `SearchConfig` the search flags describe (a flag left out: the field's default)."""
    if args.nbest > args.beam_size and not args.sampling:
        raise UserError(f"--nbest {args.nbest} needs --beam >= {args.nbest}; raise --beam")
    if not args.sampling:
        defaults = {f.name: f.default for f in fields(SearchConfig)}
        for name in _SAMPLING_ONLY:
            if getattr(args, name) != defaults[name]:
                flag = "--" + name
                raise UserError(f"{flag} applies to sampling only; add --sampling or drop {flag}")
    try:
        return SearchConfig(**{f.name: getattr(args, f.name) for f in fields(SearchConfig)})
    except ValueError as e:  # a bound no flag type checks (topp <= 1)
        raise UserError(f"{e}; see --help") from None


def check_sampling_flags(args: argparse.Namespace) -> None:
    """--sampling draws instead of searching: a --beam typed beside it would be unused."""
    if args.sampling and "beam_size" in getattr(args, "given", frozenset()):
        raise UserError("--sampling draws each token instead of a beam search: drop --beam")


def runtime_options(args: argparse.Namespace, prog: str) -> RuntimeOptions:
    """`add_runtime_flags`' flags, and the search flags and --precision typed (`_Given`)."""
    from attnmt.engine.runs import RuntimeOptions

    given = getattr(args, "given", frozenset())
    return RuntimeOptions(args.device, args.precision, args.quantize, given, prog, args.pack)


def run(args: argparse.Namespace) -> None:
    """Translate (or score) what `args` (from `build_parser`) asks for
    (`decoding.stream.translate_run`); raises `UserError` on a mistake."""
    flags = search_from_flags(args)
    names = {f.name for f in fields(TranslationRun)} - {"sentences", "prog"}
    options = {name: getattr(args, name) for name in names}
    job = TranslationRun(sentences=tuple(args.sentences), prog=PROG, **options)
    check_run(job, flags, getattr(args, "given", frozenset()))

    def load() -> LoadedRun:
        from attnmt.engine.runs import load_run

        pair = (args.src_lang, args.tgt_lang)
        return load_run(runtime_options(args, PROG), args.checkpoint, flags, pair, args.tag)

    translate_run(job, load)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    return exit_status(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
