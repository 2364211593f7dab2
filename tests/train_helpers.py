"""Shared helpers for training tests: the real Hydra config shrunk to the toy corpus, the
objects `fit()` builds, and `train.py` / `torchrun` command lines."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import attnmt.training.config  # noqa: F401  (registers the decoding schema with Hydra)
from attnmt.training import build, distributed
from attnmt.training.config import Configs
from attnmt.training.loop import _Window, train_step
from attnmt.training.run import Learner
from attnmt.training.state import Trainee, seed_everything

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TOY = Path(__file__).parent / "fixtures" / "toy"
TOY_ARGS = (
    "debug=fast",
    f"data.dir={TOY}",
    "data.src_lang=de",
    "data.tgt_lang=en",
    "data.test_splits=[test]",
    "logger=none",
)


def toy_cfg(tmp: Path, *overrides: str) -> DictConfig:
    """`train.yaml` + debug=fast on the 40-pair toy corpus (de->en), caches under `tmp`."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(
            "train",
            overrides=[
                *TOY_ARGS,
                "data.hub_name=null",
                f"data.cache_dir={tmp / 'cache'}",
                *overrides,
            ],
        )


@dataclass
class Toy:
    """What `training.loop.train` builds, for tests that drive single updates."""

    cfg: Configs
    ctx: distributed.DistContext
    data: build.Data
    trainee: Trainee

    def update(self, batches: list, window: _Window | None = None) -> float:
        """One `train_step` on the plain model, as `fit` runs it in one process; returns the
        gradient norm (read back here, not by the update). `window` carries the skip counts
        from update to update."""
        learner = Learner(self.cfg, self.ctx, self.trainee, self.trainee.model)
        window = window or _Window(self.ctx.device)
        train_step(learner, batches, window)
        self.trainee.state.step += 1
        return float(window.grad_norm)

    def use_sgd(self) -> Toy:
        self.trainee.optimizer = torch.optim.SGD(self.trainee.model.parameters(), lr=1.0)
        return self


def toy(tmp: Path, *overrides: str, run: str = "run") -> Toy:
    cfg = Configs.from_hydra(toy_cfg(tmp, *overrides))
    ctx = distributed.setup("cpu")
    seed_everything(cfg.trainer.seed)
    data = build.load_data(cfg, tmp / run)
    return Toy(cfg, ctx, data, build.build_trainee(cfg, data.tokenizer, ctx.device))


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_cmd(run_dir: Path | None, *overrides: str, cache: Path | None = None) -> list[str]:
    """`python train.py` on the toy corpus; run_dir None leaves the run dir to Hydra (or to
    torchrun's default), and then `cache` must be given."""
    cache = cache or run_dir.parent / "cache"
    cmd = [sys.executable, str(ROOT / "train.py"), *TOY_ARGS, f"data.cache_dir={cache}", *overrides]
    return cmd + ([f"hydra.run.dir={run_dir}"] if run_dir else [])


def run_train(run_dir: Path, *overrides: str, env: dict | None = None, timeout: float = 180):
    """Run `train_cmd(run_dir, *overrides)` to the end; returns the CompletedProcess (text)."""
    return subprocess.run(
        train_cmd(run_dir, *overrides),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def torchrun_cmd(
    nproc: int,
    run_dir: Path | None,
    *overrides: str,
    cache: Path | None = None,
    launcher: tuple[str, ...] = ("--standalone",),
    script: str = "",
) -> list[str]:
    """`torchrun <launcher> --nproc_per_node=N train.py ...` (or a test wrapper `script`)."""
    cmd = train_cmd(run_dir, *overrides, cache=cache)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher,
        f"--nproc_per_node={nproc}",
        script or cmd[1],
        *cmd[2:],
    ]
