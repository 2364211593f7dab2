"""What the engine's speed paths earn on real sentences: the engine against itself with a path
switched off, in one process, timed interleaved.

    python -m benchmarks.engine_paths -c RUN_DIR --src test2016.en --repeats 5

Variants (each a full `Translator` search of `--src`, greedy and beam 5):
- engine: `Engine(model)`, what `translate.py` runs (float32: greedy search with continuous
  batching; on AMD CPUs the output layer packed, and the decoder's layers too from 512 wide);
- no continuous batching: greedy search batch by batch (greedy only);
- unpacked: `Engine(model, pack=False)`, what Intel CPUs run: `F.linear` (MKL's sgemm) and the
  model's `DecoderLayer.forward` for beam search;
- output layer packed only: unpacked, but the logits on oneDNN's pre-packed weight;
- all packed: `Engine(model, pack=True)`, the decoder's layers packed too, every search on the
  engine's one-token step (`Engine.step`, what continuous batching and int8 run);
- one-token step, unpacked: every search on `Engine.step`, on the model's float layers.
The process keeps freed memory for reuse, as `translate.py` does on the CPU (`common.memory`).
Each repeat runs every variant once, in a rotating order; the table gives the median
sentences/s, and each variant's time relative to the engine's (median and range of the
per-repeat ratios of seconds, variant over engine; > 1: the engine is faster). It also says
whether the variant's ids equal the engine's.
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch
from torch import nn

from attnmt.checkpoint import load_for_inference
from attnmt.common.files import read_lines
from attnmt.common.memory import keep_freed_memory
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine
from attnmt.engine.cache import StepKVCache
from attnmt.engine.engine import PackedLinear
from benchmarks import peers


class StepEngine(Engine):
    """Every search on the engine's one-token step, on the model's float layers."""

    def decode(self, tgt_ids, memory, src_mask, caches=None, offset=0):  # noqa: ANN001, ANN201
        if caches is None:
            return self.model.decode(tgt_ids, memory, src_mask)
        return self.step(tgt_ids, memory, src_mask, caches, offset)

    def new_caches(self) -> list[StepKVCache]:
        return [StepKVCache() for _ in self.decoder_linears]


def variants(model: nn.Module) -> dict[str, nn.Module]:
    """name -> what search runs."""
    no_continuous = Engine(model)
    no_continuous.continuous_batching = False
    output_only = Engine(model, pack=False)
    output_only.generator = PackedLinear(model.generator)
    return {
        "engine": Engine(model),
        "no continuous batching": no_continuous,
        "unpacked": Engine(model, pack=False),
        "output layer packed only": output_only,
        "all packed": Engine(model, pack=True),
        "one-token step, unpacked": StepEngine(model, pack=False),
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
    keep_freed_memory()  # as translate.py does on the CPU: freed blocks reused, no page faults
    model, tokenizer, _ = load_for_inference(args.checkpoint, "cpu")
    lines = read_lines(args.src)
    table = variants(model)
    print(f"{len(lines)} sentences, {torch.get_num_threads()} threads, {args.repeats} repeats")
    for beam in (int(b) for b in args.beams.split(",")):
        cfg = SearchConfig(beam_size=beam)
        names = [n for n in table if beam == 1 or n != "no continuous batching"]
        runs = {
            n: partial(Translator(table[n], tokenizer, cfg).translate_nbest, lines) for n in names
        }
        ids = {n: [b[0].tokens for b in run()] for n, run in runs.items()}  # warm-up, and the ids
        seconds = peers.interleaved(runs, args.repeats)  # every variant once a repeat, rotating
        print(f"\nbeam {beam}: {'variant':<24} {'sent/s':>8}  {'variant/engine time':>20}  ids")
        for name in names:
            rate = len(lines) / statistics.median(seconds[name])
            spread = peers.ratio_spread(seconds["engine"], seconds[name]).format(".3f")
            same = "same" if ids[name] == ids["engine"] else "differ"
            print(f"beam {beam}: {name:<24} {rate:8.1f}  {spread:>20}  {same}")


if __name__ == "__main__":
    main()
