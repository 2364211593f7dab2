"""Shared helpers for training tests: compose the real Hydra config, shrunk to the toy corpus."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TOY = Path(__file__).parent / "fixtures" / "toy"


def toy_cfg(tmp: Path, *overrides: str) -> DictConfig:
    """`train.yaml` + debug=fast on the 40-pair toy corpus (de->en), caches under `tmp`."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(
            "train",
            overrides=[
                "debug=fast",
                f"data.dir={TOY}",
                "data.hub_name=null",
                "data.src_lang=de",
                "data.tgt_lang=en",
                "data.test_splits=[test]",
                f"data.cache_dir={tmp / 'cache'}",
                "logger=none",
                *overrides,
            ],
        )
