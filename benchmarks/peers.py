"""Ours and its peers decoding the same real sentences, timed: the one implementation behind
`benchmarks/benchmark.py --run` and `benchmarks/export_speed.py`.

A system is a function (source ids without specials, `SearchConfig`) -> the best target ids of
each sentence, without BOS/EOS, in input order:

* ours (`ours_system`): `Translator.search_ids`, the search `translate.py` runs (length-sorted
  batches of `cfg.batch_size`, each sentence its own budget `int(max_len_a * src_len +
  max_len_b)`), on a model loaded as `translate.py` loads it (`engine.load_engine`,
  also with `quantize="int8"`), with `inter_threads` batches at once as `--inter-threads`;
* transformers (`transformers_system`): `MarianMTModel.generate` on our weights
  (`exporting.hf.to_marian`, sdpa attention);
* CTranslate2 (`ct2_system`): a `ctranslate2.Translator` on a folder written by
  `exporting.ct2.export_ct2` (float32 or int8), searching with `ct2_options`, one batch
  at a time or `inter_threads` at once (asynchronous `translate_batch` calls).

The peers get the batches ours searches (`length_sorted_batches`: the same sentences together,
longest first), one `generate` / `translate_batch` call per batch with the largest budget of
its sentences (both take one limit per call; a trained model's sentences end well before it).
All systems start from the same ids and return ids: SentencePiece is outside the timings.

Each system may run in a process of its own (`Isolated`): `benchmarks/benchmark.py --run` and
`benchmarks/export_speed.py` do so, because in one process CTranslate2 slows torch down
(see `Isolated`). Only one process computes at a time; the others wait on a pipe.

`compare` times every (system, search) on all sentences in one call each, `repeats` times,
interleaved with a rotating order so that machine noise hits every cell alike, after an
untimed warm-up call on the first batch. `Spread` is a median with its min-max range; the
ratio ours / peer is taken per repeat (the same round of the interleaving) and summarised
the same way.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnmt.common.errors import UserError
from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.translator import Translator, length_sorted_batches
from attnmt.exporting.ct2 import ct2_batch_options, ct2_target_ids
from attnmt.exporting.hf import hf_generate, to_marian
from attnmt.exporting.shared import budgets, require

Search = Callable[[list[list[int]], SearchConfig], list[list[int]]]
BatchSearch = Callable[[list[list[int]], SearchConfig, int], Any]  # ids, or a wait for them


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def describe_kind(kind: str) -> str:
    """What a `CPU_KINDS` entry sets, in words."""
    env = CPU_KINDS[kind]
    if not env["ours"] and not env["ctranslate2"]:
        return "every instruction set of this CPU"
    words = [" ".join(f"{k}={v}" for k, v in env[who]) for who in ("ours", "ctranslate2")]
    return f"ours under {words[0]}, CTranslate2 [{kind}] under {words[1]}"


# ----------------------------------------------------------------------------- systems


def ours_system(model: Any, tokenizer: Tokenizer, inter_threads: int = 1) -> Search:
    """Our search as `translate.py` runs it (`--inter-threads inter_threads`)."""
    translators: dict[str, Translator] = {}  # one per SearchConfig (each keeps its threads)

    def search(src_ids: list[list[int]], cfg: SearchConfig) -> list[list[int]]:
        key = repr(cfg)
        if key not in translators:
            translators[key] = Translator(model, tokenizer, cfg, inter_threads=inter_threads)
        return [nbest[0].tokens for nbest in translators[key].search_ids(src_ids)]

    return search


def batched(tokenizer: Tokenizer, search_batch: BatchSearch, pipelined: bool = False) -> Search:
    """A peer's search over ours' batches: `search_batch(batch, cfg, budget)` per batch, with
    the batch's largest budget; [] for an empty source (ours never decodes one). `pipelined`:
    `search_batch` only submits its batch and returns a function that waits for the ids; every
    batch is submitted before the first wait."""
    special = tokenizer.special

    def search(src_ids: list[list[int]], cfg: SearchConfig) -> list[list[int]]:
        limits = budgets(src_ids, special, cfg)
        results: list[list[int]] = [[] for _ in src_ids]
        chunks = length_sorted_batches(src_ids, cfg.batch_size)
        outs = [
            search_batch([src_ids[i] for i in chunk], cfg, max(limits[i] for i in chunk))
            for chunk in chunks
        ]
        for chunk, out in zip(chunks, outs, strict=True):
            for i, ids in zip(chunk, out() if pipelined else out, strict=True):
                results[i] = ids
        return results

    return search


def transformers_system(model: Any, tokenizer: Tokenizer) -> Search:
    """`MarianMTModel.generate` on our weights. Raises `ExportError` (a `UserError`) when
    transformers is missing or the model is pre-norm."""
    marian = to_marian(model, tokenizer.special, attn_implementation="sdpa")
    special = tokenizer.special
    return batched(
        tokenizer,
        lambda batch, cfg, budget: hf_generate(marian, special, batch, cfg, budget),
    )


def ct2_system(
    folder: Path, tokenizer: Tokenizer, threads: int = 0, inter_threads: int = 1
) -> Search:
    """A `ctranslate2.Translator` on an `export_ct2` folder searching `inter_threads` batches
    at once (1: one at a time) on `threads // inter_threads` intra-op threads each (`threads`
    0: CTranslate2's default). Every batch is submitted with `asynchronous=True`, then the
    results are collected in order; with one worker CTranslate2 runs them one after the
    other."""
    ctranslate2 = require("ctranslate2")
    intra = max(1, threads // inter_threads) if threads else 0
    options = {"intra_threads": intra} if intra else {}
    translator = ctranslate2.Translator(
        str(folder), device="cpu", inter_threads=inter_threads, **options
    )
    target_ids = ct2_target_ids(tokenizer)

    def submit(batch: list[list[int]], cfg: SearchConfig, budget: int) -> Callable:
        options = ct2_batch_options(tokenizer, cfg, len(batch), budget, asynchronous=True)
        pending = translator.translate_batch([tokenizer.src_pieces(i) for i in batch], **options)
        return lambda: [[target_ids[p] for p in r.result().hypotheses[0]] for r in pending]

    return batched(tokenizer, submit, pipelined=True)


# ------------------------------------------------------------- one process per system


@dataclass(frozen=True)
class Isolated:
    """A system built and run in a process of its own: `build(*args)` -> `Search`, called in
    that process (`build` a module-level function, `args` picklable), with `threads` torch
    threads (0: torch's default).

    Why: CTranslate2's wheel resolves its OpenMP calls to the libgomp that torch has already
    loaded (`LD_DEBUG=bindings`), so in one process both share one OpenMP runtime. Once
    CTranslate2 has made its own thread team, that runtime manages more threads than there are
    CPUs and throttles spin-waiting (libgomp's throttled spin count), so torch's worker threads
    sleep between parallel regions. A check run once (2 threads, greedy, 512 test2016
    sentences; its script, `benchmarks/check_peer_interference.py`, removed after c0a6333):
    ours 296-343 sent/s before a CTranslate2 call in the same process, 192-214 after it
    (0.56-0.72x), for as long as the process lives, with
    torch's second thread busy about half of each call instead of all of it;
    `OMP_WAIT_POLICY=PASSIVE` alone gives the same slowdown. Users run one system per
    process, so the benchmark does too.
    """

    build: Callable[..., Search]
    args: tuple = ()
    threads: int = 0
    env: tuple[tuple[str, str], ...] = ()  # environment variables of the worker process only


# CPU kinds a benchmark can run on one machine: the environment that caps a process to a
# kind's instruction sets (read when torch, oneDNN, MKL and CTranslate2 start, so a worker
# process gets them before it imports anything). "native" runs what the CPU has.
CPU_KINDS: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "native": {"ours": (), "ctranslate2": ()},
    "avx2": {  # an AVX2-only (Zen 3-class) CPU: no AVX-512, VNNI, BF16 or AMX
        "ours": (
            ("ATEN_CPU_CAPABILITY", "avx2"),
            ("ONEDNN_MAX_CPU_ISA", "AVX2"),
            ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
        ),
        "ctranslate2": (("CT2_FORCE_CPU_ISA", "AVX2"),),
    },
}


def ours_from_checkpoint(
    path: str, quantize: str = "none", inter_threads: int = 1, keep_memory: bool = True
) -> Search:
    """`ours_system` on a checkpoint loaded as `translate.py` loads it, in a process set up
    as `translate.py` sets up its own on the CPU (`common.memory.keep_freed_memory`, unless
    `keep_memory=False`): call it in a worker (`Isolated`), since that setting is
    process-wide."""
    from attnmt.common.memory import keep_freed_memory
    from attnmt.engine import load_engine

    if keep_memory:
        keep_freed_memory()
    model, tokenizer = load_engine([path], "cpu", quantize)
    return ours_system(model, tokenizer, inter_threads)


def transformers_from_checkpoint(path: str) -> Search:
    """`transformers_system` on a checkpoint's weights."""
    from attnmt.checkpoint import load_for_inference

    model, tokenizer, _ = load_for_inference(path, "cpu")
    return transformers_system(model, tokenizer)


def ct2_from_folder(
    folder: str, checkpoint: str, threads: int = 0, inter_threads: int = 1
) -> Search:
    """`ct2_system` on an `export_ct2` folder, with the tokenizer stored in `checkpoint`.

    Runs no torch op (no model is built): in a process where torch has run a parallel op,
    CTranslate2 with 2 intra-op threads ran at 151-192 sent/s greedy instead of 314-341 on
    512 test2016 sentences (`import torch` alone: no change; the machine of the figure under
    `Isolated`), the other side of the shared OpenMP runtime described under `Isolated`."""
    from attnmt.checkpoint import load_checkpoint, stored_tokenizer

    tokenizer = stored_tokenizer(load_checkpoint(checkpoint), checkpoint)
    return ct2_system(Path(folder), tokenizer, threads, inter_threads)


def _serve(conn: Any, spec: Isolated, src_ids: list[list[int]]) -> None:
    """The worker process: build the system, then run searches on request until told to stop."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    try:
        search = spec.build(*spec.args)
    except Exception as e:  # noqa: BLE001  (reported to the parent, which raises it)
        conn.send(("error", str(e) or type(e).__name__))
        return
    conn.send(("ready", None))
    while (request := conn.recv()) is not None:
        cfg, n = request
        with torch.inference_mode():
            start = time.perf_counter()
            ids = search(src_ids[:n], cfg)
            seconds = time.perf_counter() - start
        conn.send(("done", (seconds, ids)))


class _Worker:
    """The parent's handle on an `Isolated` system's process."""

    def __init__(self, spec: Isolated, src_ids: list[list[int]]) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no state shared
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, spec, src_ids), daemon=True)
        saved = {name: os.environ.get(name) for name, _ in spec.env}
        os.environ.update(spec.env)  # the child copies the environment when it starts
        try:
            self.process.start()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        child.close()
        self._receive("ready")

    def _receive(self, expected: str) -> Any:
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            raise UserError(
                f"a benchmark worker process died (exit code {self.process.exitcode})"
            ) from None
        if kind == "error":
            self.close()
            raise UserError(payload)
        assert kind == expected, kind
        return payload

    def search(self, cfg: SearchConfig, n: int) -> tuple[float, list[list[int]]]:
        """Seconds (timed in the worker, around the search call) and the output ids."""
        self.conn.send((cfg, n))
        return self._receive("done")

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()


# ------------------------------------------------------------------------------ timing


def interleaved(
    runs: dict[Any, Callable[[], Any]], repeats: int, sync: Callable[[], None] | None = None
) -> dict[Any, list[float]]:
    """Seconds per call of each run, repeats interleaved (ABC BCA CAB ...) so that drifts in
    machine speed hit every run; rotating the order also spreads cache/allocator effects.
    `sync` (e.g. a CUDA synchronize) is called before and after each timed call. A run that
    returns a float reports its own seconds (an `Isolated` system, timed in its process)."""
    times: dict[Any, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if sync:
                sync()
            start = time.perf_counter()
            result = runs[name]()
            if sync:
                sync()
            own = isinstance(result, float)  # a run timed in its own process reports it
            times[name].append(result if own else time.perf_counter() - start)
    return times


_UNITS = {"ms": (1e3, "7.2f"), "us": (1e6, "8.0f")}


@dataclass(frozen=True)
class OpTable:
    """How `compare_ops` times and prints: the unit ("ms" or "us"), untimed calls of each
    implementation first, and the width of the op name column."""

    unit: str = "ms"
    warmup: int = 1
    width: int = 34


def compare_ops(name: str, ours: Callable, theirs: Callable, repeats: int, table: OpTable) -> None:
    """Print the median time per call of two implementations of one op, timed interleaved
    after `table.warmup` calls of each, and theirs / ours (`benchmarks/bench_train_ops.py`,
    `benchmarks/bench_decode_ops.py`)."""
    for _ in range(table.warmup):
        ours(), theirs()
    times = interleaved({"ours": ours, "torch": theirs}, repeats)
    unit, width = table.unit, table.width
    scale, spec = _UNITS[unit]
    a, b = (statistics.median(times[key]) * scale for key in ("ours", "torch"))
    print(f"{name:{width}s} ours {a:{spec}} {unit}   torch {b:{spec}} {unit}   {b / a:5.2f}x")


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
    systems: dict[str, Search | Isolated],
    src_ids: list[list[int]],
    cfgs: Sequence[SearchConfig],
    repeats: int,
) -> dict[tuple[str, int], Cell]:
    """Time every system with every search config on all `src_ids` (see the module doc);
    keys (system name, beam size). `Isolated` systems run in their own processes, started
    here and stopped on return.

    Raises:
        UserError: an `Isolated` system failed to build (its message) or its process died.
    """
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    runs: dict[tuple[str, int], Callable[[], Any]] = {}
    workers: list[_Worker] = []
    try:
        for name, system in systems.items():
            if isinstance(system, Isolated):
                workers.append(_Worker(system, src_ids))
                search = _remote_search(workers[-1], len(src_ids))
            else:
                search = _local_search(system, src_ids)
            for cfg in cfgs:
                key = (name, cfg.beam_size)
                search(cfg, cfg.batch_size)  # warm-up: one batch, untimed

                def run(search: Any = search, cfg: SearchConfig = cfg, key: Any = key) -> Any:
                    seconds, outputs[key] = search(cfg, len(src_ids))
                    return seconds

                runs[key] = run
        times = interleaved(runs, repeats)
    finally:
        for worker in workers:
            worker.close()
    return {key: Cell(times[key], outputs[key]) for key in runs}


def _local_search(search: Search, src_ids: list[list[int]]) -> Callable:
    """(cfg, n) -> (None: timed by the caller, the ids of the first n sentences)."""
    return lambda cfg, n: (None, search(src_ids[:n], cfg))


def _remote_search(worker: _Worker, n_all: int) -> Callable:
    """(cfg, n) -> (seconds timed in the worker, ids)."""
    return lambda cfg, n: worker.search(cfg, min(n, n_all))


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
