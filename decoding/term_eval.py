"""Where glossary terms land: term use, glued terms, terms after the final mark, term beside the
usual word, WMT 2021's window overlap, and BLEU, without a glossary, with the usual one and
with an unusual one, greedy and beam 5, on the test sentences that hold a source term.

Measures (per (sentence, term) pair the glossary finds in a source):
- used: the output holds the target term as written, whole words (WMT 2021's exact match);
- glued: an occurrence of the term starts right after a character that is not a space, an
  opening bracket or a quote, or goes on with a word character or a hyphen ("Fahrrad.Velo",
  "Velo-Shirt");
- after final: an occurrence of the term comes after the output's n-th final mark (. ! ?),
  n the number of final marks in the source (at least 1);
- both: the term is used and the output also holds the usual word it should replace;
- window 2/3 (Alam et al. 2021): in the reference with its usual words replaced by the terms,
  the share of the words within 2 (3) words of the term that also stand within 2 (3) words of
  the term in the output (0 where the output lacks the term);
- BLEU against the references, and against the references with the usual words replaced by
  the glossary's terms (the unusual glossary's "BLEU*").

What `scripts/term_eval.py` runs.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from attnmt.decoding.config import SearchConfig
from attnmt.decoding.glossary import Glossary
from attnmt.evaluation.bleu import corpus_bleu
from attnmt.evaluation.terms import placement, window_overlap

if TYPE_CHECKING:
    from attnmt.decoding.translator import Translator

USUAL = {"bike": "Fahrrad", "dog": "Hund", "man": "Mann", "woman": "Frau", "ice cream": "Eis"}
UNUSUAL = {"bike": "Velo", "dog": "Köter", "man": "Kerl", "woman": "Dame", "ice cream": "Gelato"}
# the usual words (any inflection) an unusual term replaces
USUAL_WORD = {
    "bike": r"Fahrr[aä]d\w*|Rad",
    "dog": r"Hund\w*",
    "man": r"M[aä]nn(?!schaft)\w*",
    "woman": r"Frau\w*",
    "ice cream": r"Eis(?!en)\w*",
}


def replaced(ref: str, src: str, glossary: Glossary) -> str:
    for term in glossary.find(src):
        ref = word(USUAL_WORD[term.source.lower()]).sub(term.target, ref)
    return ref


def word(pattern: str) -> re.Pattern:
    return re.compile(rf"(?<!\w)(?:{pattern})(?!\w)")


def measure(glossary: Glossary, sources: list[str], refs: list[str], outs: list[str]) -> dict:
    rows = []
    refs_t = [replaced(r, s, glossary) for s, r in zip(sources, refs, strict=True)]
    for src, ref, out in zip(sources, refs, outs, strict=True):
        ref_t = replaced(ref, src, glossary)
        for term in glossary.find(src):
            used, glued, after = placement(src, out, term.target)
            usual = word(USUAL_WORD[term.source.lower()]).search(out) is not None
            w2, w3 = (window_overlap(ref_t, out, term.target, k) for k in (2, 3))
            rows.append((used, glued, after, used and usual, w2, w3))
    cols = list(zip(*rows, strict=True))

    def mean(values: tuple) -> float:
        kept = [v for v in values if v is not None]
        return round(100 * statistics.mean(kept), 1) if kept else float("nan")

    return {
        "pairs": len(rows),
        "used %": mean(cols[0]),
        "glued": sum(cols[1]),
        "after final": sum(cols[2]),
        "both term and usual word": sum(cols[3]),
        "window 2 %": mean(cols[4]),
        "window 3 %": mean(cols[5]),
        "BLEU*": round(corpus_bleu(outs, refs_t).score, 2),
    }


def evaluate_terms(translator: Translator, sources: list[str], refs: list[str], out: Path) -> list:
    """Translate `sources` greedily and with beam 5, without a glossary, with the usual one and
    with the unusual one; each run's outputs go to `out` (beamB.GLOSSARY.txt, and
    sources.txt, results.json) and its row of measures to stdout as it ends."""
    glossaries = {"none": None, "usual": Glossary.from_mapping(USUAL)}
    glossaries["unusual"] = Glossary.from_mapping(UNUSUAL)
    results = []
    out.mkdir(parents=True, exist_ok=True)
    for beam in (1, 5):
        translator.search_cfg = SearchConfig(beam_size=beam)
        translator.translate(sources[:8], glossary=glossaries["unusual"])  # kernels warmed
        for name, glossary in glossaries.items():
            start = time.perf_counter()
            outs = translator.translate(sources, glossary=glossary)
            row = {"beam": beam, "glossary": name, "seconds": time.perf_counter() - start}
            row["BLEU"] = round(corpus_bleu(outs, refs).score, 2)
            for other in ("usual", "unusual"):
                row[other] = measure(glossaries[other], sources, refs, outs)
            results.append(row)
            (out / f"beam{beam}.{name}.txt").write_text("\n".join(outs) + "\n", encoding="utf-8")
            print(json.dumps(row, ensure_ascii=False), flush=True)
    (out / "sources.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False))
    return results
