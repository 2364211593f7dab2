"""Ours and its peers decoding the same real sentences, timed: the one implementation behind
`scripts/benchmark.py --run` and `scripts/export_check.py --speed`.

A system is a function (source ids without specials, `SearchConfig`) -> the best target ids of
each sentence, without BOS/EOS, in input order:

* ours (`ours_system`): `Translator.search_ids`, the search `translate.py` runs (length-sorted
  batches of `cfg.batch_size`, each sentence its own budget `int(max_len_a * src_len +
  max_len_b)`), on a model loaded as `translate.py` loads it (`decoding.ensemble.load_ensemble`,
  also with `quantize="int8"`);
* transformers (`transformers_system`): `MarianMTModel.generate` on our weights
  (`decoding.export.to_marian`, sdpa attention);
* CTranslate2 (`ct2_system`): a `ctranslate2.Translator` on a folder written by
  `decoding.export.export_ct2` (float32 or int8), searching with `ct2_options`.

The peers get the batches ours searches (`length_sorted_batches`: the same sentences together,
longest first), one `generate` / `translate_batch` call per batch with the largest budget of
its sentences (both take one limit per call; a trained model's sentences end well before it).
All systems start from the same ids and return ids: SentencePiece is outside the timings.

`compare` times every (system, search) on all sentences in one call each, `repeats` times,
interleaved with a rotating order so that machine noise hits every cell alike, after an
untimed warm-up call on the first batch. `Spread` is a median with its min-max range; the
ratio ours / peer is taken per repeat (the same round of the interleaving) and summarised
the same way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.tokenizer import Tokenizer
from decoding import export
from decoding.config import SearchConfig
from decoding.translator import length_sorted_batches

Search = Callable[[list[list[int]], SearchConfig], list[list[int]]]
BatchSearch = Callable[[list[list[int]], SearchConfig, int], list[list[int]]]


# ----------------------------------------------------------------------------- systems


def ours_system(model: Any, tokenizer: Tokenizer) -> Search:
    """Our search as `translate.py` runs it."""
    return lambda src_ids, cfg: export.our_search_ids(model, tokenizer, src_ids, cfg)


def batched(tokenizer: Tokenizer, search_batch: BatchSearch) -> Search:
    """A peer's search over ours' batches: `search_batch(batch, cfg, budget)` per batch, with
    the batch's largest budget; [] for an empty source (ours never decodes one)."""
    special = tokenizer.special

    def search(src_ids: list[list[int]], cfg: SearchConfig) -> list[list[int]]:
        limits = export.budgets(src_ids, special, cfg)
        results: list[list[int]] = [[] for _ in src_ids]
        for chunk in length_sorted_batches(src_ids, cfg.batch_size):
            batch = [src_ids[i] for i in chunk]
            out = search_batch(batch, cfg, max(limits[i] for i in chunk))
            for i, ids in zip(chunk, out, strict=True):
                results[i] = ids
        return results

    return search


def transformers_system(model: Any, tokenizer: Tokenizer) -> Search:
    """`MarianMTModel.generate` on our weights. Raises `ExportError` (a `UserError`) when
    transformers is missing or the model is pre-norm."""
    marian = export.to_marian(model, tokenizer.special, attn_implementation="sdpa")
    special = tokenizer.special
    return batched(
        tokenizer,
        lambda batch, cfg, budget: export.hf_generate(marian, special, batch, cfg, budget),
    )


def ct2_system(folder: Path, tokenizer: Tokenizer, threads: int = 0) -> Search:
    """A `ctranslate2.Translator` on an `export_ct2` folder, `threads` intra-op threads (0:
    CTranslate2's default), one batch at a time."""
    ctranslate2 = export.require("ctranslate2")
    options = {"intra_threads": threads} if threads else {}
    translator = ctranslate2.Translator(str(folder), device="cpu", inter_threads=1, **options)
    target_ids = export.ct2_target_ids(tokenizer)

    def search_batch(batch: list[list[int]], cfg: SearchConfig, budget: int) -> list[list[int]]:
        return export.ct2_translate(
            translator, tokenizer, batch, cfg, len(batch), budget, target_ids
        )

    return batched(tokenizer, search_batch)


# ------------------------------------------------------------------------------ timing


def interleaved(
    runs: dict[Any, Callable[[], Any]], repeats: int, sync: Callable[[], None] | None = None
) -> dict[Any, list[float]]:
    """Seconds per call of each run, repeats interleaved (ABC BCA CAB ...) so that drifts in
    machine speed hit every run; rotating the order also spreads cache/allocator effects.
    `sync` (e.g. a CUDA synchronize) is called before and after each timed call."""
    times: dict[Any, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if sync:
                sync()
            start = time.perf_counter()
            runs[name]()
            if sync:
                sync()
            times[name].append(time.perf_counter() - start)
    return times


@dataclass(frozen=True)
class Spread:
    """A median and the min-max range of repeated figures."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def format(self, spec: str = ",.1f", suffix: str = "") -> str:
        return f"{self.median:{spec}}{suffix} ({self.low:{spec}}-{self.high:{spec}}{suffix})"

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high}


def ratio_spread(ours_s: Sequence[float], peer_s: Sequence[float]) -> Spread:
    """ours' speed / the peer's, per repeat (the same work: peer seconds / ours seconds)."""
    return Spread.of([p / o for o, p in zip(ours_s, peer_s, strict=True)])


@dataclass
class Cell:
    """One system x one search: its timed seconds and its (last) output."""

    times_s: list[float]
    ids: list[list[int]]

    def rate(self) -> Spread:
        """Sentences per second."""
        return Spread.of([len(self.ids) / t for t in self.times_s])

    def tokens_per_sentence(self) -> float:
        return sum(len(ids) for ids in self.ids) / max(len(self.ids), 1)


def compare(
    systems: dict[str, Search],
    src_ids: list[list[int]],
    cfgs: Sequence[SearchConfig],
    repeats: int,
) -> dict[tuple[str, int], Cell]:
    """Time every system with every search config on all `src_ids` (see the module doc);
    keys (system name, beam size)."""
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    runs: dict[tuple[str, int], Callable[[], Any]] = {}
    for name, search in systems.items():
        for cfg in cfgs:
            key = (name, cfg.beam_size)
            search(src_ids[: cfg.batch_size], cfg)  # warm-up: one batch, untimed

            def run(search: Search = search, cfg: SearchConfig = cfg, key: Any = key) -> None:
                outputs[key] = search(src_ids, cfg)

            runs[key] = run
    times = interleaved(runs, repeats)
    return {key: Cell(times[key], outputs[key]) for key in runs}


def search_name(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def table(
    cells: dict[tuple[str, int], Cell],
    ours: str,
    bleu: Callable[[list[list[int]]], float] | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """A Markdown table (rows: systems; per search: sentences/s, BLEU when `bleu` is given,
    ours / system), a table of output checks, and the same figures as a JSON-able dict.
    Figures: median (min-max) over the repeats."""
    systems = list(dict.fromkeys(name for name, _ in cells))
    beams = list(dict.fromkeys(beam for _, beam in cells))
    head = ["system"] + [f"{search_name(b)} sent/s" for b in beams]
    if bleu:
        head += [f"{search_name(b)} BLEU" for b in beams]
    head += [f"{ours} / system, {search_name(b)}" for b in beams]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    report: dict[str, Any] = {}
    bleus = {key: bleu(cell.ids) for key, cell in cells.items()} if bleu else {}
    for name in systems:
        row, entry = [name], report.setdefault(name, {})
        ratios = {}
        for beam in beams:
            cell = cells[(name, beam)]
            ratio = ratios[beam] = ratio_spread(cells[(ours, beam)].times_s, cell.times_s)
            entry[search_name(beam)] = {
                "sentences_per_s": cell.rate().as_dict(),
                "times_s": cell.times_s,
                f"ratio_{ours}_over_system": ratio.as_dict(),
                "tokens_per_sentence": cell.tokens_per_sentence(),
                "same_ids_as_ours": sum(
                    a == b for a, b in zip(cell.ids, cells[(ours, beam)].ids, strict=True)
                ),
                "bleu": bleus.get((name, beam)),
            }
            row.append(cell.rate().format())
        if bleu:
            row += [f"{bleus[(name, beam)]:.2f}" for beam in beams]
        row += ["1" if name == ours else ratios[beam].format(".2f", "x") for beam in beams]
        lines.append("| " + " | ".join(row) + " |")
    n = len(next(iter(cells.values())).ids)
    lines += ["", f"outputs (of {n} sentences): same ids as {ours}; tokens per sentence"]
    for name in systems:
        parts = [
            f"{search_name(beam)}: {report[name][search_name(beam)]['same_ids_as_ours']}/{n}, "
            f"{report[name][search_name(beam)]['tokens_per_sentence']:.1f}"
            for beam in beams
        ]
        lines.append(f"  {name:<20} " + "; ".join(parts))
    return lines, report
