#!/usr/bin/env python
"""Prepare a corpus once, before training (what `fairseq-preprocess` / `onmt_build_vocab` do).

    python scripts/prepare_data.py experiment=tatoeba_en_de data.dir=CORPUS_DIR
    python train.py experiment=tatoeba_en_de data.dir=CORPUS_DIR

Takes the same Hydra overrides as `train.py` and runs its data stages: load the corpus into
Arrow, filter the training pairs, train SentencePiece (or find the model trained earlier with
the same corpus and settings), encode every split. Everything lands in the data cache
(`data.cache_dir`, else `$ATTNMT_CACHE`, else `~/.cache/attnmt`), keyed by content and settings,
so a later `train.py` with the same `data.*` and `tokenizer.*` settings, on one rank or many,
finds it and starts training in seconds. Run it on a filesystem every node sees when training
on several nodes. Overrides of other groups (model, trainer, ...) are accepted and ignored.
"""

from __future__ import annotations

import logging
import resource
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from attnmt.cli.args import program_name
from attnmt.common.errors import UserError
from attnmt.data.dataset import cache_root
from attnmt.training.build import Data, load_data
from attnmt.training.config import Configs

PROG = program_name("prepare_data.py")
CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides: list[str]) -> Configs:
    """`conf/train.yaml` with `train.py`-style overrides (`hydra.*` ones are dropped)."""
    overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra.")]
    try:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            return Configs.from_hydra(compose("train", overrides=overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise UserError(f"bad override: {str(e).splitlines()[0]}") from None


def prepare(cfg: Configs) -> tuple[Data, dict[str, float]]:
    """Run the data stages of `train.py`; returns the data and seconds per stage."""
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:  # the tokenizer's copy for a run dir
        data = load_data(cfg, Path(scratch), seconds)
    return data, seconds


def du_mib(path: Path) -> float:
    """Size of the files under `path`, in MiB (0 if it does not exist)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        cfg = compose_config(argv)
        started = time.perf_counter()
        data, seconds = prepare(cfg)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    total = time.perf_counter() - started
    cache = cache_root(cfg.data)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        f"prepared in {total:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in seconds.items())}): "
        f"train {len(data.train)} pairs, valid {len(data.valid)}, "
        f"test splits: {', '.join(f'{k} {len(v)}' for k, v in data.test.items()) or 'none'}"
    )
    print(
        f"cache {cache} ({du_mib(cache):.0f} MiB); peak RSS {peak:.0f} MiB "
        f"(largest worker {workers:.0f} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
