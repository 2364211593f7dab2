"""training/schedule.py: warmup peak, inverse-sqrt decay, and the paper's noam formula."""

from __future__ import annotations

import math

import pytest

from attnmt.training.schedule import inverse_sqrt_warmup, noam


def test_inverse_sqrt_warms_up_linearly_to_the_peak_then_decays():
    peak, warmup = 1e-3, 400
    assert inverse_sqrt_warmup(1, peak, warmup) == pytest.approx(peak / warmup)
    assert inverse_sqrt_warmup(200, peak, warmup) == pytest.approx(peak / 2)
    assert inverse_sqrt_warmup(warmup, peak, warmup) == pytest.approx(peak)
    assert inverse_sqrt_warmup(4 * warmup, peak, warmup) == pytest.approx(peak / 2)
    lrs = [inverse_sqrt_warmup(s, peak, warmup) for s in range(1, 3000)]
    assert max(lrs) == pytest.approx(peak) and lrs.index(max(lrs)) == warmup - 1
    assert inverse_sqrt_warmup(0, peak, warmup) == inverse_sqrt_warmup(1, peak, warmup)


def test_noam_is_the_papers_equation_3():
    d_model, warmup = 512, 4000
    for step in (1, 100, 4000, 10_000, 100_000):
        expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert noam(step, d_model, warmup) == pytest.approx(expected)
    peak = noam(warmup, d_model, warmup)  # the maximum is at the end of warmup
    assert peak == pytest.approx(1 / math.sqrt(d_model * warmup))
    assert noam(warmup - 1, d_model, warmup) < peak > noam(warmup + 1, d_model, warmup)
    assert noam(200, d_model, warmup, factor=2.0) == pytest.approx(2 * noam(200, d_model, warmup))
