"""A resume continues the run its run dir holds: the saved `.hydra/config.yaml` is the base,
the command line applies on top, changes to what the run is are refused unless
`trainer.allow_config_change=true`, which records them in `.hydra/changes.yaml`; the saved
config is never rewritten, not even by a start that fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from attnmt.checkpoint import load_checkpoint
from attnmt.common.errors import UserError
from attnmt.training.loop import fit
from attnmt.training.resume_config import CHANGES, SAVED, plan_resume, tokens_check
from tests.train_helpers import CONF, ROOT, TOY, run_train, toy_cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A toy run of 10 updates trained with `data.dir=<toy corpus>` (copied by each test)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    proc = run_train(run_dir, "trainer.max_steps=10")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run_dir


@pytest.fixture
def run(trained, tmp_path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def resume(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`python train.py hydra.run.dir=RUN <overrides>`: no corpus or data flags, as the README
    writes a resume."""
    cmd = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]


def corpus_copy(tmp_path: Path, name: str, drop: tuple[str, ...] = ()) -> Path:
    folder = tmp_path / name
    shutil.copytree(TOY, folder, ignore=shutil.ignore_patterns(*drop))
    return folder


def test_resume_with_only_max_steps_trains_on_the_runs_own_corpus(run):
    saved = (run / SAVED).read_bytes()
    proc = resume(run, "trainer.max_steps=14")
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert last["train_state"]["step"] == 14
    assert last["config"]["data"]["dir"] == str(TOY)
    assert (run / SAVED).read_bytes() == saved
    entries = yaml.safe_load((run / CHANGES).read_text())
    assert entries == [
        {
            "step": 10,
            "overrides": ["trainer.max_steps=14"],
            "changes": {"trainer.max_steps": {"old": 10, "new": 14}},
        }
    ]


def test_resume_with_another_data_dir_is_refused_in_one_line(run, tmp_path):
    other = corpus_copy(tmp_path, "other")
    saved = (run / SAVED).read_bytes()
    proc = resume(run, f"data.dir={other}", "model.d_model=64", "trainer.max_steps=14")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    [line] = error_lines(proc)
    assert f"data.dir: {TOY} -> {other}" in line and "model.d_model: 32 -> 64" in line
    assert "trainer.allow_config_change=true" in line and "max_steps" not in line
    assert (run / SAVED).read_bytes() == saved
    assert not (run / CHANGES).exists()
    assert load_checkpoint(run / "checkpoints" / "last.pt")["train_state"]["step"] == 10


def test_the_switch_records_the_change_beside_the_saved_config(run, tmp_path):
    other = corpus_copy(tmp_path, "other")
    saved = (run / SAVED).read_bytes()
    proc = resume(run, f"data.dir={other}", "trainer.allow_config_change=true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / SAVED).read_bytes() == saved
    [entry] = yaml.safe_load((run / CHANGES).read_text())
    assert entry["step"] == 10
    assert entry["changes"] == {"data.dir": {"old": str(TOY), "new": str(other)}}
    # The recorded change is the run's config from now on: going back is a change too.
    proc = resume(run, f"data.dir={TOY}")
    [line] = error_lines(proc)
    assert f"data.dir: {other} -> {TOY}" in line


def test_a_failed_start_leaves_the_saved_config_untouched(run, tmp_path):
    no_test = corpus_copy(tmp_path, "no_test", drop=("test.*",))
    saved = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
    proc = resume(run, f"data.dir={no_test}", "trainer.allow_config_change=true")
    assert proc.returncode != 0
    assert len(error_lines(proc)) == 1 and "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()} == saved


@pytest.fixture
def saved_run(tmp_path) -> Path:
    """A run dir as a toy run leaves it, without training: its config and a checkpoint file."""
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"")
    (run_dir / SAVED).write_text(OmegaConf.to_yaml(toy_cfg(tmp_path)))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"data.dir={TOY}"]))
    return run_dir


def test_the_same_tokens_per_update_batched_otherwise_is_free(saved_run):
    plan = plan_resume(saved_run, ["trainer.max_tokens=256", "trainer.update_freq=2"], CONF)
    assert plan.config.trainer.max_tokens == 256 and plan.config.trainer.update_freq == 2
    with pytest.raises(UserError, match=r"trainer\.max_tokens: 512 -> 256"):
        plan_resume(saved_run, ["trainer.max_tokens=256"], CONF)


def test_a_group_override_names_each_key_it_changes(saved_run):
    with pytest.raises(UserError, match=r"model\.d_model: 32 -> 512.*model\.n_heads: 2 -> 4"):
        plan_resume(saved_run, ["model=small"], CONF)
    free = plan_resume(saved_run, ["decoding=beam", "trainer.eval_every=3"], CONF)
    assert free.config.trainer.eval_every == 3 and "trainer.eval_every" in free.changes


def test_another_world_size_must_keep_the_tokens_per_update():
    saved = {"trainer": {"max_tokens": 512, "update_freq": 1}}
    tokens_check(512, 2, 1, allowed=False)(saved, 2)  # 2 x 512 x 1 = 1 x 512 x 2
    with pytest.raises(UserError, match=r"= 1024 -> 1 x 512 x 1 = 512; set trainer.update_freq=2"):
        tokens_check(512, 1, 1, allowed=False)(saved, 2)
    tokens_check(512, 1, 1, allowed=True)(saved, 2)


def test_a_checkpoint_at_other_tokens_per_update_is_refused_before_it_is_restored(tmp_path):
    """`fit` itself (no command line to compare) checks the checkpoint's tokens per update."""
    fit(toy_cfg(tmp_path, "trainer.max_steps=2"), tmp_path / "run")
    with pytest.raises(UserError, match=r"= 512 -> 1 x 256 x 1 = 256; set trainer.update_freq=2"):
        fit(toy_cfg(tmp_path, "trainer.max_steps=4", "trainer.max_tokens=256"), tmp_path / "run")
    cfg = toy_cfg(
        tmp_path, "trainer.max_steps=4", "trainer.max_tokens=256", "trainer.update_freq=2"
    )
    assert fit(cfg, tmp_path / "run").results["steps"] == 4
