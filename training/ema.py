"""Exponential moving average of the weights (`trainer.ema_decay`; Marian's
`--exponential-smoothing`, fairseq's `--ema-decay`).

After every optimizer update: ema <- ema + (1 - d_t) * (w - ema), with the decay warmed up as
d_t = min(decay, (1 + t) / (10 + t)) at update t (TensorFlow's `num_updates` rule), so that the
first updates are not averaged with the random initial weights.

Validation, `best.pt` and `step_N.pt` use the averaged weights, as Marian does: a checkpoint's
`model` is always the weights to translate with. `last.pt` also keeps the trained weights
(`train_weights`) so a resumed run continues exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class WeightEMA:
    """A float32 shadow copy of a model's parameters, updated after each optimizer step."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.params = list(model.parameters())
        self.shadow = [p.detach().float().clone() for p in self.params]

    def decay_at(self, step: int) -> float:
        """The decay used for update number `step` (1-based): warmed up, capped at `decay`."""
        return min(self.decay, (1.0 + step) / (10.0 + step))

    @torch.no_grad()
    def update(self, step: int, skip: Tensor | None = None) -> None:
        """Fold the current weights in, after optimizer update number `step`; not when `skip`
        (a 0-d bool on the device: the update was skipped), decided on the device."""
        weight = 1.0 - self.decay_at(step)
        current = [p.detach().float() for p in self.params]
        if skip is None:
            torch._foreach_lerp_(self.shadow, current, weight)
            return
        diff = torch._foreach_sub(current, self.shadow)
        torch._foreach_mul_(diff, torch.where(skip, 0.0, weight).float())
        torch._foreach_add_(self.shadow, diff)

    def state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        """`model.state_dict()` with every parameter replaced by its average."""
        by_id = {id(p): s for p, s in zip(self.params, self.shadow, strict=True)}
        return {
            name: by_id[id(t)].to(t.dtype).clone() if id(t) in by_id else t.detach()
            for name, t in model.state_dict(keep_vars=True).items()
        }

    @torch.no_grad()
    def load_state_dict(self, model: nn.Module, weights: dict[str, Tensor]) -> None:
        """Set the averages from a state dict of `model` (e.g. a checkpoint's `model`)."""
        by_id = {id(p): s for p, s in zip(self.params, self.shadow, strict=True)}
        for name, t in model.state_dict(keep_vars=True).items():
            if id(t) in by_id:
                by_id[id(t)].copy_(weights[name])

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Run the block with the averaged weights in the model; the trained ones come back."""
        saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, saved)
