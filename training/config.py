"""Typed configs for training. YAML holds the values, these dataclasses hold the types.

`Configs.from_hydra(cfg)` converts the composed Hydra config once, at the top of `fit()`;
below that line the code takes dataclasses, never DictConfig. Unknown keys fail here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from attnmt.common.errors import UserError
from attnmt.data.dataset import DataConfig
from attnmt.data.spm_train import TokenizerConfig
from attnmt.decoding.config import SearchConfig
from attnmt.model import ModelConfig

# The `decoding` group's schema comes from SearchConfig itself (conf/decoding/*.yaml list it
# first in their defaults), so its defaults are written once and every field can be overridden.
# A plain dict: OmegaConf cannot type the Literal of `lp_type`.
ConfigStore.instance().store(group="decoding", name="search_config", node=asdict(SearchConfig()))


class ConfigError(UserError):
    """A config value that cannot work; one line: the key, the problem, the fix."""


@dataclass
class OptimConfig:
    name: str = "adam"
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    schedule: str = "inverse_sqrt"
    warmup_steps: int = 4000
    noam_factor: float = 1.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0


@dataclass
class TrainerConfig:
    device: str = "auto"
    precision: str = "fp32"
    seed: int = 1
    max_tokens: int = 4096
    bucket_growth: float = 0.0
    update_freq: int = 1
    max_steps: int = 100_000
    max_epochs: int = 0
    max_minutes: float = 0.0
    eval_every: int = 1000
    log_every: int = 50
    keep_last: int = 5
    patience: int = 0
    max_nonfinite: int = 10
    on_divergence: str = "rollback"
    max_rollbacks: int = 3
    rollback_lr_factor: float = 0.5
    compile: bool = False
    valid_max_sentences: int = 0
    num_threads: int = 0
    dist_timeout: float = 1800.0
    tf32: bool = True
    prefetch: int = 2
    ema_decay: float = 0.0
    init_from: str | None = None
    init_keep_optimizer: bool = False
    activation_checkpointing: bool = False
    allow_config_change: bool = False
    expected_tokens_per_update: int = 0


@dataclass
class LoggerConfig:
    enabled: bool = True
    n_samples: int = 3


@dataclass
class Configs:
    model: ModelConfig
    data: DataConfig
    tokenizer: TokenizerConfig
    optim: OptimConfig
    trainer: TrainerConfig
    decoding: SearchConfig
    logger: LoggerConfig
    raw: dict = field(default_factory=dict)  # the resolved config, stored in checkpoints

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> Configs:
        raw = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(raw, dict)
        parts = {
            "model": ModelConfig,
            "data": DataConfig,
            "tokenizer": TokenizerConfig,
            "optim": OptimConfig,
            "trainer": TrainerConfig,
            "decoding": SearchConfig,
            "logger": LoggerConfig,
        }
        built = {name: _build(name, kind, raw.get(name) or {}) for name, kind in parts.items()}
        configs = cls(**built, raw=raw)
        configs.validate()
        return configs

    def validate(self) -> None:
        trainer, optim = self.trainer, self.optim
        _choice("trainer.precision", trainer.precision, ("auto", "fp32", "bf16", "fp16"))
        _choice("optim.name", optim.name, ("adam", "adamw"))
        _choice("trainer.on_divergence", trainer.on_divergence, ("rollback", "stop"))
        if not 0.0 < trainer.rollback_lr_factor <= 1.0:
            raise ConfigError(
                f"trainer.rollback_lr_factor={trainer.rollback_lr_factor} must be in (0, 1] "
                "(the learning rate is multiplied by it at each rollback; e.g. 0.5)"
            )
        _choice("optim.schedule", optim.schedule, ("inverse_sqrt", "noam"))
        for key, value in (
            ("trainer.max_tokens", trainer.max_tokens),
            ("trainer.update_freq", trainer.update_freq),
            ("trainer.eval_every", trainer.eval_every),
            ("trainer.log_every", trainer.log_every),
            ("trainer.dist_timeout", trainer.dist_timeout),
            ("trainer.max_nonfinite", trainer.max_nonfinite),
        ):
            if value < 1:
                raise ConfigError(f"{key}={value} must be positive")
        if trainer.bucket_growth != 0 and not trainer.bucket_growth > 1.0:
            raise ConfigError(
                f"trainer.bucket_growth={trainer.bucket_growth} must be > 1 (the ratio between "
                "padded lengths, e.g. 1.1) or 0 (exact lengths)"
            )
        if not 0.0 <= trainer.ema_decay < 1.0:
            raise ConfigError(
                f"trainer.ema_decay={trainer.ema_decay} must be in [0, 1) (0 = off; e.g. 0.999)"
            )
        if trainer.max_minutes < 0:
            raise ConfigError(
                f"trainer.max_minutes={trainer.max_minutes} must be >= 0 (the run's wall time "
                "budget in minutes; 0 = no limit)"
            )
        if trainer.max_steps <= 0 and trainer.max_epochs <= 0 and trainer.max_minutes <= 0:
            raise ConfigError(
                "trainer.max_steps, trainer.max_epochs and trainer.max_minutes are all 0: set one "
                "of them"
            )
        if self.model.share_embeddings and not self.tokenizer.joint:
            raise ConfigError(
                "model.share_embeddings=true needs a joint vocabulary but tokenizer.joint=false; "
                "set model.share_embeddings=false or tokenizer.joint=true"
            )


def _build(group: str, kind: type, values: dict):
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(f'{group}.{k}' for k in unknown)}; "
            f"valid keys: {', '.join(sorted(known))}"
        )
    if kind is OptimConfig and "betas" in values:
        values = {**values, "betas": tuple(values["betas"])}
    try:
        return kind(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{group}: {e}") from None


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value} is not one of {'|'.join(allowed)}")
