"""Sinusoidal positional encoding (Vaswani et al. 2017, sec. 3.5).

PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).
"""

from __future__ import annotations

import math

import pytest
import torch

from attnmt.model.positional import SinusoidalPositionalEncoding, sinusoid_table

D = 16


def expected(pos: int, dim: int, d_model: int = D) -> float:
    """The paper's formula, one entry at a time, with `math` instead of torch."""
    angle = pos / 10000 ** ((dim - dim % 2) / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_table_shape_and_dtype() -> None:
    table = sinusoid_table(10, D)
    assert table.shape == (10, D)
    assert table.dtype == torch.float32


def test_position_zero_is_0_1_0_1() -> None:
    table = sinusoid_table(4, D)
    torch.testing.assert_close(table[0], torch.tensor([0.0, 1.0] * (D // 2)), atol=0.0, rtol=0.0)


@pytest.mark.parametrize("pos", [1, 2, 7, 50, 999])
def test_values_match_the_formula(pos: int) -> None:
    table = sinusoid_table(1000, D)
    for dim in (0, 1, 2, 3, 6, 7, D - 2, D - 1):
        assert table[pos, dim].item() == pytest.approx(expected(pos, dim), abs=1e-6), (pos, dim)


def test_frequencies_decrease_along_the_model_dimension() -> None:
    # The first pair turns fastest (wavelength 2*pi), the last slowest (about 10000 * 2*pi):
    # a swapped exponent sign would reverse this.
    table = sinusoid_table(200, D)
    crossings = [
        (table[1:, dim].sign() != table[:-1, dim].sign()).sum().item() for dim in (0, 4, 8)
    ]
    assert crossings[0] > crossings[1] > crossings[2]


def test_forward_adds_the_table_to_the_embeddings() -> None:
    pe = SinusoidalPositionalEncoding(D, dropout=0.0, initial_len=32).eval()
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(pe(x), x + sinusoid_table(5, D), atol=1e-6, rtol=0.0)


@pytest.mark.parametrize("offset", [0, 1, 3, 9])
def test_offset_equals_slicing(offset: int) -> None:
    pe = SinusoidalPositionalEncoding(D, dropout=0.0, initial_len=32).eval()
    x = torch.randn(2, 12, D)  # positions 0..11
    full = pe(x)
    for k in (offset, min(offset + 2, 11)):
        step = pe(x[:, k : k + 1], offset=k)  # one cached decoding step at position k
        torch.testing.assert_close(step, full[:, k : k + 1], atol=1e-6, rtol=0.0)
    window = pe(x[:, offset : offset + 3], offset=offset)  # several tokens at once
    torch.testing.assert_close(window, full[:, offset : offset + 3], atol=1e-6, rtol=0.0)


def test_grows_past_the_initial_table() -> None:
    pe = SinusoidalPositionalEncoding(D, dropout=0.0, initial_len=8).eval()
    x = torch.zeros(1, 1, D)
    out = pe(x, offset=20)[0, 0]  # position 20, beyond the 8 precomputed rows
    assert pe.table.size(0) >= 21
    for dim in range(D):
        assert out[dim].item() == pytest.approx(expected(20, dim), abs=1e-6), dim
    # The grown table agrees with a freshly built one everywhere, old rows included.
    n = pe.table.size(0)
    torch.testing.assert_close(pe.table, sinusoid_table(n, D), atol=0.0, rtol=0.0)
    # And a whole sequence longer than the initial table also works.
    long = pe(torch.zeros(1, 40, D))
    torch.testing.assert_close(long[0], sinusoid_table(40, D), atol=1e-6, rtol=0.0)


def test_rows_at_per_row_positions_grow_the_table() -> None:
    """`rows` (continuous batching: one position per row) reads the table's rows, growing it
    past its initial length as `forward` does."""
    pe = SinusoidalPositionalEncoding(16, initial_len=8)
    positions = torch.tensor([3, 0, 20, 3])
    torch.testing.assert_close(pe.rows(positions, 21), sinusoid_table(21, 16)[positions])
    assert pe.table.size(0) >= 21


def test_table_is_not_saved_in_checkpoints() -> None:
    pe = SinusoidalPositionalEncoding(D, initial_len=8)
    assert "table" not in pe.state_dict()


def test_dropout_only_in_train_mode() -> None:
    pe = SinusoidalPositionalEncoding(D, dropout=0.5, initial_len=8)
    x = torch.randn(2, 6, D)
    pe.train()
    assert not torch.equal(pe(x), pe(x))
    pe.eval()
    torch.testing.assert_close(pe(x), x + sinusoid_table(6, D), atol=1e-6, rtol=0.0)
