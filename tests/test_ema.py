"""Weight EMA (`trainer.ema_decay`): the average against its formula, what checkpoints hold,
and an exact resume."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from attnmt.checkpoint import load_checkpoint
from attnmt.data.batching import collate
from attnmt.training import build
from attnmt.training.config import ConfigError, Configs
from attnmt.training.ema import WeightEMA
from attnmt.training.evaluate import valid_loss
from attnmt.training.loop import fit
from tests.train_helpers import params, run_train, toy, toy_cfg


def test_average_follows_the_formula_over_real_updates(tmp_path):
    run = toy(tmp_path, "trainer.ema_decay=0.9", "model.dropout=0.0")
    model, ema = run.trainee.model, run.trainee.ema
    expected = params(model)  # the average starts at the initial weights
    batches = list(run.data.train.select(range(8)).iter(batch_size=4))
    for step, rows in enumerate(batches, start=1):
        run.update([collate(rows["src_ids"], rows["tgt_ids"], run.data.tokenizer.special)])
        d = min(0.9, (1 + step) / (10 + step))
        now = params(model)
        expected = {k: d * expected[k] + (1 - d) * now[k] for k in expected}
    averaged = ema.state_dict(model)
    for name, value in expected.items():
        torch.testing.assert_close(averaged[name], value, atol=1e-6, rtol=1e-5, msg=name)
    assert any(not torch.equal(averaged[k], params(model)[k]) for k in expected)


def test_applied_swaps_in_the_average_and_restores_the_trained_weights():
    model = torch.nn.Linear(3, 2)
    ema = WeightEMA(model, 0.5)
    trained = params(model)
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(step=100)  # d = 0.5: average = (w + w + 1) / 2
    after = params(model)
    with ema.applied():
        torch.testing.assert_close(model.weight, trained["weight"] + 0.5)
    assert all(torch.equal(v, params(model)[k]) for k, v in after.items())


def test_checkpoints_hold_the_average_and_last_keeps_the_trained_weights(tmp_path):
    run_dir = tmp_path / "run"
    fit(toy_cfg(tmp_path, "trainer.ema_decay=0.99", "trainer.max_steps=6"), run_dir)
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    step = load_checkpoint(run_dir / "checkpoints" / "step_6.pt")
    assert set(last["train_weights"]) == set(last["model"])
    assert any(not torch.equal(last["model"][k], last["train_weights"][k]) for k in last["model"])
    for name, value in last["model"].items():  # best and step files: the average
        assert torch.equal(best["model"][name], value) and torch.equal(step["model"][name], value)
    assert "train_weights" not in best
    assert set(step) == set(last)  # a step file can resume the run too (a damaged last.pt)


def test_resume_with_ema_equals_uninterrupted(tmp_path):
    common = ("model.dropout=0.1", "trainer.eval_every=6", "trainer.ema_decay=0.95")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=12"), tmp_path / "straight")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=6"), tmp_path / "resumed")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=12"), tmp_path / "resumed")
    straight = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    for key in ("model", "train_weights"):
        for name, value in straight[key].items():
            torch.testing.assert_close(resumed[key][name], value, atol=0, rtol=0, msg=name)


def test_validation_scores_the_average(tmp_path):
    """The valid loss that fit() reports is that of the averaged weights, not the trained."""
    overrides = ("trainer.max_steps=12", "trainer.eval_every=12", "trainer.ema_decay=0.9")
    reported = fit(toy_cfg(tmp_path, *overrides), tmp_path / "run").results["valid"]["loss"]
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    run = toy(tmp_path, *overrides)
    batches = build.valid_batches(run.data, run.cfg, run.ctx)

    def loss_of(weights: dict) -> float:
        run.trainee.model.load_state_dict(weights)
        smoothing = run.cfg.optim.label_smoothing
        return valid_loss(run.trainee.model, batches, smoothing, nullcontext, run.ctx)[0]

    averaged, trained = loss_of(last["model"]), loss_of(last["train_weights"])
    assert averaged != pytest.approx(trained, abs=1e-4)  # the two differ, and fit() used:
    assert reported == pytest.approx(averaged, abs=1e-6)


@pytest.mark.parametrize("decay", ["1.0", "-0.1"])
def test_bad_decay_is_one_line(tmp_path, decay):
    with pytest.raises(ConfigError, match="trainer.ema_decay"):
        Configs.from_hydra(toy_cfg(tmp_path, f"trainer.ema_decay={decay}"))
    out = run_train(tmp_path / "bad", f"trainer.ema_decay={decay}")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "trainer.ema_decay" in out.stderr.strip().splitlines()[-1]
