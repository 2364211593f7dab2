"""Starting a run from a trained model (`trainer.init_from`, training/init.py): weights, model
config and tokenizer come from the checkpoint, everything else starts fresh; the run's own
last.pt wins on a restart; contradicting overrides and bad paths are one line."""

from __future__ import annotations

import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from attnmt.checkpoint import load_checkpoint
from attnmt.common.errors import UserError
from attnmt.model import ModelConfig
from attnmt.training import distributed
from attnmt.training.config import Configs
from attnmt.training.init import _model_config
from attnmt.training.loop import fit
from attnmt.training.run import Run
from tests.train_helpers import ROOT, run_train, torchrun_cmd, toy_cfg

COMMON = ("trainer.eval_every=3", "logger=none", "trainer.num_threads=1")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A trained toy run (6 updates, vocabulary 100, d_model 32) to start from."""
    tmp = tmp_path_factory.mktemp("base")
    fit(toy_cfg(tmp, "trainer.max_steps=6", *COMMON), tmp / "run")
    return tmp / "run"


def _start(tmp: Path, *overrides: str) -> Run:
    """What `fit` builds before the first update, with `overrides`."""
    cfg = Configs.from_hydra(toy_cfg(tmp, *overrides))
    return Run.start(cfg, tmp / "run", distributed.setup("cpu"))


def test_starts_from_the_checkpoint_weights_and_tokenizer_with_a_fresh_optimizer(
    tmp_path, base_run
):
    # Another vocabulary size and width in the config: the checkpoint's win (not set on a
    # command line, see test_contradicting_override_is_one_line).
    run = _start(
        tmp_path,
        f"trainer.init_from={base_run}",
        "tokenizer.vocab_size=120",
        "model.d_model=64",
        "model.n_heads=4",
    )
    best = load_checkpoint(base_run / "checkpoints" / "best.pt")
    assert run.trainee.model.cfg.__dict__ == best["model_config"]
    for name, value in best["model"].items():
        torch.testing.assert_close(run.trainee.model.state_dict()[name], value, atol=0, rtol=0)
    # The data is encoded with the checkpoint's SentencePiece model, also saved in the run dir.
    spm = (base_run / "spm.model").read_bytes()
    assert (tmp_path / "run" / "spm.model").read_bytes() == spm
    assert run.data.tokenizer.state_dict()["src_model"] == spm
    assert run.cfg.raw["model"]["d_model"] == 32 and run.cfg.raw["tokenizer"]["vocab_size"] == 100
    assert run.trainee.state.step == 0 and run.trainee.state.epoch == 0
    assert run.trainee.optimizer.state_dict()["state"] == {}  # no moments: fresh


def test_init_keep_optimizer_restores_the_moments(tmp_path, base_run):
    run = _start(tmp_path, f"trainer.init_from={base_run}", "trainer.init_keep_optimizer=true")
    last = load_checkpoint(base_run / "checkpoints" / "last.pt")
    saved, loaded = last["optimizer"]["state"], run.trainee.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys() and len(saved) > 0
    for key in saved:
        torch.testing.assert_close(loaded[key]["exp_avg"], saved[key]["exp_avg"], atol=0, rtol=0)
    assert run.trainee.state.step == 0  # the schedule and data position still start fresh


def test_dropout_from_the_command_line_wins_a_shape_override_is_an_error():
    saved = vars(ModelConfig(src_vocab_size=100, tgt_vocab_size=100, d_model=32, n_heads=2))
    configured = ModelConfig(d_model=64, n_heads=2, dropout=0.3)
    # Not on the command line: the checkpoint's values.
    assert _model_config(configured, saved, set(), Path("x.pt")).dropout == 0.1
    kept = _model_config(configured, saved, {"model.dropout"}, Path("x.pt"))
    assert kept.dropout == 0.3 and kept.d_model == 32
    with pytest.raises(UserError, match="has model.d_model=32 but the command line asks for 64"):
        _model_config(configured, saved, {"model.d_model"}, Path("x.pt"))
    with pytest.raises(UserError, match="model.d_model=32"):  # model=PRESET sets every key
        _model_config(configured, saved, {"model"}, Path("x.pt"))


def test_resume_wins_over_init_from_and_equals_uninterrupted(tmp_path, base_run):
    base = tmp_path / "base"
    shutil.copytree(base_run, base)
    init = (f"trainer.init_from={base}", *COMMON)
    fit(toy_cfg(tmp_path, *init, "trainer.max_steps=12"), tmp_path / "straight")
    fit(toy_cfg(tmp_path, *init, "trainer.max_steps=6"), tmp_path / "resumed")
    shutil.rmtree(base)  # a restart reads only its own last.pt
    fit(toy_cfg(tmp_path, *init, "trainer.max_steps=12"), tmp_path / "resumed")
    straight = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert resumed["train_state"]["step"] == straight["train_state"]["step"] == 12
    for name, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, atol=0, rtol=0, msg=name)


def _one_error_line(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-1500:]


def test_contradicting_override_is_one_line(tmp_path, base_run):
    proc = run_train(tmp_path / "run", f"trainer.init_from={base_run}", "model.d_model=64")
    _one_error_line(proc, "has model.d_model=32 but the command line asks for 64")
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "does not exist"),
        ("unsafe", "refusing to load"),
        ("vocab", "tokenizer.vocab_size=100 but the command line asks for 120"),
        ("no_optimizer", "holds no optimizer state"),
    ],
)
def test_bad_init_from_is_one_line_and_keeps_the_checkpoint(tmp_path, base_run, case, message):
    best = base_run / "checkpoints" / "best.pt"
    before = best.read_bytes()
    args = {
        "missing": [f"trainer.init_from={tmp_path / 'nope'}"],
        "unsafe": [f"trainer.init_from={tmp_path / 'evil.pt'}"],
        "vocab": [f"trainer.init_from={base_run}", "tokenizer.vocab_size=120"],
        "no_optimizer": [f"trainer.init_from={best}", "trainer.init_keep_optimizer=true"],
    }[case]
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"model": shutil.rmtree}, f)  # a pickle that names a function
    _one_error_line(run_train(tmp_path / "run", *args), message)
    assert best.read_bytes() == before


@pytest.mark.slow
def test_torchrun_fine_tuning_resumes_and_equals_uninterrupted(tmp_path, base_run):
    """Under torchrun: 2 ranks start from the checkpoint; a second launch in the same run dir
    resumes (its last.pt wins) and ends where an uninterrupted run does."""
    args = (f"trainer.init_from={base_run}", *COMMON)

    def launch(run_dir: Path, steps: int) -> None:
        cmd = torchrun_cmd(2, run_dir, f"trainer.max_steps={steps}", *args)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]

    launch(tmp_path / "resumed", 6)
    assert "initialised from" in (tmp_path / "resumed" / "train.log").read_text()
    launch(tmp_path / "resumed", 12)
    assert "resumed from" in (tmp_path / "resumed" / "train.log").read_text()
    launch(tmp_path / "straight", 12)
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert a["train_state"]["step"] == b["train_state"]["step"] == 12
    for name, value in a["model"].items():
        torch.testing.assert_close(b["model"][name], value, atol=0, rtol=0, msg=name)
