"""Where glossary terms land (`decoding.term_eval`): term use, glued terms, terms after the final
mark, term beside the usual word, WMT 2021's window overlap, and BLEU, on the test sentences
that hold a source term.

Usage:
    python scripts/term_eval.py --run RUN_DIR --src test2017.en --ref test2017.de \\
        --limit 200 --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnmt.common.files import read_lines
from attnmt.decoding.glossary import Glossary
from attnmt.decoding.term_eval import USUAL, evaluate_terms
from attnmt.decoding.translator import Translator
from attnmt.engine import load_engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True, help="folder for the outputs and results.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_engine([args.run])
    usual = Glossary.from_mapping(USUAL)
    pairs = zip(read_lines(args.src, "--src"), read_lines(args.ref, "--ref"), strict=True)
    held = [(s, r) for s, r in pairs if usual.find(s)][: args.limit]
    sources, refs = [s for s, _ in held], [r for _, r in held]
    evaluate_terms(Translator(model, tokenizer), sources, refs, Path(args.out))


if __name__ == "__main__":
    main()
