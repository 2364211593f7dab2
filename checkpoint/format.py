"""The checkpoint format, owned by inference and shared with training.

A checkpoint is one self-contained file: weights, model config and tokenizer (`model_payload`),
plus, for `last.pt`, what training needs to resume (optimizer, train state, RNG; see
`training/loop.py`). Saved with `torch.save` and loaded with `torch.load(weights_only=True)`:
only tensors and plain containers, so loading a checkpoint can never run code. Writes are
atomic (temp file + rename), so a run killed at any moment leaves the previous file intact.

Checksum: `save_checkpoint` stores `checksum` in the payload itself: a CRC-32 (zlib) over
every tensor's dtype, shape and bytes and every other value's type and `repr`, walked in the
payload's own order (`payload_checksum`). Inside the file, so `torch.load(weights_only=True)`
still reads it and nothing travels beside it. `load_checkpoint` recomputes it on every load
(training resume, `init_from`, `translate.py`, `serve.py`, the exports, averaging): a truncated
or zero-length file, or one flipped byte anywhere in tensor data or metadata, is refused in one
line naming the file (`CorruptCheckpointError`). CRC-32 detects every burst of up to 32 flipped
bits; it is a check against damage, not against tampering (loading stays `weights_only` for
that). Checkpoints written before the checksum load with one log line saying so. Cost on a
`base` checkpoint: docs/benchmarks.md#checkpoint-checksums.

A run dir keeps them in `checkpoints/`: `last.pt` (resume), `best.pt` (best valid BLEU) and the
newest `trainer.keep_last` `step_<N>.pt` (for averaging, `scripts/average_checkpoints.py`).
"""

from __future__ import annotations

import logging
import pickle
import re
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import torch

from attnmt.common.errors import UserError
from attnmt.common.files import atomic_write
from attnmt.data.errors import DataError
from attnmt.data.tokenizer import Tokenizer
from attnmt.data.tokenizers import load_tokenizer
from attnmt.model import ModelConfig, Transformer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CHECKSUM_KEY = "checksum"  # {"crc32": int}: see the module docstring


class CheckpointError(UserError):
    """A checkpoint that cannot be used; the message is one line: problem and fix."""


class CorruptCheckpointError(CheckpointError):
    """The file is damaged (truncated, empty, a checksum that does not match): another
    checkpoint of the same run may be intact (training's resume falls back to one)."""


class InferenceBundle(NamedTuple):
    model: Transformer
    tokenizer: Tokenizer
    checkpoint: dict[str, Any]


def model_payload(
    model: Transformer, tokenizer: Tokenizer, weights: dict[str, torch.Tensor] | None = None
) -> dict[str, Any]:
    """What every checkpoint holds: enough to translate with nothing else. `weights` (default:
    the model's own) are what `model` holds, e.g. training's weight average."""
    return {
        "format_version": FORMAT_VERSION,
        "model_config": asdict(model.cfg),
        "model": model.state_dict() if weights is None else weights,
        "tokenizer": tokenizer.state_dict(),
    }


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (e.g. the disk is full); nothing was lost."""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write `payload` with its checksum to `path` atomically.

    Raises:
        CheckpointWriteError: the write failed (a full disk, a quota, an I/O error): the
            partial temp file is removed and the previous `path`, if any, is untouched.
    """
    path = Path(path)
    stored = {**payload, CHECKSUM_KEY: {"crc32": payload_checksum(payload)}}
    try:
        atomic_write(path, lambda f: torch.save(stored, f))
    except (OSError, RuntimeError) as e:
        raise CheckpointWriteError(
            f"cannot write checkpoint {path} ({_os_reason(e)}); the partial file was removed "
            f"and the previous {path.name}, if any, is intact: free space in {path.parent} "
            "(or fix it) and rerun the same command to resume"
        ) from None


def _os_reason(error: BaseException) -> str:
    """The OS error behind `error` (torch's writer wraps it in a RuntimeError), for a message."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return f"{seen.strerror}, errno {seen.errno}"
        seen = seen.__cause__ or seen.__context__
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def payload_checksum(payload: dict[str, Any]) -> int:
    """CRC-32 of everything in `payload` but its checksum: tensors by dtype, shape and bytes,
    other values by type and `repr`, containers in their own order (which `torch.save` and
    `torch.load` keep). The same value after a save and a load, whatever `map_location`."""
    crc = 0

    def feed(data: bytes | memoryview) -> None:
        nonlocal crc
        crc = zlib.crc32(data, crc)

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach()
            feed(f"T{t.dtype}{tuple(t.shape)};".encode())
            if t.numel():
                flat = t.cpu().contiguous().reshape(-1).view(torch.uint8)
                feed(memoryview(flat.numpy()))
        elif isinstance(value, dict):
            feed(b"{%d;" % len(value))
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, list | tuple):
            feed(b"%s%d;" % (type(value).__name__.encode(), len(value)))
            for item in value:
                walk(item)
        elif isinstance(value, bytes | bytearray):
            feed(b"B%d;" % len(value))
            feed(value)
        else:
            feed(f"{type(value).__name__}:{value!r};".encode())

    walk({k: v for k, v in payload.items() if k != CHECKSUM_KEY})
    return crc


_STEP_FILE = re.compile(r"step_(\d+)\.pt")


def step_checkpoints(folder: str | Path) -> list[Path]:
    """The `step_<N>.pt` files of a checkpoints folder, oldest (smallest N) first."""
    found = [
        (int(m.group(1)), p)
        for p in Path(folder).glob("step_*.pt")
        if (m := _STEP_FILE.fullmatch(p.name))
    ]
    return [path for _, path in sorted(found)]


def keep_newest_step_checkpoints(folder: str | Path, keep: int) -> None:
    """Delete all but the `keep` newest `step_<N>.pt` files."""
    for old in step_checkpoints(folder)[:-keep] if keep > 0 else step_checkpoints(folder):
        old.unlink(missing_ok=True)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run dir (-> checkpoints/best.pt, else checkpoints/last.pt)."""
    path = Path(path)
    if path.is_dir():
        for name in ("best.pt", "last.pt"):
            if (path / "checkpoints" / name).is_file():
                return path / "checkpoints" / name
        raise CheckpointError(
            f"no checkpoint in run dir {path}: expected {path}/checkpoints/best.pt or last.pt; "
            "pass a run dir that has finished at least one validation, or a .pt file"
        )
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}; pass a run dir or a .pt file with -c")
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint safely (`weights_only=True`), verify its checksum and check its
    format version.

    Raises:
        CorruptCheckpointError: the file is empty, truncated or its checksum does not match.
        CheckpointError: not a checkpoint of this toolkit, or of another format version.
    """
    path = resolve_checkpoint(path)
    if path.stat().st_size == 0:
        raise CorruptCheckpointError(
            f"checkpoint {path} is empty (0 bytes: a save that never finished); "
            "use another checkpoint of the run (e.g. checkpoints/step_N.pt or best.pt)"
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"refusing to load {path}: it contains Python objects that could run code ({first}); "
            "only checkpoints written by this toolkit can be loaded"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError, KeyError, IndexError) as e:
        reason = str(e).splitlines()[0] if str(e) else ""
        raise CorruptCheckpointError(
            f"cannot read checkpoint {path} ({type(e).__name__}: {reason}); the file is "
            "truncated or not a checkpoint: use another one (e.g. checkpoints/step_N.pt)"
        ) from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        raise CheckpointError(f"{path} is not a checkpoint of this toolkit (no model/model_config)")
    verify_checksum(ckpt, path)
    version = ckpt.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {version}, this code reads version "
            f"{FORMAT_VERSION}; use the toolkit version that wrote it"
        )
    return ckpt


def verify_checksum(ckpt: dict[str, Any], path: str | Path) -> None:
    """Raise CorruptCheckpointError unless `ckpt`'s stored checksum matches its content; a
    checkpoint saved before checksums existed passes with one log line."""
    stored = ckpt.get(CHECKSUM_KEY)
    if stored is None:
        log.info("%s has no checksum (written by an older version): loaded unverified", path)
        return
    expected = stored.get("crc32") if isinstance(stored, dict) else None
    actual = payload_checksum(ckpt)
    if expected != actual:
        raise CorruptCheckpointError(
            f"checkpoint {path} is damaged: its checksum does not match its content "
            f"(stored {expected}, computed {actual}); use another checkpoint of the run "
            "(e.g. checkpoints/step_N.pt or best.pt)"
        )


def build_model(
    model_cfg: ModelConfig,
    weights: dict[str, torch.Tensor] | None = None,
    device: str | torch.device = "cpu",
) -> Transformer:
    """The one place a `Transformer` is made from its config, on `device`: freshly initialised
    in train mode (training), or holding `weights` in eval mode (a checkpoint's).

    The model is built on the CPU and then moved, so its initial weights are the same for every
    device under one seed.

    Raises:
        CheckpointError: `weights` do not fit `model_cfg` (another version of the model code).
    """
    if weights is None:
        return Transformer(model_cfg).to(device)
    try:
        model = Transformer(model_cfg)
        model.load_state_dict(weights)
    except (TypeError, ValueError, RuntimeError) as e:
        raise _mismatch(e) from None
    return model.eval().to(device)


def stored_model(ckpt: dict[str, Any], device: str | torch.device = "cpu") -> Transformer:
    """The model a loaded checkpoint holds (its config and weights), in eval mode on `device`."""
    try:
        model_cfg = ModelConfig(**ckpt["model_config"])
    except (TypeError, ValueError) as e:
        raise _mismatch(e) from None
    return build_model(model_cfg, ckpt["model"], device)


def _mismatch(error: Exception) -> CheckpointError:
    return CheckpointError(
        f"checkpoint does not match this model code ({str(error).splitlines()[0]}); "
        "use the toolkit version that wrote it"
    )


def load_for_inference(path: str | Path, device: str | torch.device = "cpu") -> InferenceBundle:
    """Checkpoint file or run dir -> (model on `device`, tokenizer, raw checkpoint)."""
    ckpt = load_checkpoint(path)
    return InferenceBundle(stored_model(ckpt, device), stored_tokenizer(ckpt, path), ckpt)


def stored_tokenizer(ckpt: dict[str, Any], path: str | Path) -> Tokenizer:
    """The tokenizer inside a loaded checkpoint (`path` names it in the error).

    Building no model runs no torch op: what a process that hosts CTranslate2 needs, since a
    torch op there makes the OpenMP runtime they share slow CTranslate2 down (see
    `benchmarks.peers.ct2_from_folder`)."""
    try:
        return load_tokenizer(ckpt["tokenizer"])
    except (DataError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"the tokenizer stored in {path} is unusable ({e}); "
            "use a checkpoint written by train.py"
        ) from None
