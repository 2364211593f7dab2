"""What a resumed run needs besides the weights: progress, optimizer, loss scale, every rank's
random state; what `checkpoints/last.pt` and `step_<N>.pt` hold (`best.pt` holds what inference
needs), written by `Run.save` and restored by `resume`.

A damaged `last.pt` (truncated, empty, a checksum that does not match) is moved aside and the
run resumes from the newest intact `step_<N>.pt`, which holds the same resume state, or from
`best.pt` if it has one (`resume`).

Resume is exact: a run stopped after update k and restarted equals one that never stopped, bit
for bit on the CPU, also under DDP, as long as the world size is the same.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnmt.checkpoint import (
    CheckpointError,
    CorruptCheckpointError,
    load_checkpoint,
    model_payload,
    step_checkpoints,
)
from attnmt.data.tokenizer import Tokenizer
from attnmt.training import distributed
from attnmt.training.ema import WeightEMA

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """How far training has come: the counters a resume restores; identical on every rank.
    (The holders, innermost first: `Progress` < `Trainee`, what a checkpoint restores <
    `run.Learner`, what one update uses < `run.Run`, which validates, saves and tests.)"""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch, from 0
    batches_done: int = 0  # batches of the current epoch already consumed by each rank
    best_bleu: float = -1.0
    best_step: int = 0
    best_valid: dict[str, float] = field(default_factory=dict)
    bad_evals: int = 0  # validations since BLEU last improved (early stopping)
    nonfinite_streak: int = 0  # updates skipped in a row (loss or gradient norm NaN/inf)
    nonfinite_total: int = 0
    rollbacks: int = 0  # rollbacks to last.pt after a divergence (trainer.on_divergence)
    lr_scale: float = 1.0  # the schedule's lr times this (lowered by each rollback)
    valid_loss: float | None = None  # the last validation's loss (NaN: not a good checkpoint)
    train_seconds: float = 0.0  # in the training loop, validations left out, summed over resumes
    wall_seconds: float = 0.0  # in the training loop, validations included, summed over resumes
    validated_step: int = -1  # the last step validated (a preempted run may stop before one)


@dataclass
class Trainee:
    """The objects that training changes and a checkpoint restores: weights, optimizer, loss
    scale, `Progress` and the weights' average."""

    model: torch.nn.Module  # the plain model (not the DDP or compiled wrapper)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    state: Progress
    ema: WeightEMA | None = None  # the weights' moving average (trainer.ema_decay > 0)

    def inference_weights(self) -> dict[str, torch.Tensor]:
        """What validation scores and checkpoints hold as `model`: the average if there is one."""
        return self.ema.state_dict(self.model) if self.ema else self.model.state_dict()


def checkpoint_payloads(
    trainee: Trainee,
    tokenizer: Tokenizer,
    config: dict,
    rngs: list[dict[str, Any]],
    decoding: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What this run's checkpoints hold: `base`, in every one (the weights to translate with,
    model config, tokenizer, progress, and `decoding`: how the run validates and tests,
    `RunDecoding.as_dict`, the default of translate.py and serve.py), and `last` (`last.pt` and
    `step_<N>.pt`): `base` plus all that `resume` restores (the trained weights if they differ,
    optimizer, loss scale, `rngs`: every rank's random state) and the resolved `config`."""
    state = asdict(trainee.state)
    weights = trainee.inference_weights()
    base = {**model_payload(trainee.model, tokenizer, weights), "train_state": state}
    if decoding is not None:
        base["decoding"] = decoding
    trained = {"train_weights": trainee.model.state_dict()} if trainee.ema else {}
    last = {
        **base,
        **trained,
        "optimizer": trainee.optimizer.state_dict(),
        "scaler": trainee.scaler.state_dict(),
        "rng": rngs,
        "config": config,
    }
    return base, last


RESUME_KEYS = ("optimizer", "scaler", "rng", "train_state")  # what a checkpoint resumes from


def resume(
    trainee: Trainee,
    last: Path,
    ctx: distributed.DistContext,
    check: Callable[[dict[str, Any], int], None] | None = None,
) -> bool:
    """Restore everything from `last` if it exists (every rank reads it); False otherwise.

    A damaged `last` is moved aside (`last.pt.damaged`, never overwritten) and the run
    resumes from the newest intact `step_<N>.pt` beside it, else `best.pt` if it holds resume
    state, with one warning line; if none can, CheckpointError says what each lacks and
    nothing is moved.

    `check(saved_config, saved_ranks)` runs on the checkpoint's config and the number of ranks
    that saved it before anything is restored (it raises to refuse the resume).

    Call before wrapping the model in DDP. Tensors load onto the CPU first: the optimizer moves
    its state next to the parameters itself, except Adam's step counters, which a non-fused
    Adam keeps on the CPU (on the GPU each would cost a host sync per update).
    """
    if not last.is_file():
        return False
    try:
        ckpt, source = load_checkpoint(last, map_location="cpu"), last
    except CorruptCheckpointError as damage:
        ckpt, source = _fall_back(last, damage, ctx)
    # One random state per rank that saved it (older checkpoints: one dict, one rank).
    rngs = ckpt["rng"] if isinstance(ckpt["rng"], list) else [ckpt["rng"]]
    if check is not None:
        check(ckpt.get("config") or {}, len(rngs))
    model = trainee.model
    if ckpt["model_config"] != asdict(model.cfg):
        raise CheckpointError(
            f"{source} was trained with a different model config; resume with the same "
            "config or start a new run dir (hydra.run.dir=...)"
        )
    _restore_learning(trainee, ckpt, source)
    saved = ckpt["train_state"]  # older checkpoints were written at validations only
    trainee.state = Progress(**{"validated_step": saved["step"], **saved})
    if len(rngs) == ctx.world_size:
        set_rng_state(rngs[ctx.rank], ctx.device)
    else:
        log.warning(
            "%s was saved by %d ranks, this run has %d: data order and dropout streams "
            "differ from an uninterrupted run",
            source,
            len(rngs),
            ctx.world_size,
        )
        seed_everything(trainee.state.step * 7919 + ctx.rank)
    if ctx.is_main:
        log.info(
            "resumed from %s at step %d (epoch %d, batch %d; saved by %d rank(s))",
            source,
            trainee.state.step,
            trainee.state.epoch,
            trainee.state.batches_done,
            len(rngs),
        )
    return True


def _fall_back(
    last: Path, damage: CorruptCheckpointError, ctx: distributed.DistContext
) -> tuple[dict[str, Any], Path]:
    """The newest intact checkpoint beside a damaged `last` that can resume the run; `last`
    is then moved aside (rank 0, once every rank has chosen)."""
    folder = last.parent
    lacking: list[str] = []
    for path in [*reversed(step_checkpoints(folder)), folder / "best.pt"]:
        if not path.is_file():
            continue
        try:
            ckpt = load_checkpoint(path, map_location="cpu")
        except CorruptCheckpointError:
            lacking.append(f"{path.name} is damaged too")
            continue
        missing = [key for key in RESUME_KEYS if key not in ckpt]
        if missing:
            lacking.append(f"{path.name} has no {'/'.join(missing)}")
            continue
        distributed.barrier(ctx)  # every rank has read `last` and chosen `path`
        aside = _move_aside(last) if ctx.is_main else last
        log.warning(
            "%s; moved it to %s and resuming from %s (step %d) instead",
            damage,
            aside.name,
            path.name,
            ckpt["train_state"]["step"],
        )
        return ckpt, path
    found = "; ".join(lacking) or "no step_<N>.pt or best.pt beside it"
    raise CheckpointError(
        f"{damage} -- and no other checkpoint can resume the run ({found}); start a new "
        f"run dir, with trainer.init_from={folder / 'best.pt'} if it is intact"
    )


def _move_aside(path: Path) -> Path:
    """Rename `path` to `<name>.damaged` (`.damaged.2`, ... if taken); the new name."""
    aside, n = path.with_name(f"{path.name}.damaged"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged.{n}")
    path.rename(aside)
    return aside


def roll_back(trainee: Trainee, folder: Path) -> tuple[Path, int] | None:
    """Restore the weights, weight average, optimizer and loss scale of the newest good
    checkpoint in `folder` (`last.pt`, else a `step_<N>.pt`: intact, with resume state, and a
    finite validation loss), keeping this run's progress, data position and random state: a
    diverged run going back. Returns the file and its step; None if there is none."""
    for path in [folder / "last.pt", *reversed(step_checkpoints(folder))]:
        if not path.is_file():
            continue
        try:
            ckpt = load_checkpoint(path, map_location="cpu")
        except CorruptCheckpointError:
            continue
        loss = ckpt.get("train_state", {}).get("valid_loss")
        if any(key not in ckpt for key in RESUME_KEYS) or (loss is not None and loss != loss):
            continue
        if loss is not None and abs(loss) == float("inf"):
            continue
        _restore_learning(trainee, ckpt, path)
        return path, ckpt["train_state"]["step"]
    return None


def _restore_learning(trainee: Trainee, ckpt: dict[str, Any], last: Path) -> None:
    """What a checkpoint restores besides progress: weights, EMA, optimizer, loss scale."""
    model = trainee.model
    # With EMA, `model` is the average and `train_weights` what the optimizer trained.
    trained = ckpt.get("train_weights", ckpt["model"])
    model.load_state_dict(trained)
    if trainee.ema is not None:
        trainee.ema.load_state_dict(model, ckpt["model"])
        if "train_weights" not in ckpt:
            log.info("%s has no weight average: EMA starts from its weights", last)
    elif "train_weights" in ckpt:
        log.warning("%s holds a weight average; trainer.ema_decay=0 drops it", last)
    load_optimizer(trainee.optimizer, ckpt["optimizer"], last)
    if trainee.scaler.is_enabled() and not ckpt["scaler"]:
        log.warning("%s was trained without fp16 loss scaling; starting a new loss scale", last)
    elif trainee.scaler.is_enabled():
        trainee.scaler.load_state_dict(ckpt["scaler"])


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict, path: Path) -> None:
    """Load the moments and step counters, but keep this run's hyper-parameters and
    implementation (`load_state_dict` would restore the saved `fused`, betas, eps...)."""
    wanted = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, settings in zip(optimizer.param_groups, wanted, strict=True):
        changed = sorted(k for k, v in settings.items() if k != "lr" and group.get(k) != v)
        if changed:
            log.info("%s: optimizer settings from this config win: %s", path, ", ".join(changed))
        group.update(settings)
        if group.get("fused") or group.get("capturable"):  # their step counters live on the device
            for param in group["params"]:
                step = optimizer.state.get(param, {}).get("step")
                if step is not None:
                    optimizer.state[param]["step"] = step.to(param.device, torch.float32)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's random state: torch CPU, Python, and CUDA of the current device only."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and device.type == "cuda":
        cuda = state["cuda"]
        if isinstance(cuda, list):  # older checkpoints held every device's state
            cuda = cuda[device.index or 0] if len(cuda) > (device.index or 0) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda.cpu(), device)
