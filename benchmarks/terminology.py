"""Terminology: how often translations use a glossary's terms (`translate.py --glossary`),
with no glossary, the usual translations and unusual ones, greedy and beam (WMT 2021's
measure: the target term as written, whole words), BLEU, output length; then the decoding
time of `--limit` sentences at `--beam` with each glossary against none.

    python -m benchmarks.terminology --run RUN_DIR --src test2017.en --ref test2017.de \\
        --limit 512 --threads 2 --repeats 3
"""

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

from attnmt.common.files import read_lines
from attnmt.common.memory import keep_freed_memory
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary
from attnmt.decoding.glossary import uses_term as used
from attnmt.decoding.translator import Translator
from attnmt.engine import load_engine
from attnmt.evaluation.bleu import corpus_bleu
from benchmarks import harness

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


def glossaries() -> dict[str, Glossary | None]:
    return {"none": None, "usual": Glossary.from_mapping(USUAL), "unusual": Glossary.from_mapping(UNUSUAL)}  # fmt: skip


def usage(glossary: Glossary, sources: list[str], outputs: list[str]) -> tuple[int, int]:
    """(pairs whose target term the output uses, (sentence, term) pairs found)."""
    found = zip(sources, outputs, strict=True)
    pairs = [(out, t.target) for src, out in found for t in glossary.find(src)]
    return sum(used(out, target) for out, target in pairs), len(pairs)


def quality(translator: Translator, sources: list[str], refs: list[str]) -> list[dict]:
    """One row per (search, glossary): term-usage rate of each glossary, BLEU, length."""
    named, rows = glossaries(), []
    for beam in (1, 5):
        translator.search_cfg = SearchConfig(beam_size=beam)
        for name, glossary in named.items():
            outputs = translator.translate(sources, glossary=glossary)
            row = {"search": "greedy" if beam == 1 else f"beam {beam}", "glossary": name}
            for other in ("usual", "unusual"):
                hits, pairs = usage(named[other], sources, outputs)
                row[f"{other} terms used"] = f"{100 * hits / pairs:.1f}% ({hits}/{pairs})"
            row["BLEU"] = f"{corpus_bleu(outputs, refs).score:.2f}"
            row["words/sentence"] = f"{statistics.mean(len(o.split()) for o in outputs):.2f}"
            rows.append(row)
    return rows


def timing(translator: Translator, sources: list[str], beam: int, repeats: int) -> list[dict]:
    """Seconds to translate `sources` per glossary, interleaved repeats, median and range."""
    translator.search_cfg = SearchConfig(beam_size=beam)
    named = glossaries()
    translator.translate(sources[:16], glossary=named["usual"])  # warm-up
    runs = {name: lambda g=g: translator.translate(sources, glossary=g) for name, g in named.items()}  # fmt: skip
    seconds = harness.interleaved(runs, repeats)
    base = statistics.median(seconds["none"])
    return [
        {"glossary": name, "seconds (median)": f"{statistics.median(times):.2f}",
         "range": f"{min(times):.2f}-{max(times):.2f}",
         "x none": f"{statistics.median(times) / base:.2f}"}
        for name, times in seconds.items()
    ]  # fmt: skip


def table(rows: list[dict]) -> str:
    return "\n".join(harness.table(list(rows[0]), [list(r.values()) for r in rows]))


def add_flags(add: Callable) -> None:
    add("--run", required=True, help="run dir or checkpoint")
    add("--src", required=True)
    add("--ref", required=True)
    add("--limit", type=int, default=512, help="sentences timed")
    add("--beam", type=int, default=5, help="beam of the timing")


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads or 2)
    keep_freed_memory()
    model, tokenizer = load_engine([args.run])
    translator = Translator(model, tokenizer)
    usual = Glossary.from_mapping(USUAL)
    pairs = zip(read_lines(args.src, "--src"), read_lines(args.ref, "--ref"), strict=True)
    held = [(src, ref) for src, ref in pairs if usual.find(src)]
    sources, refs = [src for src, _ in held], [ref for _, ref in held]
    print(f"{len(sources)} sentences hold a term; {torch.get_num_threads()} threads")
    report = {"quality": quality(translator, sources, refs)}
    print(table(report["quality"]))
    print(f"\ndecoding {min(args.limit, len(sources))} of them, beam {args.beam}:")
    report["timing"] = timing(translator, sources[: args.limit], args.beam, args.repeats or 3)
    print(table(report["timing"]))
    return report


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
