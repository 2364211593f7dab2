"""scripts/average_checkpoints.py: identical inputs are a fixed point, different ones average."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest
import torch

from attnmt.checkpoint import load_checkpoint, load_for_inference, model_payload, save_checkpoint
from attnmt.data.tokenizer import Tokenizer
from tests.helpers_decoding import SEARCH_MODEL, tiny_tokenizer

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "average_checkpoints.py"


@pytest.fixture(scope="module")
def average() -> ModuleType:
    return importlib.import_module("attnmt.cli.average")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model) -> Path:  # noqa: ANN001
    """A run with step_100 (seed 0), step_20 (seed 1), step_3 (seed 0) and an optimizer state."""
    run = tmp_path_factory.mktemp("run")
    tokenizer: Tokenizer = tiny_tokenizer(run)
    for step, seed in [(100, 0), (20, 1), (3, 0)]:
        model = tiny_model(tokenizer.src_vocab_size, seed=seed, **SEARCH_MODEL)
        state = {"step": step}  # what training writes: train_state, optimizer, ...
        payload = {
            **model_payload(model, tokenizer),
            "train_state": state,
            "optimizer": {"lr": 1.0},
        }
        save_checkpoint(run / "checkpoints" / f"step_{step}.pt", payload)
    return run


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def test_identical_checkpoints_average_to_themselves(average: ModuleType, run_dir: Path) -> None:
    ckpts = run_dir / "checkpoints"
    out = run_dir / "same.pt"
    assert (
        average.main(
            ["--inputs", str(ckpts / "step_3.pt"), str(ckpts / "step_100.pt"), "--output", str(out)]
        )
        == 0
    )
    expected = weights(ckpts / "step_100.pt")
    got = weights(out)
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-6, rtol=0)
        assert got[name].dtype == tensor.dtype


def test_last_k_by_step_number_gives_the_mean(average: ModuleType, run_dir: Path) -> None:
    out = run_dir / "avg.pt"
    assert average.main(["--run-dir", str(run_dir), "--last", "2", "--output", str(out)]) == 0
    ckpt = load_checkpoint(out)
    # steps sort numerically (3 < 20 < 100): the last two are step_20 and step_100
    assert [Path(p).name for p in ckpt["averaged_from"]] == ["step_20.pt", "step_100.pt"]
    assert ckpt["train_state"]["step"] == 100 and "optimizer" not in ckpt
    a, b = (
        weights(run_dir / "checkpoints" / "step_20.pt"),
        weights(run_dir / "checkpoints" / "step_100.pt"),
    )
    for name, tensor in ckpt["model"].items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2, atol=1e-6, rtol=0)
    model, _, _ = load_for_inference(out)  # usable by translate.py
    assert not model.training


def test_too_few_checkpoints_is_one_line(
    average: ModuleType, run_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    assert (
        average.main(["--run-dir", str(run_dir), "--last", "4", "--output", str(run_dir / "x.pt")])
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("average_checkpoints.py: error: --last 4") and "\n" not in err
    assert "has 3" in err
