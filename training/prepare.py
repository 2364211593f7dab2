"""Preparing a corpus once, before training (what `scripts/prepare_data.py` runs): `train.py`'s
data stages on a config composed from `train.py`-style overrides, everything landing in the
data cache, where a later `train.py` with the same `data.*` and `tokenizer.*` settings finds
it."""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from attnmt.common.errors import UserError
from attnmt.data.dataset import cache_root
from attnmt.training.build import Data, load_data
from attnmt.training.config import Configs

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


def prepare_corpus(overrides: list[str]) -> list[str]:
    """Prepare the corpus the overrides describe; two lines of what it took: the seconds per
    stage and the splits' sizes, then the cache's size and the peak memory."""
    cfg = compose_config(overrides)
    started = time.perf_counter()
    data, seconds = prepare(cfg)
    total = time.perf_counter() - started
    cache = cache_root(cfg.data)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
    tests = ", ".join(f"{k} {len(v)}" for k, v in data.test.items()) or "none"
    return [
        f"prepared in {total:.1f} s ({stages}): train {len(data.train)} pairs, valid "
        f"{len(data.valid)}, test splits: {tests}",
        f"cache {cache} ({du_mib(cache):.0f} MiB); peak RSS {peak:.0f} MiB "
        f"(largest worker {workers:.0f} MiB)",
    ]
