"""A resume's config: the run dir's saved config is the base, the command line applies on top.

A run dir that holds `.hydra/config.yaml` and a checkpoint resumes. Its config is the one it
was started with (`.hydra/config.yaml`, which a resume never rewrites) plus the changes later
resumes recorded (`.hydra/changes.yaml`, in order). The command line's overrides apply on top:
a key they set, directly (`trainer.max_steps=400`) or through a config group (`model=small`,
`experiment=...`), takes the value a fresh composition of the run's own command line plus
these overrides gives; every other key keeps the run's value. So `train.py
hydra.run.dir=RUN trainer.max_steps=400` continues RUN on its own corpus.

Keys that change what the run learns from or what it is (data, tokenizer, model, optimiser,
seed, batching, tokens per update) are refused in one line naming each as `old -> new`,
unless `trainer.allow_config_change=true`; keys of steps, validation, logging and the device
(`FREE`) change freely. Every change a resume makes is appended to `.hydra/changes.yaml` with
the step it took effect, once the run has started (a failed start records nothing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnmt.common.files import atomic_write
from attnmt.training.config import ConfigError

log = logging.getLogger(__name__)

SAVED = Path(".hydra") / "config.yaml"
CHANGES = Path(".hydra") / "changes.yaml"
OVERRIDES = Path(".hydra") / "overrides.yaml"
SWITCH = "trainer.allow_config_change"
TOKEN_KEYS = ("trainer.max_tokens", "trainer.update_freq")

# What a resume may change without the switch: when to stop, validate, log and save; the
# device and its arithmetic; where caches go; the test splits scored at the end.
FREE_GROUPS = ("decoding", "logger")
FREE = frozenset(
    {
        "trainer." + key
        for key in (
            "max_steps max_epochs max_minutes eval_every log_every keep_last patience "
            "valid_max_sentences max_nonfinite on_divergence max_rollbacks rollback_lr_factor "
            "device precision compile tf32 num_threads dist_timeout prefetch "
            "activation_checkpointing expected_tokens_per_update"
        ).split()
    }
    | {"data.cache_dir", "data.num_proc", "data.test_splits", "data.test_from"}
)
_ABSENT = "<unset>"


@dataclass
class ResumePlan:
    """A resume's config (`config`: what `fit` trains with) and its changes to the run's."""

    run_dir: Path
    config: DictConfig
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (old, new)
    overrides: list[str] = field(default_factory=list)

    def record(self, step: int) -> None:
        """Append this resume's changes to `.hydra/changes.yaml`, taking effect at `step`."""
        if not self.changes:
            return
        path = self.run_dir / CHANGES
        entries = _load_list(path)
        entries.append(
            {
                "step": step,
                "overrides": list(self.overrides),
                "changes": {k: {"old": old, "new": new} for k, (old, new) in self.changes.items()},
            }
        )
        atomic_write(path, OmegaConf.to_yaml(OmegaConf.create(entries)))
        log.info("config changes at step %d recorded in %s: %s", step, path, _listed(self.changes))


def is_resume(run_dir: Path) -> bool:
    """Whether starting in `run_dir` resumes a run: it holds the run's saved config and a
    checkpoint (a run dir whose first start failed before any save starts afresh)."""
    folder = run_dir / "checkpoints"
    has_checkpoint = (folder / "last.pt").is_file() or any(folder.glob("step_*.pt"))
    return (run_dir / SAVED).is_file() and has_checkpoint


def recorded_config(run_dir: Path) -> DictConfig:
    """The config the run last trained with: `.hydra/config.yaml` + `.hydra/changes.yaml`."""
    config = OmegaConf.load(run_dir / SAVED)
    assert isinstance(config, DictConfig)
    for entry in _load_list(run_dir / CHANGES):
        for key, change in (entry.get("changes") or {}).items():
            _set(config, key, change["new"])
    return config


def plan_resume(run_dir: Path, argv: list[str], conf_dir: Path) -> ResumePlan | None:
    """The config of a resume in `run_dir` with the command line's Hydra overrides `argv`;
    None when the overrides do not compose (Hydra then reports it, writing nothing).

    Raises:
        ConfigError: the overrides change a key outside `FREE` (one line, each key as
            `old -> new`) without `trainer.allow_config_change=true`.
    """
    from hydra import compose, initialize_config_dir

    given = [arg for arg in argv if _is_task_override(arg)]
    original = [arg for arg in _load_list(run_dir / OVERRIDES) if _is_task_override(str(arg))]
    merged = {_override_key(arg): arg for arg in original}
    merged.update({_override_key(arg): arg for arg in given})
    with initialize_config_dir(str(conf_dir), version_base="1.3"):
        try:
            after = _flat(compose("train", overrides=list(merged.values())))
            before = _flat(compose("train", overrides=original))
        except (HydraException, OmegaConfBaseException):
            try:  # the run's own command line no longer composes (the conf files changed)
                after = _flat(compose("train", overrides=given))
            except (HydraException, OmegaConfBaseException):
                return None  # a bad override: Hydra's own start says what is wrong
            before = after  # then only the keys the command line names change
    touched = {
        k for k in before.keys() | after.keys() if before.get(k, _ABSENT) != after.get(k, _ABSENT)
    }
    for arg in given:  # a key typed on the command line counts even where it equals the default
        key = _override_key(arg)
        touched |= {k for k in after if k == key or k.startswith(key + ".")}
    config = recorded_config(run_dir)
    base = _flat(config)
    changes = {}
    for key in sorted(touched):
        new = after.get(key, _ABSENT)
        if new == base.get(key, _ABSENT) or new == _ABSENT:
            continue
        _set(config, key, new)
        if key != SWITCH:
            changes[key] = (base.get(key, _ABSENT), new)
    _refuse(run_dir, changes, bool(after.get(SWITCH)))
    return ResumePlan(run_dir, config, changes, given)


def _refuse(run_dir: Path, changes: dict[str, tuple[Any, Any]], allowed: bool) -> None:
    refused = {k: v for k, v in changes.items() if not is_free(k)}
    tokens = [changes.get(k, (None, None)) for k in TOKEN_KEYS]
    if (
        all(k in refused for k in TOKEN_KEYS)
        and tokens[0][0] * tokens[1][0] == tokens[0][1] * tokens[1][1]
    ):
        for key in TOKEN_KEYS:  # the same tokens per update, batched otherwise
            del refused[key]
    if not refused or allowed:
        return
    raise ConfigError(
        f"resuming {run_dir} would change what the run learns from or what it is: "
        f"{_listed(refused)}; a resume continues the run as {run_dir / SAVED} records it: drop "
        f"these overrides, start a new run (another hydra.run.dir), or pass {SWITCH}=true to "
        f"change them (recorded in {run_dir / CHANGES})"
    )


def is_free(key: str) -> bool:
    """Whether a resume may change `key` without `trainer.allow_config_change=true`."""
    return key in FREE or key.split(".", 1)[0] in FREE_GROUPS or key == SWITCH


def _listed(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key}: {old} -> {new}" for key, (old, new) in changes.items())


def _is_task_override(arg: str) -> bool:
    """A Hydra override of the task's config (not `hydra.*`, `hydra/...`, nor a flag)."""
    key = _override_key(arg)
    return "=" in arg and not arg.startswith("-") and key.split("/")[0].split(".")[0] != "hydra"


def _override_key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def _flat(config: DictConfig, prefix: str = "") -> dict[str, Any]:
    """Leaf keys (`model.d_model`) to plain values; a list or an empty mapping is a leaf."""
    tree = OmegaConf.to_container(config, resolve=False) if not prefix else config
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, name + "."))  # type: ignore[arg-type]
        else:
            out[name] = value
    return out


def _set(config: DictConfig, key: str, value: Any) -> None:
    OmegaConf.update(config, key, value, merge=False, force_add=True)


def _load_list(path: Path) -> list:
    if not path.is_file():
        return []
    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return loaded if isinstance(loaded, list) else []


def tokens_check(max_tokens: int, update_freq: int, world_size: int, allowed: bool):
    """A `state.resume` check: refuse a checkpoint saved at another number of tokens per
    update (processes x `trainer.max_tokens` x `trainer.update_freq`), as when the world size
    changes, unless `allowed` (then one warning)."""

    def check(saved: dict[str, Any], ranks: int) -> None:
        trainer = saved.get("trainer") or {}
        if "max_tokens" not in trainer or "update_freq" not in trainer:
            return  # a checkpoint without its config: nothing to compare
        old_total = ranks * trainer["max_tokens"] * trainer["update_freq"]
        new_total = world_size * max_tokens * update_freq
        if old_total == new_total:
            return
        what = (
            f"tokens per update {ranks} process(es) x {trainer['max_tokens']} max tokens x "
            f"{trainer['update_freq']} accumulation = {old_total} -> {world_size} x {max_tokens} "
            f"x {update_freq} = {new_total}"
        )
        if allowed:
            log.warning("resuming with %s (%s=true)", what, SWITCH)
            return
        fix = "trainer.update_freq or trainer.max_tokens so that the product stays the same"
        if old_total % (world_size * max_tokens) == 0:
            fix = f"trainer.update_freq={old_total // (world_size * max_tokens)}"
        raise ConfigError(
            f"resuming this run would change its {what}; set {fix}, or pass {SWITCH}=true"
        )

    return check
