"""Attention (Vaswani et al. 2017, sec. 3.2): masks, masked softmax, multi-head attention and
its KV cache. The paper's other scoring function, additive attention, and single-head scaled
dot-product attention are teaching code in examples/attention_scoring.py.

Legend: B batch, T query len, S key len, D d_model, H heads, Dh head dim (D / H).
Masks are bool and True means "may attend" (the convention of
`F.scaled_dot_product_attention`, and the opposite of `nn.MultiheadAttention`'s
`key_padding_mask`). Keys are masked, never queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class AttentionOutput(NamedTuple):
    output: Tensor  # (B, T, D) or, per head, (B, H, T, Dh)
    weights: Tensor | None  # (B, H, T, S), only when asked for


# ---------------------------------------------------------------------------- masks


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, S) bool, True at real tokens."""
    return ids.ne(pad_id)


def causal_mask(
    n_queries: int, n_keys: int | None = None, device: torch.device | None = None
) -> Tensor:
    """(T, S) bool: query i may see keys j <= i + (S - T).

    Right-aligned, so that with a KV cache (S > T: the queries are the last T positions) each
    query still sees exactly its own past. `torch.tril(ones(T, S))` would be top-left aligned,
    which is wrong for cached steps.
    """
    n_keys = n_queries if n_keys is None else n_keys
    q_pos = torch.arange(n_queries, device=device).unsqueeze(1) + (n_keys - n_queries)  # (T, 1)
    k_pos = torch.arange(n_keys, device=device).unsqueeze(0)  # (1, S)
    return k_pos <= q_pos  # (T, S)


def masked_softmax(scores: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis of `scores` (B, H, T, S) in which keys where the bool `mask`
    (broadcastable to `scores`) is False get weight exactly 0. A row with no valid key returns
    all zeros rather than NaN. `mask` is keyword-only: a positional tensor of valid lengths
    (what `examples/attention_scoring.py` takes) would broadcast as a mask."""
    if mask is None:
        return F.softmax(scores, dim=-1)
    weights = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # empty rows: NaN -> 0


# ------------------------------------------------------------- multi-head attention


@dataclass
class KVCache:
    """One decoder layer's cached keys and values, so that decoding a token costs one token
    (fairseq's incremental state, typed).

    Self-attention: the keys/values of the t positions decoded so far, one row per hypothesis
    (N rows); each step appends its position. Cross-attention: keys/values computed once from
    the encoder output (fairseq's `static_kv`), one row per sentence (B rows): the K = N / B
    hypotheses of a beam search (consecutive rows) all read their sentence's row.

    Search keeps the rows in step with its hypotheses: `reorder_beams` after beams are
    re-ranked within their sentences, `reorder` when sentences are pruned.
    """

    self_k: Tensor | None = None  # (N, H, t, Dh)
    self_v: Tensor | None = None
    cross_k: Tensor | None = None  # (B, H, S, Dh)
    cross_v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add T new positions (N, H, T, Dh); return all keys and values (N, H, t + T, Dh)."""
        if self.self_k is None or self.self_v is None:
            self.self_k, self.self_v = k, v
        else:
            self.self_k = torch.cat([self.self_k, k], dim=2)
            self.self_v = torch.cat([self.self_v, v], dim=2)
        return self.self_k, self.self_v

    def reorder_beams(self, rows: Tensor) -> None:
        """Row i of the self-attention cache takes the history of row `rows[i]` (N',)."""
        if self.self_k is not None and self.self_v is not None:
            self.self_k = self.self_k.index_select(0, rows)
            self.self_v = self.self_v.index_select(0, rows)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows `rows` (N',) of the self-attention cache and sentences `sentences` (B',)
        of the cross-attention cache (default `rows`: one row per sentence)."""
        self.reorder_beams(rows)
        sentences = rows if sentences is None else sentences
        if self.cross_k is not None and self.cross_v is not None:
            self.cross_k = self.cross_k.index_select(0, sentences)
            self.cross_v = self.cross_v.index_select(0, sentences)


def split_heads(x: Tensor, n: int, n_heads: int) -> Tensor:
    """n projections side by side, (B, T, n * D) -> (n, B, H, T, Dh): each split into heads."""
    B, T, width = x.shape
    x = x.view(B, T, n, n_heads, width // (n * n_heads))  # (B, T, n, H, Dh)
    return x.permute(2, 0, 3, 1, 4)  # (n, B, H, T, Dh)


def attention(
    q: Tensor,  # (B, H, T, Dh)
    k: Tensor,  # (B, H, S, Dh)
    v: Tensor,  # (B, H, S, Dh)
    mask: Tensor | None = None,  # bool, broadcastable to (B, H, T, S)
    is_causal: bool = False,  # query i sees keys <= i (right-aligned when T < S)
    dropout: nn.Dropout | None = None,  # on the weights, in training mode
    need_weights: bool = False,
) -> AttentionOutput:
    """Scaled dot-product attention of every head: softmax(q k^T / sqrt(Dh)) v (eq. 1).

    The kernel is `F.scaled_dot_product_attention`; when the weights are asked for, an explicit
    path computes them. Both give the same output, (B, H, T, Dh), and the weights (B, H, T, S)
    only when asked for.
    """
    # bf16/fp16 on the CPU take the explicit path too: SDPA's CPU kernel is slower in bf16
    # than in fp32 (its backward most), while bf16 matmuls + an fp32 softmax are faster than
    # either at Multi30k's lengths (docs/benchmarks.md, "bf16 against fp32").
    dropout_p = dropout.p if dropout is not None and dropout.training else 0.0
    explicit = need_weights or (q.device.type == "cpu" and q.dtype != torch.float32)
    if is_causal and (explicit or mask is not None or q.size(2) != k.size(2)):
        # SDPA's is_causal is top-left aligned and cannot be combined with a mask: build ours.
        causal = causal_mask(q.size(2), k.size(2), q.device)  # (T, S)
        mask = causal if mask is None else mask & causal
        is_causal = False
    if not explicit:
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )  # (B, H, T, Dh)
        return AttentionOutput(context, None)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    weights = masked_softmax(scores.float(), mask=mask).to(q.dtype)  # (B, H, T, S)
    kept = dropout(weights) if dropout is not None and dropout_p > 0 else weights
    context = kept @ v  # (B, H, T, Dh)
    return AttentionOutput(context, weights if need_weights else None)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., sec. 3.2.2), batch-first.

    One fused input projection `in_proj` (D -> 3D, laid out q | k | v): self-attention projects
    q, k, v in one matmul; cross-attention projects q from the decoder and k, v from the encoder
    output with the two slices of the same weight. The kernel is
    `F.scaled_dot_product_attention` (flash / memory-efficient); when the weights are asked
    for, an explicit path computes them. Both paths give the same output.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = nn.Dropout(dropout)  # on the attention weights
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, D) -> q, k, v, each (B, H, T, Dh), with one matmul."""
        q, k, v = split_heads(self.in_proj(x), 3, self.n_heads)
        return q, k, v

    def project_q(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, Dh): the q slice of `in_proj`."""
        D, weight, bias = self.d_model, self.in_proj.weight, self.in_proj.bias
        return split_heads(F.linear(x, weight[:D], bias[:D]), 1, self.n_heads)[0]

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) -> k, v, each (B, H, S, Dh): the k | v slice of `in_proj`."""
        D, weight, bias = self.d_model, self.in_proj.weight, self.in_proj.bias
        k, v = split_heads(F.linear(x, weight[D:], bias[D:]), 2, self.n_heads)
        return k, v

    def attend(
        self,
        q: Tensor,  # (B, H, T, Dh)
        k: Tensor,  # (B, H, S, Dh)
        v: Tensor,  # (B, H, S, Dh)
        mask: Tensor | None = None,  # bool, broadcastable to (B, H, T, S)
        is_causal: bool = False,  # query i sees keys <= i (right-aligned when T < S)
        need_weights: bool = False,
    ) -> AttentionOutput:
        """softmax(q k^T / sqrt(Dh)) v per head, heads concatenated, then `out_proj` (eq. 1)."""
        context, weights = attention(q, k, v, mask, is_causal, self.dropout, need_weights)
        B, H, T, Dh = context.shape
        context = context.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, D)
        return AttentionOutput(self.out_proj(context), weights)

    def forward(
        self,
        query: Tensor,  # (B, T, D)
        key_value: Tensor | None = None,  # (B, S, D); None means self-attention on `query`
        mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> AttentionOutput:
        if key_value is None:
            q, k, v = self.project_qkv(query)
        else:
            q, k, v = self.project_cross(query, key_value)
        return self.attend(q, k, v, mask, is_causal, need_weights)

    def project_cross(self, x: Tensor, memory: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q from x (B, T, D), k and v from memory (B, S, D), each (B, H, T|S, Dh): the q and
        k | v parts of `in_proj` as one split, whose backward is one op where two slices take
        five (zero fill, copy, add)."""
        D = self.d_model
        w_q, w_kv = self.in_proj.weight.split([D, 2 * D])
        b_q, b_kv = self.in_proj.bias.split([D, 2 * D])
        q = split_heads(F.linear(x, w_q, b_q), 1, self.n_heads)[0]
        k, v = split_heads(F.linear(memory, w_kv, b_kv), 2, self.n_heads)
        return q, k, v
