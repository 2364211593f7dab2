"""Paragraphs against sentences: what `--split-sentences` is worth, and how often it errs.

    python -m benchmarks.documents -c RUN --data-dir ../shared/data/multi30k

Paragraphs are 4 consecutive test2017 sentences. BLEU of translate.py three ways: `unsplit`,
`split` (`--split-sentences`), `one by one`; then the splitter alone on `--count` paragraphs
per language: an error when it does not find the 4 sentences (unpunctuated ones apart).
"""

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from attnmt.data.sentences import split_line
from attnmt.evaluation.bleu import corpus_bleu
from benchmarks import harness

ROOT = harness.ROOT
GROUP = 4  # sentences per paragraph


def paragraphs(lines: list[str]) -> list[str]:
    """Every `GROUP` consecutive lines joined with a space (a last short group dropped)."""
    return [" ".join(lines[i : i + GROUP]) for i in range(0, len(lines) - GROUP + 1, GROUP)]


def translate(checkpoint: str, lines: list[str], flags: list[str]) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        src, hyp = Path(tmp) / "src", Path(tmp) / "hyp"
        src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        cmd = [sys.executable, str(ROOT / "translate.py"), "-c", checkpoint, *flags]
        cmd += ["--input", str(src), "--output", str(hyp)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        return hyp.read_text(encoding="utf-8").splitlines()


def bleu_three_ways(args: argparse.Namespace) -> None:
    data = Path(args.data_dir)
    src = (data / f"test2017.{args.src}").read_text(encoding="utf-8").splitlines()
    ref = (data / f"test2017.{args.tgt}").read_text(encoding="utf-8").splitlines()
    src, ref = src[: len(src) // GROUP * GROUP], ref[: len(ref) // GROUP * GROUP]
    refs, flags = paragraphs(ref), ["--beam", str(args.beam)]
    hyps = {
        "unsplit": translate(args.checkpoint, paragraphs(src), flags),
        "split": translate(args.checkpoint, paragraphs(src), [*flags, "--split-sentences"]),
        "one by one": paragraphs(translate(args.checkpoint, src, flags)),
    }
    print(f"\n{len(refs)} paragraphs of {GROUP} test2017 sentences, {args.src}->{args.tgt}, ")
    rows = [[name, f"{corpus_bleu(hyp, refs).score:.2f}"] for name, hyp in hyps.items()]
    print(f"beam {args.beam}\n\n" + "\n".join(harness.table(["input", "BLEU"], rows)))


def splitter_errors(args: argparse.Namespace) -> None:
    data = Path(args.data_dir)
    print(f"\nsplitter errors on {args.count} paragraphs per language\n")
    examples, rows = [], []
    for lang in (args.src, args.tgt):
        groups = []
        for split in ("test2016", "test2017"):
            lines = (data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            groups += [lines[i : i + GROUP] for i in range(0, args.count // 2 * GROUP, GROUP)]
        wrong = [g for g in groups if split_line(" ".join(g), lang).sentences != g]
        bare = [g for g in wrong if any(s.rstrip()[-1:] not in ".!?\"')" for s in g)]
        other = [g for g in wrong if g not in bare]
        rows.append([lang, len(wrong), len(bare), len(other)])
        examples += [(lang, g) for g in (other[:2] + bare[:1])]
    print("\n".join(harness.table(["language", "errors", "of which unpunctuated", "other"], rows)))
    for lang, group in examples:
        got = split_line(" ".join(group), lang).sentences
        print(f"\n{lang}: {len(got)} sentences found for {GROUP}:")
        for sentence in got:
            print(f"    {sentence}")


def add_flags(add: Callable) -> None:
    add("-c", "--checkpoint", help="run dir or .pt (without: splitter only)")
    add("--data-dir", default=str(harness.DATA))
    add("--src", default="en")
    add("--tgt", default="de")
    add("--beam", type=int, default=5)
    add("--count", type=int, default=200, help="paragraphs per language")


def run(args: argparse.Namespace) -> dict:
    if args.checkpoint:
        bleu_three_ways(args)
    splitter_errors(args)
    return {}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
