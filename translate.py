#!/usr/bin/env python
"""Translate with a trained checkpoint: sentences as arguments, from a file, or from stdin.

    python translate.py -c RUN_DIR "Ein Mann fährt Fahrrad." "Zwei Hunde spielen."
    echo "Ein Mann fährt Fahrrad." | python translate.py -c RUN_DIR
    python translate.py -c RUN_DIR --input test.de --output hyp.en --ref test.en --beam 5
    python translate.py -c RUN_DIR --plot-attention attn.png "Ein Mann fährt Fahrrad."

One translation per input line, in order (an empty line gives an empty line). Every user
mistake ends with one line on stderr, `translate.py: error: <problem>; <fix>`, and exit status
1 (2 for bad flags), never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import UserError
from common.files import atomic_write, read_lines

if TYPE_CHECKING:  # heavy imports (torch) wait until the flags and inputs are checked
    from decoding import TextHypothesis, Translator

PROG = "translate.py"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Translate sentences with a trained encoder-decoder Transformer.",
        epilog="Input: positional sentences, else --input FILE, else standard input; one "
        "sentence per line. Output: one translation per input line on stdout (or --output).",
    )
    add = parser.add_argument
    add("sentences", nargs="*", help="sentences to translate (default: --input or stdin)")
    add(
        "-c",
        "--checkpoint",
        required=True,
        help="run dir (uses checkpoints/best.pt, else last.pt) or .pt file",
    )
    add("--beam", type=_count(1), default=5, help="beam size; 1 = greedy search (default: 5)")
    add(
        "--length-penalty",
        type=float,
        default=1.0,
        help="alpha: hypotheses are ranked by log-prob / len**alpha (fairseq); 0 = raw log-prob "
        "(default: 1.0)",
    )
    add(
        "--max-len-a",
        type=_non_negative_float,
        default=1.2,
        help="output length limit a*src_len+b, per sentence (default a: 1.2)",
    )
    add("--max-len-b", type=_count(0), default=10, help="see --max-len-a (default b: 10)")
    add(
        "--nbest",
        type=_count(1),
        default=1,
        help="hypotheses per input (<= --beam); above 1 prints 'INDEX ||| TRANSLATION ||| SCORE' "
        "lines (INDEX 0-based, best first; an empty input gets one empty hypothesis), so "
        "line counts differ from the input (default: 1: plain translations)",
    )
    add("--batch-size", type=_count(1), default=64, help="sentences per search batch (default: 64)")
    add(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto = cuda when available, else cpu (default: auto)",
    )
    add("--input", metavar="FILE", help="read sentences from FILE (UTF-8, one per line)")
    add(
        "--output", metavar="FILE", help="write translations to FILE (atomically) instead of stdout"
    )
    add(
        "--ref",
        metavar="FILE",
        help="reference translations: print sacreBLEU BLEU and chrF to stderr",
    )
    add(
        "--plot-attention",
        metavar="PNG",
        help="save the cross-attention heatmap (last layer, mean over heads) of the "
        "first non-empty input sentence",
    )
    return parser


def check_writable(path: str | None, flag: str) -> None:
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{flag} {path} is a directory; pass a file name")
    if not target.parent.is_dir():
        raise UserError(f"{flag} directory {target.parent} does not exist; create it first")


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no CUDA GPU; use --device cpu (or auto)")
    return name


def format_output(nbest: list[list[TextHypothesis]], n: int) -> str:
    """Plain translations, or Moses-style n-best lines `i ||| translation ||| score`."""
    if n == 1:
        return "".join(f"{hyps[0].text}\n" for hyps in nbest)
    return "".join(
        f"{i} ||| {h.text} ||| {h.score:.4f}\n" for i, hyps in enumerate(nbest) for h in hyps
    )


def run(args: argparse.Namespace) -> None:
    if args.nbest > args.beam:
        raise UserError(f"--nbest {args.nbest} needs --beam >= {args.nbest}; raise --beam")
    check_writable(args.output, "--output")
    check_writable(args.plot_attention, "--plot-attention")
    if args.sentences:
        sentences = [" ".join(s.splitlines()) for s in args.sentences]
    else:
        sentences = read_lines(args.input, "--input")
    refs = None if args.ref is None else read_lines(args.ref, "--ref")
    if refs is not None and len(refs) != len(sentences):
        raise UserError(
            f"--ref {args.ref} has {len(refs)} lines but the input has {len(sentences)}; "
            "pass the reference file that matches the input line by line"
        )
    device = resolve_device(args.device)

    from decoding import SearchConfig, Translator
    from decoding.checkpoint import load_for_inference

    model, tokenizer, _ = load_for_inference(args.checkpoint, device)
    cfg = SearchConfig(
        beam_size=args.beam,
        length_penalty=args.length_penalty,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        nbest=args.nbest,
        batch_size=args.batch_size,
    )
    translator = Translator(model, tokenizer, cfg, device)
    nbest = translator.translate_nbest(sentences)
    output = format_output(nbest, args.nbest)
    if args.output:
        atomic_write(args.output, output)
    else:
        sys.stdout.buffer.write(output.encode("utf-8"))
        sys.stdout.flush()
    if refs is not None:
        report_scores([hyps[0].text for hyps in nbest], refs)
    if args.plot_attention:
        plot_first(translator, sentences, args.plot_attention)


def report_scores(hyps: list[str], refs: list[str]) -> None:
    from evaluation.bleu import corpus_bleu, corpus_chrf

    if not hyps:
        print(f"{PROG}: warning: no input lines, nothing to score", file=sys.stderr)
        return
    print(f"BLEU = {corpus_bleu(hyps, refs)}", file=sys.stderr)
    print(f"chrF = {corpus_chrf(hyps, refs)}", file=sys.stderr)


def plot_first(translator: Translator, sentences: list[str], path: str) -> None:
    from decoding.plot import plot_attention

    first = next((s for s in sentences if s.strip()), None)
    if first is None:
        print(f"{PROG}: warning: every input line is empty; no attention plot", file=sys.stderr)
        return
    attn = translator.attention_for(first)
    title = "cross-attention (last layer, mean over heads)"
    plot_attention(attn.src_pieces, attn.tgt_pieces, attn.cross_attn, path, title=title)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(levelname)s: %(message)s")
    try:
        run(args)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `| head`: the reader left; not an error worth a traceback
        sys.stderr.close()
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
