"""Sinusoidal positional encoding (Vaswani et al. 2017, sec. 3.5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnmt.model.config import PositionLayout


def sinusoid_table(
    n_positions: int, d_model: int, layout: PositionLayout = "interleaved", pad_id: int = 0
) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Shape: (n_positions, d_model), float32. The other layouts are those of imported models:
    `halves` (OPUS-MT / Marian) puts the same sines in the first half of the dimensions and the
    cosines in the second; `fairseq` (M2M100, NLLB) also uses halves, with the frequencies
    10000^(-i / (d/2 - 1)) in float32, and numbers positions from `pad_id + 1`.
    """
    if layout == "fairseq":  # fairseq's / Transformers' get_embedding, the same float32 ops
        half = d_model // 2
        inv_freq = torch.exp(torch.arange(half).float() * -(math.log(10000) / (half - 1)))
        angles = torch.arange(pad_id + 1, pad_id + 1 + n_positions).float()[:, None] * inv_freq
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
        return torch.cat([table, torch.zeros(n_positions, d_model % 2)], dim=1)
    position = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
    )  # (D/2,)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    if layout == "halves":
        sines = (d_model + 1) // 2
        table[:, :sines] = torch.sin(position * inv_freq)
        table[:, sines:] = torch.cos(position * inv_freq[: d_model // 2])
    else:
        table[:, 0::2] = torch.sin(position * inv_freq)  # even dims
        table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])  # odd dims
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Adds position signals to embeddings, then dropout.

    The table is precomputed for `initial_len` positions and grows (doubling) when a longer
    input arrives, so there is no length limit to hit by surprise. It is a non-persistent buffer:
    checkpoints do not depend on it.
    """

    def __init__(
        self,
        d_model: int,
        dropout: float = 0.0,
        initial_len: int = 1024,
        layout: PositionLayout = "interleaved",
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.layout, self.pad_id = layout, pad_id  # see `sinusoid_table`
        self.dropout = nn.Dropout(dropout)
        table = sinusoid_table(initial_len, d_model, layout, pad_id)
        self.register_buffer("table", table, persistent=False)

    def _grow(self, n_positions: int) -> None:
        size = self.table.size(0)
        while size < n_positions:
            size *= 2
        table = sinusoid_table(size, self.d_model, self.layout, self.pad_id)
        self.table = table.to(self.table.device)

    def rows(self, positions: Tensor, end: int) -> Tensor:
        """The table's rows at `positions` (N,) long, all below `end` -> (N, D): one position
        per row, for rows at different positions (`end` given so that no value is read back)."""
        if end > self.table.size(0):
            self._grow(end)
        return self.table.index_select(0, positions)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) embeddings of positions offset..offset+T-1 -> (B, T, D)."""
        end = offset + x.size(1)
        if end > self.table.size(0):
            self._grow(end)
        x = x + self.table[offset:end].to(x.dtype)  # table slice: (T, D)
        return self.dropout(x) if self.training else x  # skipped at inference: a module call
