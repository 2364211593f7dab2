"""An experiment that states the tokens per update its schedule assumes warns, in one line
naming `trainer.update_freq` and `trainer.max_tokens`, when a run is more than 2x off it."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from attnmt.training.build import tokens_per_update_warning
from attnmt.training.config import Configs
from attnmt.training.loop import fit
from tests.train_helpers import CONF, toy_cfg


def wmt14(*overrides: str) -> Configs:
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return Configs.from_hydra(compose("train", ["experiment=wmt14_en_de", *overrides]))


def test_wmt14_on_one_process_warns_and_names_the_fix():
    warning = tokens_per_update_warning(wmt14(), world_size=1)
    assert warning is not None and "\n" not in warning
    assert warning.startswith("tokens per update 3125 (1 process(es) x trainer.max_tokens=3125")
    assert "the 25000 this experiment's schedule assumes" in warning
    assert "set trainer.update_freq=8 or trainer.max_tokens" in warning


def test_the_papers_layouts_do_not_warn():
    assert tokens_per_update_warning(wmt14(), world_size=8) is None
    assert tokens_per_update_warning(wmt14("trainer.update_freq=8"), world_size=1) is None
    assert tokens_per_update_warning(wmt14("trainer.max_tokens=1563"), world_size=16) is None
    # 2 nodes x 8 GPUs at 3,125: 50,000, twice the paper's batch, at the edge: no warning
    assert tokens_per_update_warning(wmt14(), world_size=16) is None
    assert tokens_per_update_warning(wmt14("trainer.update_freq=2"), world_size=16) is not None


def test_a_run_off_its_stated_budget_warns_once_at_start(tmp_path, caplog):
    cfg = toy_cfg(tmp_path, "trainer.max_steps=1", "trainer.expected_tokens_per_update=4096")
    with caplog.at_level("WARNING", logger="attnmt.training.loop"):
        fit(cfg, tmp_path / "run")
    warned = [r.getMessage() for r in caplog.records if "schedule assumes" in r.getMessage()]
    assert len(warned) == 1 and "trainer.update_freq=8" in warned[0], warned
