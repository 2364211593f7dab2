#!/usr/bin/env python
"""Terminology: how often translations use a glossary's terms, with and without the glossary
(`translate.py --glossary`), BLEU, output length, and what the constraints cost in time.

On the test sentences that hold a source term of the glossaries (both name the same source
terms): the term-usage rate (per (sentence, term) pair found, whether the output holds the
target term as written, whole words: WMT 2021's terminology measure) with no glossary, the
usual translations and unusual ones, greedy and beam; sacreBLEU and the mean output length
in words. Then the decoding time of `--limit` of those sentences at `--beam` with each glossary
against none, repeats interleaved, medians, on `--threads` threads.

Usage:
    python -m benchmarks.terminology --run RUN_DIR --src test2017.en --ref test2017.de \\
        --limit 512 --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnmt.common.files import read_lines
from attnmt.common.memory import keep_freed_memory
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary
from attnmt.decoding.glossary import uses_term as used
from attnmt.decoding.translator import Translator
from attnmt.engine import load_engine
from attnmt.evaluation.bleu import corpus_bleu

# English -> German: the translations a Multi30k model gives anyway, and unusual ones.
USUAL = {
    "man": "Mann", "woman": "Frau", "dog": "Hund", "boy": "Junge", "girl": "Mädchen",
    "young boy": "kleiner Junge", "little girl": "kleines Mädchen", "street": "Straße",
    "water": "Wasser", "ball": "Ball", "bike": "Fahrrad", "hat": "Hut", "car": "Auto",
    "beach": "Strand", "crowd": "Menschenmenge", "soccer ball": "Fußball", "frisbee": "Frisbee",
}  # fmt: skip
UNUSUAL = {
    "man": "Herr", "woman": "Dame", "dog": "Vierbeiner", "boy": "Knabe", "girl": "Maid",
    "young boy": "junger Knabe", "little girl": "kleine Maid", "street": "Gasse",
    "water": "Nass", "ball": "Kugel", "bike": "Drahtesel", "hat": "Kopfbedeckung",
    "car": "Wagen", "beach": "Sandstrand", "crowd": "Schar", "soccer ball": "Lederkugel",
    "frisbee": "Frisbee",
}  # fmt: skip


def usage(glossary: Glossary, sources: list[str], outputs: list[str]) -> tuple[int, int]:
    """(pairs whose target term the output uses, (sentence, term) pairs found)."""
    found = zip(sources, outputs, strict=True)
    pairs = [(out, t.target) for src, out in found for t in glossary.find(src)]
    return sum(used(out, target) for out, target in pairs), len(pairs)


def quality(translator: Translator, sources: list[str], refs: list[str]) -> list[dict]:
    """One row per (search, glossary): term-usage rate of each glossary, BLEU, length."""
    glossaries = {"none": None, "usual": Glossary.from_mapping(USUAL)}
    glossaries["unusual"] = Glossary.from_mapping(UNUSUAL)
    rows = []
    for beam in (1, 5):
        translator.search_cfg = SearchConfig(beam_size=beam)
        for name, glossary in glossaries.items():
            outputs = translator.translate(sources, glossary=glossary)
            row = {"search": "greedy" if beam == 1 else f"beam {beam}", "glossary": name}
            for other in ("usual", "unusual"):
                hits, pairs = usage(glossaries[other], sources, outputs)
                row[f"{other} terms used"] = f"{100 * hits / pairs:.1f}% ({hits}/{pairs})"
            row["BLEU"] = f"{corpus_bleu(outputs, refs).score:.2f}"
            row["words/sentence"] = f"{statistics.mean(len(o.split()) for o in outputs):.2f}"
            rows.append(row)
    return rows


def timing(translator: Translator, sources: list[str], beam: int, repeats: int) -> list[dict]:
    """Seconds to translate `sources` per glossary, interleaved repeats, median and range."""
    translator.search_cfg = SearchConfig(beam_size=beam)
    glossaries = {"none": None, "usual": Glossary.from_mapping(USUAL)}
    glossaries["unusual"] = Glossary.from_mapping(UNUSUAL)
    names = list(glossaries)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    translator.translate(sources[:16], glossary=glossaries["usual"])  # warm-up
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotating order
            start = time.perf_counter()
            translator.translate(sources, glossary=glossaries[name])
            seconds[name].append(time.perf_counter() - start)
    base = statistics.median(seconds["none"])
    return [
        {
            "glossary": name,
            "seconds (median)": f"{statistics.median(times):.2f}",
            "range": f"{min(times):.2f}-{max(times):.2f}",
            "x none": f"{statistics.median(times) / base:.2f}",
        }
        for name, times in seconds.items()
    ]


def table(rows: list[dict]) -> str:
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="run dir or checkpoint")
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--limit", type=int, default=512, help="sentences timed")
    parser.add_argument("--beam", type=int, default=5, help="beam of the timing")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    model, tokenizer = load_engine([args.run])
    translator = Translator(model, tokenizer)
    usual = Glossary.from_mapping(USUAL)
    pairs = zip(read_lines(args.src, "--src"), read_lines(args.ref, "--ref"), strict=True)
    held = [(src, ref) for src, ref in pairs if usual.find(src)]
    sources, refs = [src for src, _ in held], [ref for _, ref in held]
    print(f"{len(sources)} sentences hold a term; {torch.get_num_threads()} threads")
    print(table(quality(translator, sources, refs)))
    print(f"\ndecoding {min(args.limit, len(sources))} of them, beam {args.beam}:")
    print(table(timing(translator, sources[: args.limit], args.beam, args.repeats)))


if __name__ == "__main__":
    main()
