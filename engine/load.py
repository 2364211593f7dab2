"""Loading checkpoints for translation: each model becomes an `Engine`, several an `Ensemble`
of engines. What `translate.py` and the benchmarks load through."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from attnmt.checkpoint import CheckpointError, load_for_inference
from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding.ensemble import Ensemble
from attnmt.engine.engine import Engine
from attnmt.engine.packing import Packing


def load_engine(
    paths: Sequence[str | Path],
    device: str | torch.device = "cpu",
    quantize: str = "none",
    pack: bool | Packing | None = None,
) -> tuple[nn.Module, Tokenizer]:
    """Checkpoints or run dirs -> (an `Engine` on `device`, or an `Ensemble` of several; their
    tokenizer). `quantize="int8"` gives each engine int8 linear layers (CPU only); `pack` is
    `Engine`'s (None: what paid here).

    Raises:
        CheckpointError: a checkpoint is unusable, or its tokenizer (SentencePiece models or
            special ids) differs from the first one's.
    """
    if not paths:
        raise ValueError("load_engine needs at least one checkpoint")
    models, tokenizer = [], None
    for path in paths:
        model, tok, _ = load_for_inference(path, device)
        if tokenizer is None:
            tokenizer = tok
        elif tok.state_dict() != tokenizer.state_dict() or tok.special != tokenizer.special:
            raise CheckpointError(
                f"-c {path} was trained with a different tokenizer than -c {paths[0]} "
                "(SentencePiece model or special ids differ); ensemble only checkpoints that "
                "share one tokenizer (the same spm.model)"
            )
        models.append(Engine(model, quantize, pack))
    assert tokenizer is not None
    return (models[0] if len(models) == 1 else Ensemble(models)), tokenizer
