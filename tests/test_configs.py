"""Every config composes and converts to the typed dataclasses; typos fail fast."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from attnmt.training.config import ConfigError, Configs
from tests.train_helpers import CONF

# The README's experiments and model presets, plus every other file: each must compose.
EXPERIMENTS = sorted(
    {"multi30k_en_de", "multi30k_de_en", "iwslt14_de_en", "wmt14_en_de"}
    | {p.stem for p in (CONF / "experiment").glob("*.yaml")}
)
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


def _compose(*overrides: str):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    configs = Configs.from_hydra(_compose(f"experiment={experiment}"))
    assert configs.model.d_model % configs.model.n_heads == 0
    assert configs.data.src_lang != configs.data.tgt_lang


@pytest.mark.parametrize(
    "name, expected",
    [
        ("base", (512, 8, 2048, 6, 6, 0.1)),
        ("big", (1024, 16, 4096, 6, 6, 0.3)),
        ("small", (512, 4, 1024, 6, 6, 0.3)),
        ("tiny", (256, 4, 1024, 3, 3, 0.1)),
        ("student", (192, 4, 768, 3, 1, 0.1)),
    ],
)
def test_model_presets_match_the_paper(name, expected):
    m = Configs.from_hydra(_compose(f"model={name}")).model  # the command line beats experiments
    got = (m.d_model, m.n_heads, m.d_ff, m.n_encoder_layers, m.n_decoder_layers, m.dropout)
    assert got == expected


def test_spec_keys_reach_the_typed_config():
    """Every key the README names can be set on the command line and arrives where code reads it."""
    values = {
        "data.dir": "/corpus",
        "data.src_lang": "fr",
        "data.tgt_lang": "cs",
        "trainer.max_steps": 7,
        "trainer.device": "cpu",
        "trainer.seed": 9,
        "trainer.precision": "bf16",
        "trainer.max_tokens": 321,
        "trainer.eval_every": 3,
    }
    configs = Configs.from_hydra(_compose(*(f"{k}={v}" for k, v in values.items())))
    for key, value in values.items():
        group, name = key.split(".")
        assert getattr(getattr(configs, group), name) == value, key


def test_unknown_key_in_yaml_fails_with_its_name():
    cfg = _compose()
    with open_dict(cfg):
        cfg.trainer.max_stepz = 3
    with pytest.raises(ConfigError, match="trainer.max_stepz"):
        Configs.from_hydra(cfg)


def test_unknown_override_fails_at_compose():
    with pytest.raises(Exception, match="max_stepz"):
        _compose("trainer.max_stepz=3")


def test_precision_auto_is_bf16_only_where_the_device_has_native_bf16(monkeypatch):
    from attnmt.common import runtime

    cpu = torch.device("cpu")
    assert Configs.from_hydra(_compose("trainer.precision=auto")).trainer.precision == "auto"
    for avx512_bf16, amx, expected in (
        (True, False, "bf16"),
        (False, True, "bf16"),
        (False, False, "fp32"),
    ):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert runtime.resolve_precision(cpu, "auto") == expected
        assert runtime.resolve_precision(cpu, "fp32") == "fp32"  # only `auto` is resolved
    assert runtime.resolve_precision(torch.device("meta"), "auto") == "fp32"


def test_default_experiment_uses_auto_precision_and_beam_search():
    configs = Configs.from_hydra(_compose())
    assert configs.trainer.precision == "auto"
    assert configs.decoding.beam_size == 5


def test_bad_choice_fails():
    with pytest.raises(ConfigError, match="trainer.precision"):
        Configs.from_hydra(_compose("trainer.precision=fp8"))
