#!/usr/bin/env python
"""How the data path grows with the corpus: seconds per stage, peak memory, cache size.

    python -m benchmarks.bench_data --corpus CORPUS_DIR \\
        --sizes 30000 300000 1000000 4500000 --work WORK_DIR
    python -m benchmarks.bench_data --corpus CORPUS_DIR --sizes 1000000 \\
        --work WORK_DIR --train-start     # train.py start -> first update, +/- prepare

Corpora of each size are built from a real one (default: Tatoeba en-de, 166k pairs) by sampling
pairs with replacement and joining half of them with another random pair, so SentencePiece and
the caches see varied text rather than 27 copies of the same lines (built once under --work,
not timed). Each size then runs `train.py`'s data stages in a fresh process
with an empty cache (the `experiment` and any `--override`s decide the settings; default the
Tatoeba experiment: 8k joint SentencePiece, `data.num_proc=2`) and reports the seconds of each
stage and of the first training batch, the peak RSS of the main process and of its largest
worker, and the cache size on disk. Output: one Markdown table, plus JSON lines with --json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


STAGES = ("load", "filter", "sentencepiece", "encode", "first_batch")


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def side(corpus: Path, split: str, lang: str) -> Path:
    plain = corpus / f"{split}.{lang}"
    return plain if plain.exists() else corpus / f"{split}.{lang}.gz"


def build_corpus(source: Path, out: Path, size: int, langs: tuple[str, str], seed: int) -> Path:
    """`size` training pairs drawn from `source` (valid/test copied as they are)."""
    if (out / "DONE").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    src, tgt = (read_lines(side(source, "train", lang)) for lang in langs)
    rng, n = random.Random(seed), len(src)
    with open(out / f"train.{langs[0]}", "w") as fs, open(out / f"train.{langs[1]}", "w") as ft:
        for _ in range(size):
            i = rng.randrange(n)
            if rng.random() < 0.5:
                fs.write(src[i] + "\n")
                ft.write(tgt[i] + "\n")
            else:  # two pairs as one: a new sentence pair, still aligned (n * n of them)
                j = rng.randrange(n)
                fs.write(f"{src[i]} {src[j]}\n")
                ft.write(f"{tgt[i]} {tgt[j]}\n")
    for split in ("valid", "test"):
        for lang in langs:
            shutil.copy(side(source, split, lang), out / side(source, split, lang).name)
    (out / "DONE").write_text("")
    return out


def measure(overrides: list[str]) -> dict:
    """The data stages of `train.py` and its first batch, in this process."""
    import torch

    from attnmt.cli.prepare_data import compose_config, prepare
    from attnmt.training import build
    from attnmt.training.distributed import DistContext

    cfg = compose_config(overrides)
    peak_after: dict[str, float] = {}  # the main process's peak RSS at the end of each stage
    stage_clock = build._timed

    @contextmanager
    def timed_with_rss(seconds: dict[str, float], stage: str) -> Iterator[None]:
        with stage_clock(seconds, stage):
            yield
        peak_after.setdefault(stage, _peak_rss_mib())  # the train split's pass

    build._timed = timed_with_rss  # the stages of train.py, also noting memory
    started = time.perf_counter()
    data, seconds = prepare(cfg)
    t0 = time.perf_counter()
    batches = build.train_batches(data, cfg, DistContext(0, 1, torch.device("cpu")))
    next(iter(batches.epoch(0, 0)))
    seconds["first_batch"] = time.perf_counter() - t0
    peak_after["first_batch"] = _peak_rss_mib()
    return {
        "pairs": len(data.train),
        "seconds": seconds,
        "total": time.perf_counter() - started,
        "rss_mib": _peak_rss_mib(),
        "rss_mib_after": peak_after,
        "worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def until_first_update(cmd: list[str], timeout: float = 3600) -> float:
    """Seconds from starting `cmd` (a train.py run) until it logs its first update; then
    kills it (the rest of the run is not what is measured)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for raw in proc.stdout:
            if b"first update done" in raw:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                break
        raise RuntimeError(f"no first update from {' '.join(cmd)}")
    finally:
        proc.kill()
        proc.wait()


def train_start(corpus: Path, work: Path, overrides: list[str]) -> dict:
    """train.py start -> first update, on an empty cache and after prepare_data.py."""
    py, result = sys.executable, {}
    for label in ("without_prepare", "after_prepare"):
        cache = work / f"cache_{label}"
        shutil.rmtree(cache, ignore_errors=True)
        args = [*overrides, f"data.dir={corpus}", f"data.cache_dir={cache}"]
        if label == "after_prepare":
            t0 = time.perf_counter()
            subprocess.run([py, str(ROOT / "scripts" / "prepare_data.py"), *args], check=True)
            result["prepare_data_s"] = time.perf_counter() - t0
        run = ["trainer.max_steps=100000", f"hydra.run.dir={work / ('run_' + label)}"]
        shutil.rmtree(work / f"run_{label}", ignore_errors=True)
        result[label + "_s"] = until_first_update([py, str(ROOT / "train.py"), *args, *run])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared/data/tatoeba_en_de")
    parser.add_argument("--langs", nargs=2, default=["en", "de"], metavar=("SRC", "TGT"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[30_000, 300_000, 1_000_000])
    parser.add_argument("--work", type=Path, required=True, help="corpora and caches go here")
    parser.add_argument("--experiment", default="tatoeba_en_de")
    parser.add_argument("--override", action="append", default=[], help="a Hydra override")
    parser.add_argument("--train-start", action="store_true", help="see the usage above")
    parser.add_argument("--json", action="store_true", help="also print one JSON line a size")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # internal: child process
    args = parser.parse_args()
    overrides = [f"experiment={args.experiment}", *args.override]
    overrides += [f"data.src_lang={args.langs[0]}", f"data.tgt_lang={args.langs[1]}"]

    if args.one:  # the child: one size, fresh process, fresh cache
        cache = args.one.parent / f"{args.one.name}.cache"
        shutil.rmtree(cache, ignore_errors=True)
        row = measure([*overrides, f"data.dir={args.one}", f"data.cache_dir={cache}"])
        from attnmt.cli.prepare_data import du_mib

        row["cache_mib"] = du_mib(cache)
        print("RESULT " + json.dumps(row), flush=True)
        return 0

    rows = []
    for size in args.sizes:
        corpus = build_corpus(args.corpus, args.work / f"pairs_{size}", size, args.langs, size)
        if args.train_start:
            row = {"size": size, **train_start(corpus, args.work, overrides)}
            print(json.dumps(row), flush=True)
            continue
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.bench_data",
            "--one",
            str(corpus),
            "--work",
            str(args.work),
        ]
        cmd += [f"--experiment={args.experiment}", "--langs", *args.langs]
        cmd += [f"--override={o}" for o in args.override]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode or not lines:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        row = {"size": size, **json.loads(lines[0].removeprefix("RESULT "))}
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    if rows:
        print_table(rows)
    return 0


def print_table(rows: list[dict]) -> None:
    head = ["pairs", "kept", *STAGES, "total s", "s / 1M pairs", "peak RSS MiB", "worker MiB"]
    print("| " + " | ".join([*head, "cache MiB"]) + " |")
    print("|" + "---:|" * (len(head) + 1))
    for r in rows:
        cells = [f"{r['size']:,}", f"{r['pairs']:,}"]
        cells += [f"{r['seconds'].get(s, 0.0):.1f}" for s in STAGES]
        cells += [f"{r['total']:.1f}", f"{r['total'] / r['size'] * 1e6:.0f}"]
        cells += [f"{r['rss_mib']:.0f}", f"{r['worker_rss_mib']:.0f}", f"{r['cache_mib']:.0f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
