"""Starting a run from a trained model (`trainer.init_from`): fairseq's `--finetune-from-model`,
OpenNMT-py's `-train_from` with `-reset_optim all`, Marian's `--pretrained-model`.

A run with `trainer.init_from=RUN_DIR|CKPT` takes three things from that checkpoint: its
weights, its model config (the shape: widths, heads, layers, vocabulary) and its SentencePiece
model, so the new data is encoded with the checkpoint's tokenizer, never a new one. The
optimizer, the lr schedule, the update count and the data position start fresh, unless
`trainer.init_keep_optimizer=true`, which also restores Adam's moments (and the fp16 loss
scale) from the checkpoint's `last.pt`.

The run's own `checkpoints/last.pt` wins: a fine-tuning run that was stopped resumes from it,
and then the model config and tokenizer come from it (the `init_from` file is not read again).

What the command line says about the model must agree with the checkpoint: an explicit
`model=PRESET` or `model.KEY=...` that contradicts the checkpoint's shape, or an explicit
`tokenizer.vocab_size`/`tokenizer.joint` that contradicts its SentencePiece model, is an error.
Dropout rates set on the command line win (fine-tuning often changes them); otherwise they are
the checkpoint's. Keys the experiment or preset files set, but the command line does not, give
way to the checkpoint silently.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from attnmt.checkpoint import (
    CheckpointError,
    CorruptCheckpointError,
    load_checkpoint,
    resolve_checkpoint,
    stored_tokenizer,
)
from attnmt.data.tokenizer import Tokenizer
from attnmt.model import ModelConfig
from attnmt.training.config import ConfigError, Configs
from attnmt.training.state import Trainee, load_optimizer

log = logging.getLogger(__name__)

# Set by the tokenizer, never by a model preset.
_FROM_TOKENIZER = ("src_vocab_size", "tgt_vocab_size", "pad_id")
# Model keys a fine-tuning run may change; every other key is the checkpoint's shape.
_CHANGEABLE = ("dropout", "attn_dropout", "act_dropout")


@dataclass
class Initial:
    """Where a run's model comes from: the `init_from` checkpoint, or, on a resume, the run's
    own `last.pt` (then `fresh` is False and `resume` loads the weights)."""

    path: Path
    checkpoint: dict[str, Any]
    tokenizer: Tokenizer
    fresh: bool  # True: load the weights (and maybe the optimizer) into the new run

    def load_into(self, trainee: Trainee, keep_optimizer: bool) -> None:
        """The checkpoint's weights into the freshly built `trainee` (+ optimizer state)."""
        ckpt, model = self.checkpoint, trainee.model
        # The weights the checkpoint translates with (the average, with EMA), unless the
        # optimizer's moments come along: they belong to the trained weights.
        weights = ckpt.get("train_weights", ckpt["model"]) if keep_optimizer else ckpt["model"]
        model.load_state_dict(weights)
        if trainee.ema is not None:  # the new run's average starts at the loaded weights
            trainee.ema.load_state_dict(model, model.state_dict())
        kept = ""
        if keep_optimizer:
            load_optimizer(trainee.optimizer, ckpt["optimizer"], self.path)
            if trainee.scaler.is_enabled() and ckpt.get("scaler"):
                trainee.scaler.load_state_dict(ckpt["scaler"])
            kept = " and optimizer state"
        step = ckpt.get("train_state", {}).get("step", "?")
        log.info(
            "initialised from %s (update %s of its run): weights%s; update count, lr schedule "
            "and data position start at 0",
            self.path,
            step,
            kept,
        )


def initial_checkpoint(cfg: Configs, run_dir: Path, explicit: set[str]) -> Initial | None:
    """With `trainer.init_from` set: load the checkpoint the model comes from (`last.pt` of
    this run if there is one, else `init_from`), check the command line against it (`explicit`:
    the keys set there, see `command_line_keys`), and put its model config and tokenizer
    settings into `cfg` (also `cfg.raw`, which checkpoints store). None without `init_from`.

    Raises:
        ConfigError, CheckpointError: one line naming the problem and the fix.
    """
    trainer = cfg.trainer
    if not trainer.init_from:
        if trainer.init_keep_optimizer:
            raise ConfigError(
                "trainer.init_keep_optimizer=true needs trainer.init_from=RUN_DIR|CKPT "
                "(the checkpoint whose optimizer state to keep)"
            )
        return None
    last = run_dir / "checkpoints" / "last.pt"
    if last.is_file():
        path, fresh = last, False
    else:
        path, fresh = _init_path(trainer.init_from, trainer.init_keep_optimizer), True
    try:
        try:
            ckpt = load_checkpoint(path)
        except CorruptCheckpointError:
            if fresh:
                raise
            # A damaged last.pt: the model comes from init_from here, and `resume` falls
            # back to an intact checkpoint of the run (or says why it cannot).
            path = _init_path(trainer.init_from, trainer.init_keep_optimizer)
            ckpt = load_checkpoint(path)
    except CheckpointError as e:
        raise CheckpointError(f"trainer.init_from: {e}") from None
    if fresh and trainer.init_keep_optimizer and "optimizer" not in ckpt:
        raise ConfigError(
            f"trainer.init_keep_optimizer=true but {path} holds no optimizer state (only "
            "checkpoints/last.pt does); pass that file or the run dir, or drop the option"
        )
    tokenizer = stored_tokenizer(ckpt, path)
    # An imported multilingual model: the pair the data is encoded for (its language tokens)
    tokenizer = tokenizer.for_languages(cfg.tokenizer.src_lang, cfg.tokenizer.tgt_lang)
    cfg.model = _model_config(cfg.model, ckpt["model_config"], explicit, path)
    _check_tokenizer(cfg, tokenizer, explicit, path)
    cfg.tokenizer = replace(
        cfg.tokenizer, vocab_size=tokenizer.src_vocab_size, joint=tokenizer.joint
    )
    cfg.raw["model"] = {k: v for k, v in asdict(cfg.model).items() if k not in _FROM_TOKENIZER}
    cfg.raw["tokenizer"] = asdict(cfg.tokenizer)
    return Initial(path, ckpt, tokenizer, fresh)


def _init_path(init_from: str, keep_optimizer: bool) -> Path:
    """`init_from` as a checkpoint file: a run dir gives its `best.pt` (else `last.pt`), or its
    `last.pt` when the optimizer is kept (only `last.pt` holds it)."""
    path = Path(init_from).expanduser()
    if not path.exists():
        raise CheckpointError(
            f"trainer.init_from={init_from} does not exist; pass a run dir (its "
            "checkpoints/best.pt is used) or a .pt checkpoint file"
        )
    if path.is_dir() and keep_optimizer and (path / "checkpoints" / "last.pt").is_file():
        return path / "checkpoints" / "last.pt"
    try:
        return resolve_checkpoint(path)
    except CheckpointError as e:
        raise CheckpointError(f"trainer.init_from: {e}") from None


def _model_config(
    configured: ModelConfig, saved: dict[str, Any], explicit: set[str], path: Path
) -> ModelConfig:
    """The checkpoint's model config, with the dropout rates the command line sets; a shape
    key the command line sets to another value is an error."""
    try:
        model = ModelConfig(**saved)
    except (TypeError, ValueError) as e:
        raise CheckpointError(
            f"trainer.init_from: {path} has an unusable model config ({e})"
        ) from None
    changes = {}
    for f in fields(ModelConfig):
        if f.name in _FROM_TOKENIZER or not _is_explicit(f"model.{f.name}", explicit):
            continue
        wanted, have = getattr(configured, f.name), getattr(model, f.name)
        if wanted == have:
            continue
        if f.name in _CHANGEABLE:
            changes[f.name] = wanted
            continue
        raise ConfigError(
            f"trainer.init_from={path} has model.{f.name}={have} but the command line asks for "
            f"{wanted}; the model's shape comes from the checkpoint: drop that override (or the "
            "model=PRESET that sets it), or train from scratch"
        )
    if changes:
        log.info("init_from: dropout from the command line: %s", changes)
    return replace(model, **changes)


def _check_tokenizer(cfg: Configs, tokenizer: Tokenizer, explicit: set[str], path: Path) -> None:
    checks = (
        ("tokenizer.vocab_size", cfg.tokenizer.vocab_size, tokenizer.src_vocab_size),
        ("tokenizer.joint", cfg.tokenizer.joint, tokenizer.joint),
    )
    for key, wanted, have in checks:
        if _is_explicit(key, explicit) and wanted != have:
            raise ConfigError(
                f"trainer.init_from={path} has a SentencePiece model with {key}={have} but the "
                f"command line asks for {wanted}; the new data is encoded with the checkpoint's "
                "tokenizer: drop that override, or train from scratch"
            )


def _is_explicit(key: str, explicit: set[str]) -> bool:
    """Whether the command line set `key` (`model.d_model`), or its group (`model=small`)."""
    return key in explicit or key.split(".", 1)[0] in explicit


def command_line_keys() -> set[str]:
    """The config keys (and groups) set on the command line of this Hydra job: `model.d_model`
    for `model.d_model=512`, `model` for `model=small`. Empty outside a Hydra job (a notebook
    or a test calling `fit` with a composed config): then the checkpoint's config wins."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    keys = set()
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        keys.add(key.split("@", 1)[0])
    return keys
