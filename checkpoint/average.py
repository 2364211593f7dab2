"""Averaging the weights of several checkpoints into one (Vaswani et al. 2017, sec. 6.1):
floating-point weights averaged in float32 and cast back to their dtype; other tensors
(integer buffers) from the last input, as are the model config, the tokenizer and the run's
decoding. Optimizer and other training state are dropped: the result is for translation (and
further averaging), not for resuming training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnmt.checkpoint.format import CheckpointError, load_checkpoint, step_checkpoints

# What survives averaging: everything translate.py needs (the run's "decoding" included: its
# default search and precision), plus harmless metadata (the last input's train_state says
# which step the average ends at).
_KEEP = ("format_version", "model_config", "tokenizer", "train_state", "config", "decoding")


def last_step_checkpoints(run_dir: Path, k: int) -> list[Path]:
    """The `k` newest `run_dir/checkpoints/step_<N>.pt`, oldest first (ordered by N)."""
    folder = run_dir / "checkpoints"
    steps = step_checkpoints(folder)
    if len(steps) < k:
        raise CheckpointError(
            f"--last {k} needs {k} step checkpoints but {folder} has {len(steps)}; "
            "lower --last or pass files with --inputs"
        )
    return steps[-k:]


def average_state_dicts(state_dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Mean of float tensors (computed in float32, cast back); other tensors from the last."""
    last = state_dicts[-1]
    for i, state in enumerate(state_dicts[:-1]):
        if state.keys() != last.keys():
            missing = sorted(set(state.keys()) ^ set(last.keys()))[:3]
            raise CheckpointError(
                f"checkpoint {i} has different parameters than the last one ({', '.join(missing)}"
                "...); average checkpoints of one model only"
            )
    averaged: dict[str, torch.Tensor] = {}
    shared: dict[tuple, torch.Tensor] = {}  # tied weights (one storage, several names) stay tied
    for name, tensor in last.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape)
        if key in shared:
            averaged[name] = shared[key]
            continue
        if not torch.is_floating_point(tensor):
            averaged[name] = shared[key] = tensor.clone()
            continue
        shapes = {tuple(state[name].shape) for state in state_dicts}
        if len(shapes) > 1:
            raise CheckpointError(
                f"parameter {name} has shapes {sorted(shapes)}; "
                "average checkpoints of one model only"
            )
        total = torch.zeros(tensor.shape, dtype=torch.float32)
        for state in state_dicts:
            total += state[name].float()
        averaged[name] = shared[key] = (total / len(state_dicts)).to(tensor.dtype)
    return averaged


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """Load `paths` and return one checkpoint payload with their averaged weights."""
    checkpoints = [load_checkpoint(path, map_location="cpu") for path in paths]
    last = checkpoints[-1]
    payload = {key: last[key] for key in _KEEP if key in last}
    payload["model"] = average_state_dicts([ckpt["model"] for ckpt in checkpoints])
    payload["averaged_from"] = [str(path) for path in paths]
    return payload
