"""checkpoint/format.py: the checksum written with every checkpoint and checked on every load.

A zero-length file, a truncated one and one flipped byte in tensor data are each refused with
one line naming the file, in process and through every program that loads checkpoints, run
as users run them."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from attnmt.checkpoint import (
    CheckpointError,
    CorruptCheckpointError,
    load_checkpoint,
    model_payload,
    payload_checksum,
    save_checkpoint,
)
from attnmt.checkpoint.format import CHECKSUM_KEY

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def tensor_offset(path: Path, name: str = "data/0") -> int:
    """Where the bytes of the zip record `*/<name>` (a tensor's storage) start in `path`."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(name))
    with open(path, "rb") as f:  # the local header: 30 bytes + name + extra field
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
    return info.header_offset + 30 + name_len + extra_len


def flip_byte_in_tensor_data(src: Path, dst: Path) -> None:
    data = bytearray(src.read_bytes())
    data[tensor_offset(src) + 5] ^= 0x10
    dst.write_bytes(bytes(data))


def damage(kind: str, src: Path, dst: Path) -> None:
    """Write a damaged copy of `src` to `dst`: what a full disk, a crash or bit rot leaves."""
    if kind == "empty":
        dst.write_bytes(b"")
    elif kind == "truncated":
        dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    else:
        flip_byte_in_tensor_data(src, dst)


DAMAGE = ["empty", "truncated", "flipped byte"]


def test_checksum_round_trips_and_survives_torch_load(checkpoint: Path) -> None:
    raw = torch.load(checkpoint, weights_only=True)  # plain weights_only load still works
    assert raw[CHECKSUM_KEY]["crc32"] == payload_checksum(raw)
    assert load_checkpoint(checkpoint)["model"].keys() == raw["model"].keys()


def test_checksum_sees_every_tensor_value_and_the_metadata(model, tokenizer) -> None:  # noqa: ANN001
    payload = model_payload(model, tokenizer)
    base = payload_checksum(payload)
    weights = {k: v.clone() for k, v in payload["model"].items()}
    name = next(iter(weights))
    weights[name].view(-1)[0] += 1e-6
    assert payload_checksum({**payload, "model": weights}) != base
    config = {**payload["model_config"], "d_ff": payload["model_config"]["d_ff"] + 1}
    assert payload_checksum({**payload, "model_config": config}) != base
    assert payload_checksum({**payload, CHECKSUM_KEY: {"crc32": 1}}) == base


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_checkpoint_is_refused_in_one_line(
    kind: str, checkpoint: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "damaged.pt"
    damage(kind, checkpoint, bad)
    with pytest.raises(CorruptCheckpointError) as error:
        load_checkpoint(bad)
    message = str(error.value)
    assert str(bad) in message and "\n" not in message


def test_a_flipped_byte_loads_silently_without_the_checksum(checkpoint: Path, tmp_path: Path):
    """What the checksum is for: torch.load itself takes the flipped byte as a weight."""
    bad = tmp_path / "flipped.pt"
    flip_byte_in_tensor_data(checkpoint, bad)
    good, wrong = (torch.load(p, weights_only=True)["model"] for p in (checkpoint, bad))
    assert any(not torch.equal(good[k], wrong[k]) for k in good)


def test_checkpoint_without_checksum_loads_with_one_log_line(
    checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = tmp_path / "old.pt"
    payload = torch.load(checkpoint, weights_only=True)
    del payload[CHECKSUM_KEY]
    torch.save(payload, old)  # what checkpoints written before the checksum look like
    with caplog.at_level(logging.INFO, logger="attnmt.checkpoint.format"):
        loaded = load_checkpoint(old)
    assert [r.getMessage() for r in caplog.records] == [
        f"{old} has no checksum (written by an older version): loaded unverified"
    ]
    assert loaded["model"].keys() == payload["model"].keys()


def _one_line(result: subprocess.CompletedProcess, *words: str) -> None:
    err = result.stderr
    assert result.returncode != 0, err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if "error" in line.lower()]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], (word, err)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )


def test_every_program_that_loads_a_checkpoint_refuses_a_flipped_byte(
    checkpoint: Path, tmp_path: Path
) -> None:
    """translate.py, serve.py, export.py, average_checkpoints.py, as users run them (training's
    resume and init_from: tests/test_train_faults.py)."""
    bad = tmp_path / "flipped.pt"
    flip_byte_in_tensor_data(checkpoint, bad)
    words = (str(bad), "checksum does not match")
    _one_line(_run("translate.py", "-c", str(bad), "Ein Mann."), *words)
    _one_line(
        _run("scripts/average_checkpoints.py", "--inputs", str(bad), str(checkpoint),
             "--output", str(tmp_path / "avg.pt")),
        *words,
    )  # fmt: skip
    assert not (tmp_path / "avg.pt").exists()
    _one_line(_run("scripts/export.py", "ct2", "-c", str(bad), "-o", str(tmp_path / "ct2")), *words)
    _one_line(_run("serve.py", "-c", str(bad), "--port", "0"), *words)


def test_a_damaged_file_is_not_a_checkpoint_error_of_another_kind(tmp_path: Path) -> None:
    """Damage (fall back to another file) and a wrong file (the user's mistake) differ."""
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "other.pt")
    assert not isinstance(error.value, CorruptCheckpointError)


def test_save_checkpoint_keeps_the_callers_payload(checkpoint: Path, tmp_path: Path) -> None:
    payload = load_checkpoint(checkpoint)
    payload.pop(CHECKSUM_KEY)
    save_checkpoint(tmp_path / "again.pt", payload)
    assert CHECKSUM_KEY not in payload
    assert load_checkpoint(tmp_path / "again.pt")[CHECKSUM_KEY]["crc32"] == payload_checksum(
        payload
    )
