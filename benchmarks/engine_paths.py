"""What each of the engine's speed paths earns on real sentences: the engine against itself with
one path switched off, and against the plain model, in one process, timed interleaved.

    python -m benchmarks.engine_paths -c RUN_DIR --src test2016.en --repeats 5

Variants (each a full `Translator` search of `--src`, greedy and beam 5):
- engine: `Engine(model)`, what `translate.py` runs;
- no packing: `Engine(model, pack=False)` (`F.linear` instead of oneDNN's packed matmuls);
- SDPA for short sources: the encoder takes `F.scaled_dot_product_attention` at every length;
- concatenating cache: a cache that grows by `torch.cat` (the model's `KVCache`) instead of
  preallocated buffers written in place;
- model's decoder step: the model's `DecoderLayer.forward` for the one-token step (compare with
  "no packing", which has the same plain linear layers);
- no continuous batching: greedy search batch by batch (greedy only);
- model: the plain `Transformer` (every path off).
Each repeat runs every variant once, in a rotating order; the table gives the median
sentences/s, and each variant's speed relative to the engine (median and range of the
per-repeat ratios of seconds, variant over engine; > 1: the engine is faster). It also says whether the variant's ids equal
the engine's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from checkpoint import load_for_inference
from common.files import read_lines
from decoding import SearchConfig, Translator
from engine import Engine
from engine import engine as engine_module
from model import KVCache


class _CatCache(KVCache):
    """The model's cache with the fields the engine's step reads: grows by `torch.cat`."""

    def __init__(self) -> None:
        super().__init__()
        self.cross_bias: Tensor | None = None
        self.self_bias: Tensor | None = None

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        super().reorder(rows, sentences)
        if self.cross_bias is not None:
            sentences = rows if sentences is None else sentences
            self.cross_bias = self.cross_bias.index_select(0, sentences)


class _CatCacheEngine(Engine):
    def new_caches(self) -> list:
        return [_CatCache() for _ in self.decoder_linears]


class _ModelStepEngine(Engine):
    """The engine's encoder, the model's decoder step (its layers, its cache)."""

    def decode(self, tgt_ids, memory, src_mask, caches=None, offset=0):  # noqa: ANN001, ANN201
        return self.model.decode(tgt_ids, memory, src_mask, caches, offset)

    def new_caches(self) -> list:
        return self.model.new_caches()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _sdpa_everywhere() -> Iterator[None]:
    saved = engine_module.SHORT_SOURCE
    engine_module.SHORT_SOURCE = 0
    try:
        yield
    finally:
        engine_module.SHORT_SOURCE = saved


def variants(model: nn.Module) -> dict[str, tuple[nn.Module, Callable]]:
    """name -> (what search runs, the context to run it in)."""
    no_continuous = Engine(model)
    no_continuous.continuous_batching = False
    return {
        "engine": (Engine(model), _nothing),
        "no packing": (Engine(model, pack=False), _nothing),
        "SDPA for short sources": (Engine(model), _sdpa_everywhere),
        "concatenating cache": (_CatCacheEngine(model), _nothing),
        "model's decoder step": (_ModelStepEngine(model, pack=False), _nothing),
        "no continuous batching": (no_continuous, _nothing),
        "model": (model, _nothing),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--checkpoint", required=True, help="run dir or .pt file")
    parser.add_argument("--src", required=True, help="source sentences, one a line")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--beams", default="1,5", help="comma-separated beam sizes")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_for_inference(args.checkpoint, "cpu")
    lines = read_lines(args.src)
    table = variants(model)
    print(f"{len(lines)} sentences, {torch.get_num_threads()} threads, {args.repeats} repeats")
    for beam in (int(b) for b in args.beams.split(",")):
        cfg = SearchConfig(beam_size=beam)
        names = [n for n in table if beam == 1 or n != "no continuous batching"]
        seconds: dict[str, list[float]] = {n: [] for n in names}
        ids: dict[str, list] = {}
        for name in names:  # warm-up, and the ids
            search, context = table[name]
            with context():
                ids[name] = [
                    n[0].tokens for n in Translator(search, tokenizer, cfg).translate_nbest(lines)
                ]
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                search, context = table[name]
                translator = Translator(search, tokenizer, cfg)
                with context():
                    start = time.perf_counter()
                    translator.translate_nbest(lines)
                    seconds[name].append(time.perf_counter() - start)
        print(f"\nbeam {beam}: {'variant':<24} {'sent/s':>8}  {'engine/variant':>20}  ids")
        for name in names:
            ratios = [v / e for v, e in zip(seconds[name], seconds["engine"], strict=True)]
            rate = len(lines) / statistics.median(seconds[name])
            spread = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            same = "same" if ids[name] == ids["engine"] else "differ"
            print(f"beam {beam}: {name:<24} {rate:8.1f}  {spread:>20}  {same}")


if __name__ == "__main__":
    main()
