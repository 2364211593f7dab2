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
import os
import re
import sys
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

from attnmt.cli.args import Parser, number, program_name
from attnmt.common.errors import UserError, exit_status
from attnmt.common.files import atomic_open, read_lines
from attnmt.decoding.config import PRECISIONS, RunDecoding, SearchConfig
from attnmt.decoding.glossary import Glossary
from attnmt.decoding.inputs import AlignedLines, Input, open_aligned, open_input

if TYPE_CHECKING:  # heavy imports (torch) wait until the flags and inputs are checked
    from attnmt.decoding.scoring import TokenScores
    from attnmt.decoding.translator import TextHypothesis, Translator

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
    """`--device`, `--precision`, `--quantize`: where and how the model runs (translate.py and
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


def search_config(args: argparse.Namespace) -> SearchConfig:
    """The `SearchConfig` the search flags describe."""
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


def check_combinations(args: argparse.Namespace) -> None:
    """Flags that cannot go together, before anything is read or loaded: none is taken and
    then left unused."""
    typed = getattr(args, "given", frozenset())  # the search flags typed, not defaulted
    if args.sentences and args.input is not None:  # open_input reads one of them only
        raise UserError(
            "sentences on the command line and --input FILE both give the input: keep one"
        )
    if args.score is not None:
        for flag, given in (
            ("--sampling", args.sampling),
            ("--prefix", args.prefix is not None),
            ("--tab-prefix", args.tab_prefix),
            ("--ref", args.ref is not None),
            ("--print-alignment", args.print_alignment),
            ("--nbest", args.nbest > 1),
            ("--beam", "beam_size" in typed),  # no search: --beam and the output budget
            ("--max-len-a", "max_len_a" in typed),  # mean nothing to a given translation
            ("--max-len-b", "max_len_b" in typed),
            ("--inter-threads", args.inter_threads > 1),
            ("--plot-attention", args.plot_attention is not None),
        ):
            if given:
                raise UserError(f"--score scores given translations: drop {flag}")
    elif args.token_scores:
        raise UserError("--token-scores goes with --score FILE; add --score or drop it")
    check_sampling_flags(args)
    if args.prefix is not None and args.tab_prefix:
        raise UserError("--prefix FILE and --tab-prefix both give prefixes; keep one")
    if args.glossary is not None and (args.sampling or args.score is not None):
        flag = "--sampling" if args.sampling else "--score"
        raise UserError(f"--glossary constrains beam or greedy search: drop {flag} or --glossary")
    if args.alignment_layer is not None and not args.print_alignment:
        raise UserError("--alignment-layer goes with --print-alignment; add it or drop the layer")
    if args.split_sentences:  # each of these is per input line, not per sentence
        for flag, given in (
            ("--score", args.score is not None),
            ("--prefix", args.prefix is not None),
            ("--tab-prefix", args.tab_prefix),
            ("--print-alignment", args.print_alignment),
            ("--nbest", args.nbest > 1),
        ):
            if given:
                raise UserError(
                    f"--split-sentences translates each sentence of a line on its own, which "
                    f"{flag} (per line) does not fit; drop {flag} or --split-sentences"
                )


def check_sampling_flags(args: argparse.Namespace) -> None:
    """--sampling draws instead of searching: a --beam typed beside it would be unused."""
    if args.sampling and "beam_size" in getattr(args, "given", frozenset()):
        raise UserError("--sampling draws each token instead of a beam search: drop --beam")


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


def check_ref_count(path: str, n_refs: int, n_inputs: int) -> None:
    if n_refs != n_inputs:
        raise UserError(
            f"--ref {path} has {n_refs} lines but the input has {n_inputs}; "
            "pass the reference file that matches the input line by line"
        )


def run(args: argparse.Namespace) -> None:
    """Translate (or score) what `args` (from `build_parser`) asks for; raises `UserError` on a
    mistake.

    The input is read and translated a batch at a time (`decoding.inputs`) and each batch's
    translations are written (and flushed) before the next batch is read; a `--prefix` or
    `--score` file is read in step with it. `--output` is written to a temp file renamed into
    place at the end, so an error or Ctrl-C leaves any previous file intact.
    """
    cfg = search_config(args)
    check_combinations(args)
    check_writable(args.output, "--output")
    check_writable(args.plot_attention, "--plot-attention")
    sentences = [" ".join(s.splitlines()) for s in args.sentences]
    refs = None if args.ref is None else read_lines(args.ref, "--ref")
    side_flag, side_path = ("--score", args.score) if args.score else ("--prefix", args.prefix)
    glossary = None if args.glossary is None else Glossary.from_file(args.glossary)
    with open_input(sentences, args.input, args.buffer_size) as source:
        source.keep_cr = bool(args.split_sentences)  # it writes "\r\n" lines back as such
        progress = not source.interactive and not sentences and sys.stderr.isatty()
        counted = refs is not None or progress or side_path is not None
        n_lines = source.count_lines() if counted else None
        if refs is not None and n_lines is not None:  # a file: fail before loading the model
            check_ref_count(args.ref, len(refs), n_lines)
        with open_aligned(side_path, side_flag, n_lines) as side:
            translator = load_translator(args, cfg)
            output = atomic_open(args.output) if args.output else nullcontext(sys.stdout.buffer)
            with output as out, runtime_precision(args, translator):
                if args.score:
                    assert side is not None
                    done = score_input(translator, source, out, side, args.token_scores, args.tag)
                else:
                    job = Job(
                        nbest=translator.search_cfg.nbest,
                        keep=refs is not None,
                        prefixes=side,
                        tab_prefix=args.tab_prefix,
                        align=args.print_alignment,
                        layer=args.alignment_layer,
                        tag=args.tag,
                        split=split_language(args) if args.split_sentences else None,
                        glossary=glossary,
                    )
                    done = translate_input(translator, source, out, job, n_lines, progress)
                if side is not None:
                    side.check_end(done.lines)
                if refs is not None:  # a pipe: its line count is known only now
                    check_ref_count(args.ref, len(refs), done.lines)
    if refs is not None:
        report_scores(done.hyps, refs)
    if args.plot_attention:
        with runtime_precision(args, translator):
            plot_first(translator, done.first, args.plot_attention)


def load_translator(args: argparse.Namespace, cfg: SearchConfig) -> Translator:
    """The checkpoint(s) on the device the flags ask for, in a `Translator`."""
    from attnmt.decoding.translator import Translator

    model, tokenizer, device = load_model(args, args.checkpoint)
    tokenizer = tokenizer.for_languages(*language_pair(args, tokenizer.languages))
    if args.tag is not None and args.tag not in tokenizer.tags:
        known = ", ".join(tokenizer.tags) or "none"
        raise UserError(f"--tag {args.tag} is not one of this model's tags ({known}); drop it")
    # The first checkpoint's run decides, as fairseq takes the first model's settings.
    cfg, args.precision, recorded = run_decoding(args, cfg, args.checkpoint[0], device)
    if recorded:
        print(f"{PROG}: decoding: {describe_decoding(cfg, args.precision)}", file=sys.stderr)
    return Translator(model, tokenizer, cfg, device, args.inter_threads)


def language_pair(args: argparse.Namespace, tokens: list[str]) -> tuple[str | None, str | None]:
    """--src-lang/--tgt-lang for `Tokenizer.for_languages`: each checked against the (first)
    checkpoint's languages by the server's rule (`data.languages.match_pair`: any form of the
    model's own codes), in the model's own codes; for a model without language tokens
    (`tokens`: none), dropped once checked, since its one pair needs no telling. A model that
    names no languages gets them as given (the tokenizer refuses them)."""
    if args.src_lang is None and args.tgt_lang is None:
        return None, None
    sources, targets = checkpoint_languages(args.checkpoint[0])
    pair = check_language_flags(args, sources, targets)
    if not tokens and (sources or targets):
        return None, None
    return pair


def check_language_flags(
    args: argparse.Namespace, sources: list[str], targets: list[str]
) -> tuple[str | None, str | None]:
    """--src-lang/--tgt-lang in the model's own codes (`data.languages.match_pair`); a code
    that is none of the model's languages is a `UserError` naming the flag and the pair."""
    from attnmt.data.languages import LanguageError, match_pair

    try:
        return match_pair(args.src_lang, args.tgt_lang, sources, targets)
    except LanguageError as e:
        flag = "--src-lang" if e.side == "source" else "--tgt-lang"
        raise UserError(
            f"{flag}: {e}; give one of its languages (any form) or drop {flag}"
        ) from None


def checkpoint_languages(checkpoint: str) -> tuple[list[str], list[str]]:
    """(source codes, target codes) a checkpoint (file or run dir) names, in its own codes
    (`data.languages.model_languages`)."""
    import torch

    from attnmt.checkpoint import resolve_checkpoint
    from attnmt.data.languages import model_languages

    # load_engine checked the file; mmap reads only the entries looked at
    path = resolve_checkpoint(checkpoint)
    return model_languages(torch.load(path, mmap=True, weights_only=True))


def run_decoding(
    args: argparse.Namespace, flags: SearchConfig, checkpoint: str, device: str, prog: str = PROG
) -> tuple[SearchConfig, str, bool]:
    """(search, precision, whether the run's record was used) to decode `checkpoint` with on
    `device` (a type): each search flag (`flags`: `search_config(args)`) and --precision given
    on the command line, else the decoding its training run tested with (the checkpoint's
    "decoding", as in its results.json: `RunDecoding`), else the flag's default. The run's
    precision applies on the device type it was tested on and without --quantize (int8
    computes in int8/fp32); a checkpoint without a record (older, imported) decodes with the
    flags' defaults. Warnings on stderr start with `prog`."""
    from attnmt.common import runtime

    given = getattr(args, "given", frozenset())
    recorded = stored_decoding(checkpoint)
    if recorded is None:
        warn_emulated_bf16(device, args.precision, prog)
        return flags, args.precision, False
    values = {
        f.name: getattr(flags if f.name in given else recorded.search, f.name)
        for f in fields(SearchConfig)
    }
    try:
        cfg = SearchConfig(**values)
    except ValueError as e:  # e.g. --nbest above the run's beam
        raise UserError(f"{e} (the run's decoding, flags applied); see --help") from None
    precision = args.precision
    if "precision" not in given and args.quantize == "none" and recorded.device == device:
        precision = recorded.precision
        dtype = runtime.DTYPES.get(precision)
        if dtype is not None and not runtime.autocast_supported(device, dtype):
            print(
                f"{prog}: warning: the run decoded in {precision}, which torch cannot autocast "
                f"on this {device}: decoding in fp32, so scores may differ from results.json",
                file=sys.stderr,
            )
            precision = "fp32"
    warn_emulated_bf16(device, precision, prog)
    return cfg, precision, True


def warn_emulated_bf16(device: str, precision: str, prog: str = PROG) -> None:
    """One line on stderr where bf16 would run emulated: a CPU whose oneDNN has no bf16 (no
    AVX-512, or capped below it), where bf16 decoded 6-9x slower than on a CPU with it
    (docs/benchmarks.md, "bf16 on packed weights")."""
    from attnmt.engine.engine import bf16_packing_runs

    if device == "cpu" and precision == "bf16" and not bf16_packing_runs():
        print(
            f"{prog}: warning: bf16 runs emulated on this CPU (oneDNN has no bf16 here: no "
            "AVX-512), several times slower than fp32; pass --precision fp32 for speed (the "
            "scores may then differ from results.json's by rounding)",
            file=sys.stderr,
        )


def stored_decoding(checkpoint: str) -> RunDecoding | None:
    """The `RunDecoding` a checkpoint (file or run dir) records, or None."""
    import torch

    from attnmt.checkpoint import resolve_checkpoint

    # load_engine checked the file; mmap reads only the entries looked at
    ckpt = torch.load(resolve_checkpoint(checkpoint), mmap=True, weights_only=True)
    try:
        return RunDecoding.from_stored(ckpt.get("decoding"))
    except (TypeError, ValueError) as e:
        raise UserError(
            f"the decoding recorded in {checkpoint} is unusable ({e}); use the attnmt version "
            "that wrote it"
        ) from None


def describe_decoding(cfg: SearchConfig, precision: str) -> str:
    """One line of what a search does, for stderr."""
    if cfg.sampling:
        how = (
            f"sampling {cfg.nbest} per sentence (topk {cfg.topk}, topp {cfg.topp:g}, "
            f"temperature {cfg.temperature:g}, seed {cfg.seed})"
        )
    else:
        how = "greedy" if cfg.beam_size == 1 else f"beam {cfg.beam_size}"
        how += f", length penalty {cfg.length_penalty:g} ({cfg.lp_type})"
    return (
        f"{how}, at most {cfg.max_len_a:g} x source + {cfg.max_len_b} tokens, "
        f"{cfg.batch_size} sentences a batch, {precision} (the run's decoding, as its "
        "results.json records it, where no flag says otherwise)"
    )


def load_model(args: argparse.Namespace, checkpoints: list[str]) -> tuple:
    """(model or ensemble, tokenizer, device type) for `add_runtime_flags`' flags: the device
    resolved, the flags checked against it, CPU malloc tuned, the engine loaded."""
    from attnmt.common import runtime

    device = runtime.resolve_device(args.device, "--device", strict_auto=False).type
    check_quantize(args.quantize, device, args.precision)
    runtime.check_autocast(device, args.precision, "--precision")

    from attnmt.common.memory import keep_freed_memory
    from attnmt.engine import load_engine

    if device == "cpu":  # the device type: "cpu" or "cuda"
        keep_freed_memory()  # search steps reuse freed blocks instead of page-faulting
    model, tokenizer = load_engine(checkpoints, device, args.quantize)
    return model, tokenizer, device


def runtime_precision(args: argparse.Namespace, translator: Translator):  # noqa: ANN201
    """The autocast context of `--precision` on the translator's device."""
    from attnmt.common import runtime

    return runtime.autocast(translator.device.type, args.precision)


class Translated(NamedTuple):
    lines: int  # input lines translated
    hyps: list[str]  # their best translations, when asked to keep them (for --ref)
    first: str | None  # the first non-empty input line (for --plot-attention)


class Job(NamedTuple):
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


def translate_input(
    translator: Translator,
    source: Input,
    out: BinaryIO,
    job: Job,
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
    translator: Translator, batch: list[str], job: Job, out: BinaryIO
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


def split_language(args: argparse.Namespace) -> str:
    """The ISO 639-1 code whose rules --split-sentences uses: --src-lang's, else the source
    language the (first) checkpoint records; English, with a warning, when neither is known."""
    from attnmt.data.sentences import splitting_language

    code = args.src_lang
    if code is None:
        sources, _ = checkpoint_languages(args.checkpoint[0])
        code = sources[0] if len(sources) == 1 else None
    lang, warning = splitting_language(code)
    if warning:
        print(f"{PROG}: warning: --split-sentences: {warning}", file=sys.stderr)
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


def report_scores(hyps: list[str], refs: list[str]) -> None:
    from attnmt.evaluation.bleu import corpus_bleu, corpus_chrf

    if not hyps:
        print(f"{PROG}: warning: no input lines, nothing to score", file=sys.stderr)
        return
    print(f"BLEU = {corpus_bleu(hyps, refs)}", file=sys.stderr)
    print(f"chrF = {corpus_chrf(hyps, refs)}", file=sys.stderr)


def plot_first(translator: Translator, first: str | None, path: str) -> None:
    from attnmt.decoding.plot import plot_attention

    if first is None:
        print(f"{PROG}: warning: every input line is empty; no attention plot", file=sys.stderr)
        return
    attn = translator.attention_for(first)
    title = "cross-attention (last layer, mean over heads)"
    plot_attention(attn.src_pieces, attn.tgt_pieces, attn.cross_attn, path, title=title)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    return exit_status(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
