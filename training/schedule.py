"""Learning-rate schedules: pure functions of the update number (no state to checkpoint)."""

from __future__ import annotations

import math


def inverse_sqrt_warmup(step: int, peak_lr: float, warmup_steps: int) -> float:
    """Linear warmup to `peak_lr`, then decay with 1/sqrt(step) (fairseq's `inverse_sqrt`).

    `step` counts updates from 1.
    """
    step = max(step, 1)
    if step < warmup_steps:
        return peak_lr * step / warmup_steps
    return peak_lr * math.sqrt(warmup_steps / step)


def noam(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """The paper's schedule (Vaswani et al. 2017, eq. 3):
    lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
