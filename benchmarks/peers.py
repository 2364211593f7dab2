"""Ours and its peers decoding the same real sentences, each system in a process of its own
(`benchmark.py --run`; docs/benchmarks.md, "Decoding speed, per CPU kind").
A system maps (source ids, `SearchConfig`) to the best target ids per sentence, in input order;
the peers get ours' length-sorted batches, each with its largest length budget."""

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnmt.common.errors import UserError
from attnmt.common.runtime import autocast
from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.translator import Translator, length_sorted_batches
from attnmt.exporting.ct2 import ct2_batch_options, ct2_target_ids
from attnmt.exporting.hf import hf_generate, to_marian
from attnmt.exporting.shared import budgets, require
from benchmarks import harness
from benchmarks.harness import Spread, interleaved, ratio_spread

Search = Callable[[list[list[int]], SearchConfig], list[list[int]]]
BatchSearch = Callable[[list[list[int]], SearchConfig, int], Any]  # ids, or a wait for them

# The environment that caps a process to a CPU kind's instruction sets (read when torch, oneDNN,
# MKL and CTranslate2 start: a worker gets it before its imports). avx2: a Zen 3-class CPU.
AVX2 = (("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2"), ("MKL_ENABLE_INSTRUCTIONS", "AVX2"))  # fmt: skip
CPU_KINDS: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "native": {"ours": (), "ctranslate2": ()},
    "avx2": {"ours": AVX2, "ctranslate2": (("CT2_FORCE_CPU_ISA", "AVX2"),)},
}


def ours_system(
    model: Any, tokenizer: Tokenizer, inter_threads: int = 1, precision: str = "fp32"
) -> Search:
    """Our search as `translate.py --inter-threads N --precision P` runs it."""
    translators: dict[str, Translator] = {}  # one per SearchConfig (each keeps its threads)

    def search(src_ids: list[list[int]], cfg: SearchConfig) -> list[list[int]]:
        if (key := repr(cfg)) not in translators:
            translators[key] = Translator(model, tokenizer, cfg, inter_threads=inter_threads)
        with autocast("cpu", precision):
            return [nbest[0].tokens for nbest in translators[key].search_ids(src_ids)]

    return search


def batched(tokenizer: Tokenizer, search_batch: BatchSearch, pipelined: bool = False) -> Search:
    """A peer's search over ours' batches, each with its largest budget; `pipelined`: every
    batch is submitted (`search_batch` returns a wait for its ids) before the first wait."""

    def search(src_ids: list[list[int]], cfg: SearchConfig) -> list[list[int]]:
        limits, results = budgets(src_ids, tokenizer.special, cfg), [[] for _ in src_ids]
        chunks = length_sorted_batches(src_ids, cfg.batch_size)
        outs = [search_batch([src_ids[i] for i in c], cfg, max(limits[i] for i in c)) for c in chunks]  # fmt: skip
        for chunk, out in zip(chunks, outs, strict=True):
            for i, ids in zip(chunk, out() if pipelined else out, strict=True):
                results[i] = ids
        return results

    return search


def transformers_system(model: Any, tokenizer: Tokenizer) -> Search:
    """`MarianMTModel.generate` on our weights; `ExportError` without transformers or pre-norm."""
    marian = to_marian(model, tokenizer.special, attn_implementation="sdpa")
    generate = lambda batch, cfg, n: hf_generate(marian, tokenizer.special, batch, cfg, n)  # noqa: E731
    return batched(tokenizer, generate)


def ct2_system(
    folder: Path, tokenizer: Tokenizer, threads: int = 0, inter_threads: int = 1
) -> Search:
    """CTranslate2 on an `export_ct2` folder, `inter_threads` batches at once on
    `threads // inter_threads` threads each (`threads` 0: its default), submitted asynchronously."""
    ctranslate2 = require("ctranslate2")
    intra = {"intra_threads": max(1, threads // inter_threads)} if threads else {}
    translator = ctranslate2.Translator(str(folder), device="cpu", inter_threads=inter_threads, **intra)  # fmt: skip
    target_ids = ct2_target_ids(tokenizer)

    def submit(batch: list[list[int]], cfg: SearchConfig, budget: int) -> Callable:
        options = ct2_batch_options(tokenizer, cfg, len(batch), budget, asynchronous=True)
        pending = translator.translate_batch([tokenizer.src_pieces(i) for i in batch], **options)
        return lambda: [[target_ids[p] for p in r.result().hypotheses[0]] for r in pending]

    return batched(tokenizer, submit, pipelined=True)


def ours_from_checkpoint(path: str, quantize: str = "none", inter_threads: int = 1,
                         precision: str = "fp32", pack: bool | None = None) -> Search:  # fmt: skip
    """`ours_system` on a checkpoint loaded as translate.py loads it (`pack` None: its packed
    paths), in a worker set up as translate.py sets up its process (`keep_freed_memory`)."""
    from attnmt.common.memory import keep_freed_memory
    from attnmt.engine import load_engine

    keep_freed_memory()
    model, tokenizer = load_engine([path], "cpu", quantize, pack)
    return ours_system(model, tokenizer, inter_threads, precision)


def transformers_from_checkpoint(path: str) -> Search:
    from attnmt.checkpoint import load_for_inference

    model, tokenizer, _ = load_for_inference(path, "cpu")
    return transformers_system(model, tokenizer)


def ct2_from_folder(
    folder: str, checkpoint: str, threads: int = 0, inter_threads: int = 1
) -> Search:
    """`ct2_system` with `checkpoint`'s tokenizer; no torch op runs in its process (one would
    slow CTranslate2 down through the shared OpenMP runtime: see `Isolated`)."""
    from attnmt.checkpoint import load_checkpoint, stored_tokenizer

    tokenizer = stored_tokenizer(load_checkpoint(checkpoint), checkpoint)
    return ct2_system(Path(folder), tokenizer, threads, inter_threads)


@dataclass(frozen=True)
class Isolated:
    """A system built (`build(*args)`, module-level and picklable) and run in a spawned process
    with `threads` torch threads (0: torch's) and `env`. Why: CTranslate2 shares torch's libgomp
    in one process and, once it has its own thread team, torch's threads sleep between regions."""

    build: Callable[..., Search]
    args: tuple = ()
    threads: int = 0
    env: tuple[tuple[str, str], ...] = ()


_worker: dict[str, Any] = {}  # in a worker process: its system's search and sentences


def _build(spec: Isolated, src_ids: list[list[int]]) -> None:
    if spec.threads:
        torch.set_num_threads(spec.threads)
    _worker.update(search=spec.build(*spec.args), src_ids=src_ids)


def _search(cfg: SearchConfig, n: int) -> tuple[float, list[list[int]]]:
    """Seconds (timed in the worker, around the search call) and the ids of `n` sentences."""
    with torch.inference_mode():
        start = time.perf_counter()
        ids = _worker["search"](_worker["src_ids"][:n], cfg)
        return time.perf_counter() - start, ids


class _Worker:
    """The parent's handle on an `Isolated` system's process (spawned: no state shared)."""

    def __init__(self, spec: Isolated, src_ids: list[list[int]]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx)
        saved = {name: os.environ.get(name) for name, _ in spec.env}
        os.environ.update(spec.env)  # the process starts with the first call and copies it
        try:
            self.call(_build, spec, src_ids)
        except UserError:
            self.pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            for name, value in saved.items():
                os.environ.pop(name, None) if value is None else os.environ.update({name: value})

    def call(self, fn: Callable, *args: Any) -> Any:
        try:
            return self.pool.submit(fn, *args).result()
        except BrokenProcessPool:
            raise UserError("a benchmark worker process died") from None
        except Exception as e:  # the system's own error, e.g. a missing checkpoint
            raise UserError(str(e) or type(e).__name__) from None


@dataclass
class Cell:
    """One system x one search: its timed seconds and its (last) output."""

    times_s: list[float]
    ids: list[list[int]]

    def rate(self) -> Spread:  # sentences per second
        return Spread.of([len(self.ids) / t for t in self.times_s])


def compare(
    systems: dict[str, Search | Isolated],
    src_ids: list[list[int]] | dict[str, list[list[int]]],
    cfgs: Sequence[SearchConfig],
    repeats: int,
) -> dict[tuple[str, int], Cell]:
    """Time every system with every search on all `src_ids` (or, by system name, its own);
    keys (system, beam). `Isolated` systems run in processes started here, stopped on return;
    one that fails to build or dies raises `UserError`."""
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    runs: dict[tuple[str, int], Callable[[], Any]] = {}
    workers: list[_Worker] = []
    try:
        for name, system in systems.items():
            ids = src_ids[name] if isinstance(src_ids, dict) else src_ids
            if isinstance(system, Isolated):
                workers.append(_Worker(system, ids))
                search = lambda cfg, n, w=workers[-1]: w.call(_search, cfg, n)  # noqa: E731
            else:
                search = lambda cfg, n, s=system, ids=ids: (None, s(ids[:n], cfg))  # noqa: E731
            for cfg in cfgs:
                key = (name, cfg.beam_size)
                search(cfg, min(cfg.batch_size, len(ids)))  # warm-up: one batch, untimed

                def run(search: Any = search, cfg: Any = cfg, key: Any = key, n: int = len(ids)) -> Any:  # fmt: skip
                    seconds, outputs[key] = search(cfg, n)
                    return seconds  # None: timed by `interleaved`

                runs[key] = run
        times = interleaved(runs, repeats)
    finally:
        for worker in workers:
            worker.pool.shutdown(wait=True, cancel_futures=True)
    return {key: Cell(times[key], outputs[key]) for key in runs}


def search_name(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def table(
    cells: dict[tuple[str, int], Cell],
    ours: str,
    bleu: Callable[[str, list[list[int]]], float] | None = None,
    same_vocab: Callable[[str], bool] = lambda name: True,
) -> tuple[list[str], dict[str, Any]]:
    """The Markdown table (per search: sentences/s, BLEU when `bleu` is given, ours / system;
    median (min-max) over the repeats), the output checks (ids against ours' where
    `same_vocab(system)`), and the same figures as a JSON-able dict."""
    searches = {beam: search_name(beam) for _, beam in cells}
    head = [f"{s} sent/s" for s in searches.values()]
    head += [f"{s} BLEU" for s in searches.values()] if bleu else []
    head += [f"{ours} / system, {s}" for s in searches.values()]
    rows, checks, report = [], [], {}
    n = len(next(iter(cells.values())).ids)
    for name in dict.fromkeys(name for name, _ in cells):
        entry, row, tail, check = {}, [name], [], []
        report[name] = entry
        for beam, search in searches.items():
            cell, mine = cells[(name, beam)], cells[(ours, beam)]
            ratio = ratio_spread(mine.times_s, cell.times_s)
            same = sum(a == b for a, b in zip(cell.ids, mine.ids, strict=True))
            tokens = sum(len(ids) for ids in cell.ids) / max(n, 1)
            entry[search] = {"sentences_per_s": cell.rate().as_dict(), "times_s": cell.times_s,
                             f"ratio_{ours}_over_system": ratio.as_dict(), "tokens_per_sentence": tokens,
                             "same_ids_as_ours": same if same_vocab(name) else None,  # else another vocabulary
                             "bleu": bleu(name, cell.ids) if bleu else None}  # fmt: skip
            row.append(cell.rate().format())
            tail.append("1" if name == ours else ratio.format(".2f", "x"))
            check.append(f"{search}: {same if same_vocab(name) else '-'}/{n}, {tokens:.1f}")
        row += [f"{entry[s]['bleu']:.2f}" for s in searches.values()] if bleu else []
        rows.append(row + tail)
        checks.append(f"  {name:<20} " + "; ".join(check))
    lines = harness.table(["system", *head], rows)
    lines += ["", f"outputs (of {n} sentences): same ids as {ours}; tokens per sentence"]
    return lines + checks, report
