"""The two attention scoring functions of the paper's sec. 3.2.1, one head each, standalone.

Teaching code: the model does not use it (it computes every head at once, in
`attnmt.model.attention.MultiHeadAttention`), but the softmax it masks with is the model's.

- Scaled dot-product attention, softmax(q k^T / sqrt(d)) v (Vaswani et al. 2017, eq. 1).
- Additive attention, score(q, k) = w_v . tanh(W_q q + W_k k) (Bahdanau et al. 2015), which the
  paper compares against: similar for small d, but slower and harder to fuse into matmuls.

Keys are masked by their valid lengths (the d2l.ai convention): `valid_lens` (B,) keys per row
or (B, T) keys per query. Legend: B batch, T query len, S key len.

    python examples/attention_scoring.py
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnmt.model.attention import AttentionOutput, masked_softmax


def lengths_to_mask(valid_lens: Tensor, n_keys: int) -> Tensor:
    """Valid lengths per row (B,) or per query (B, T) -> key mask (B, 1, S) or (B, T, S)."""
    positions = torch.arange(n_keys, device=valid_lens.device)  # (S,)
    mask = positions < valid_lens.unsqueeze(-1)  # (B, S) or (B, T, S)
    return mask.unsqueeze(1) if valid_lens.dim() == 1 else mask


def masked_softmax_lengths(
    scores: Tensor, valid_lens: Tensor | None = None, mask: Tensor | None = None
) -> Tensor:
    """The model's `masked_softmax` with the keys given as valid lengths.

    Args:
        scores: (B, T, S) or (B, H, T, S).
        valid_lens: (B,) keys per row, or (B, T) keys per query.
        mask: bool, broadcastable to `scores`, True = may attend (combined with `valid_lens`).

    A row with no valid key returns all zeros rather than NaN.
    """
    if valid_lens is not None:
        len_mask = lengths_to_mask(valid_lens, scores.size(-1))  # (B, 1|T, S)
        while len_mask.dim() < scores.dim():
            len_mask = len_mask.unsqueeze(1)  # broadcast over heads: (B, 1, 1|T, S)
        mask = len_mask if mask is None else mask & len_mask
    return masked_softmax(scores, mask=mask)


class DotProductAttention(nn.Module):
    """Scaled dot-product attention: softmax(q k^T / sqrt(d)) v (Vaswani et al., eq. 1)."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        queries: Tensor,  # (B, T, d)
        keys: Tensor,  # (B, S, d)
        values: Tensor,  # (B, S, dv)
        valid_lens: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        scores = queries @ keys.transpose(-2, -1) / math.sqrt(queries.size(-1))  # (B, T, S)
        weights = masked_softmax_lengths(scores, valid_lens, mask)  # (B, T, S)
        output = self.dropout(weights) @ values  # (B, T, dv)
        return AttentionOutput(output, weights if need_weights else None)


class AdditiveAttention(nn.Module):
    """Additive (Bahdanau) attention: score(q, k) = w_v . tanh(W_q q + W_k k), no biases.

    Queries and keys may have different sizes (Bahdanau et al. 2015, eq. 6 / appendix A).
    """

    def __init__(self, key_size: int, query_size: int, n_hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.W_k = nn.Linear(key_size, n_hidden, bias=False)
        self.W_q = nn.Linear(query_size, n_hidden, bias=False)
        self.w_v = nn.Linear(n_hidden, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        queries: Tensor,  # (B, T, query_size)
        keys: Tensor,  # (B, S, key_size)
        values: Tensor,  # (B, S, dv)
        valid_lens: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        features = self.W_q(queries).unsqueeze(2) + self.W_k(keys).unsqueeze(1)  # (B, T, S, h)
        scores = self.w_v(torch.tanh(features)).squeeze(-1)  # (B, T, S)
        weights = masked_softmax_lengths(scores, valid_lens, mask)  # (B, T, S)
        output = self.dropout(weights) @ values  # (B, T, dv)
        return AttentionOutput(output, weights if need_weights else None)


@torch.no_grad()
def demo() -> None:
    """One query per row over 6 keys, of which the first row has 2 real ones: its padding keys
    get weight 0 under either scoring function."""
    torch.manual_seed(0)
    queries, keys, values = torch.randn(2, 1, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 4)
    valid_lens = torch.tensor([2, 6])
    for attn in (DotProductAttention(), AdditiveAttention(8, 8, n_hidden=16)):
        _, weights = attn.eval()(queries, keys, values, valid_lens, need_weights=True)
        print(type(attn).__name__)
        for row in weights.squeeze(1).tolist():  # (B, S)
            print("  " + " ".join(f"{w:.2f}" for w in row))


if __name__ == "__main__":
    demo()
