"""Attention: masks, masked softmax, scoring functions, multi-head attention and its KV cache.

Legend: B batch, T query len, S key len, D d_model, H heads, Dh head dim (D / H).
Masks are bool and True means "may attend" (the convention of
`F.scaled_dot_product_attention`, and the opposite of `nn.MultiheadAttention`'s
`key_padding_mask`). Keys are masked, never queries.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.kernels import Dropout, dropout
from model.packed import PackedLinear


class AttentionOutput(NamedTuple):
    output: Tensor  # (B, T, Dv) or (B, T, D)
    weights: Tensor | None  # (B, T, S) or (B, H, T, S), only when asked for


# ---------------------------------------------------------------------------- masks


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, S) bool, True at real tokens."""
    return ids.ne(pad_id)


def lengths_to_mask(valid_lens: Tensor, n_keys: int) -> Tensor:
    """Valid lengths per row (B,) or per query (B, T) -> key mask (B, 1, S) or (B, T, S)."""
    positions = torch.arange(n_keys, device=valid_lens.device)  # (S,)
    mask = positions < valid_lens.unsqueeze(-1)  # (B, S) or (B, T, S)
    return mask.unsqueeze(1) if valid_lens.dim() == 1 else mask


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


def masked_softmax(
    scores: Tensor, valid_lens: Tensor | None = None, mask: Tensor | None = None
) -> Tensor:
    """Softmax over the last axis in which masked keys get weight exactly 0.

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
    if mask is None:
        return F.softmax(scores, dim=-1)
    weights = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # empty rows: NaN -> 0


# ---------------------------------------------------------------- scoring functions


class DotProductAttention(nn.Module):
    """Scaled dot-product attention: softmax(q k^T / sqrt(d)) v (Vaswani et al., eq. 1)."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)

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
        weights = masked_softmax(scores, valid_lens, mask)  # (B, T, S)
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
        self.dropout = Dropout(dropout)

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
        weights = masked_softmax(scores, valid_lens, mask)  # (B, T, S)
        output = self.dropout(weights) @ values  # (B, T, dv)
        return AttentionOutput(output, weights if need_weights else None)


# ------------------------------------------------------------- multi-head attention


class KVCache:
    """One decoder layer's cached keys and values, so that decoding a token costs one token.

    Self-attention: the keys/values of the t decoded positions of each of the N rows
    (hypotheses) live in preallocated buffers (N, H, capacity, Dh) that each step writes in
    place, so a step never copies the past (`torch.cat` would copy all t positions per step);
    the capacity doubles when a step would overflow it. `self_k`/`self_v` are views of the
    filled part (N, H, t, Dh).

    Cross-attention: keys/values computed once from the encoder output (fairseq's
    `static_kv`), one set per sentence, (B, H, S, Dh): the N = B * K rows of a beam search
    (K consecutive rows per sentence) all read their sentence's set, which is never copied K
    times (see `DecoderLayer`).

    Search moves rows with `reorder` (sentences pruned, the beam widened) and `reorder_beams`
    (beams re-ranked within their sentences).
    """

    def __init__(
        self,
        self_k: Tensor | None = None,  # (N, H, t, Dh) initial contents, copied
        self_v: Tensor | None = None,
        cross_k: Tensor | None = None,  # (B, H, S, Dh)
        cross_v: Tensor | None = None,
        capacity: int = 16,
    ) -> None:
        self.capacity = capacity  # positions a new buffer holds at first
        self.length = 0  # t: positions filled
        self._k: Tensor | None = None  # (N, H, capacity, Dh)
        self._v: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # buffers the next reorder writes to
        self.cross_k, self.cross_v = cross_k, cross_v
        # (B, H, 1, S) 0 / -inf: the source mask as a score bias (`DecoderLayer.step`)
        self.cross_bias: Tensor | None = None
        # (N * H, 1, t) 0 / -inf, or None: which cached positions each row's query may see,
        # for rows at different positions (`decoding.continuous`); None: all t of them
        self.self_bias: Tensor | None = None
        if self_k is not None and self_v is not None:
            self.append(self_k, self_v)

    @property
    def self_k(self) -> Tensor | None:
        """(N, H, t, Dh) view of the cached self-attention keys, None before the first step."""
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def self_v(self) -> Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write T new positions (N, H, T, Dh) after the t cached ones, in place.

        Returns all keys and values so far, (N, H, t + T, Dh) views of the buffers.
        """
        end = self.length + k.size(2)
        if self._k is None or self._v is None:
            shape = (k.size(0), k.size(1), max(self.capacity, end), k.size(3))
            self._k, self._v = k.new_empty(shape), v.new_empty(shape)
        elif end > self._k.size(2):  # full: double (amortised O(1) copies per position)
            capacity = max(2 * self._k.size(2), end)
            self._k, self._v = self._resized(self._k, capacity), self._resized(self._v, capacity)
            self._spare = None
        self._k[:, :, self.length : end].copy_(k)
        self._v[:, :, self.length : end].copy_(v)
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    def _resized(self, buf: Tensor, capacity: int) -> Tensor:
        new = buf.new_empty(buf.size(0), buf.size(1), capacity, buf.size(3))
        new[:, :, : self.length].copy_(buf[:, :, : self.length])
        return new

    def reorder_beams(self, rows: Tensor) -> None:
        """Row i of the self-attention cache takes the history of row `rows[i]` (N',).

        The sentences stay the same, so the cross-attention K/V do not move. One copy of the t
        filled positions, into a spare buffer that the next reorder writes back over.
        """
        if self._k is None or self._v is None:
            return
        n, t = rows.numel(), self.length
        shape = (n,) + self._k.shape[1:]
        spare = self._spare
        if spare is None or spare[0].shape != shape:  # the number of rows changed
            spare = (self._k.new_empty(shape), self._v.new_empty(shape))
        torch.index_select(self._k[:, :, :t], 0, rows, out=spare[0][:, :, :t])
        torch.index_select(self._v[:, :, :t], 0, rows, out=spare[1][:, :, :t])
        old = (self._k, self._v)
        self._k, self._v = spare
        self._spare = old if old[0].size(0) == n else None

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows `rows` (N',) of the self-attention cache and sentences `sentences` (B',)
        of the cross-attention cache (default `rows`: one row per sentence)."""
        self.reorder_beams(rows)
        sentences = rows if sentences is None else sentences
        if self.cross_k is not None and self.cross_v is not None:
            self.cross_k = self.cross_k.index_select(0, sentences)
            self.cross_v = self.cross_v.index_select(0, sentences)
        if self.cross_bias is not None:
            self.cross_bias = self.cross_bias.index_select(0, sentences)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., sec. 3.2.2), batch-first.

    One fused input projection `in_proj` (D -> 3D, laid out q | k | v): self-attention projects
    q, k, v in one matmul; cross-attention projects q from the decoder and k, v from the encoder
    output with the two slices of the same weight. The kernel is
    `F.scaled_dot_product_attention` (flash / memory-efficient); when the weights are asked
    for, an explicit path computes them. Both paths give the same output.

    `split_in_proj()` (for inference) replaces `in_proj` with two modules, `q_proj` (D -> D)
    and `kv_proj` (D -> 2D), holding the same numbers: what a module swap such as dynamic int8
    quantization needs, since the slices of a fused weight are no module of their own.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.in_proj: nn.Module | None = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.q_proj: nn.Module | None = None  # set by `split_in_proj`
        self.kv_proj: nn.Module | None = None

    @torch.no_grad()
    def split_in_proj(self) -> None:
        """Move `in_proj` into `q_proj` and `kv_proj` (copies of its slices); `in_proj` goes.

        Self-attention then costs two matmuls instead of one: meant for cross-attention.
        """
        if self.in_proj is None:
            return
        D, weight, bias = self.d_model, self.in_proj.weight, self.in_proj.bias
        self.q_proj, self.kv_proj = nn.Linear(D, D), nn.Linear(D, 2 * D)
        self.q_proj.to(weight).weight.copy_(weight[:D])
        self.q_proj.bias.copy_(bias[:D])
        self.kv_proj.to(weight).weight.copy_(weight[D:])
        self.kv_proj.bias.copy_(bias[D:])
        self.in_proj = None

    def _split_heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        x = x.view(B, T, n, self.n_heads, self.d_head)  # (B, T, n, H, Dh)
        return x.permute(2, 0, 3, 1, 4)  # (n, B, H, T, Dh)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, D) -> q, k, v, each (B, H, T, Dh), with one matmul."""
        if self.in_proj is None:  # split: two
            return (self.project_q(x), *self.project_kv(x))
        q, k, v = self._split_heads(self.in_proj(x), 3)
        return q, k, v

    def project_q(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, Dh)."""
        return self._split_heads(self.project_q_rows(x), 1)[0]

    def project_q_rows(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., D): the query projection, heads not split."""
        if self.q_proj is not None:
            return self.q_proj(x)
        return self._in_proj_rows(x, 0, self.d_model)

    def project_qkv_rows(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(..., D) -> q (..., D), k|v (..., 2D): the self-attention projections, heads not
        split; one matmul (two when split)."""
        if self.in_proj is None:
            return self.q_proj(x), self.kv_proj(x)
        qkv = self.in_proj(x)  # (..., 3D)
        return qkv[..., : self.d_model], qkv[..., self.d_model :]

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) -> k, v, each (B, H, S, Dh)."""
        if self.kv_proj is not None:
            k, v = self._split_heads(self.kv_proj(x), 2)
            return k, v
        k, v = self._split_heads(self._in_proj_rows(x, self.d_model, 3 * self.d_model), 2)
        return k, v

    def _in_proj_rows(self, x: Tensor, start: int, end: int) -> Tensor:
        """`x` through rows `start:end` of the fused projection (the q or the k|v slice)."""
        proj = self.in_proj
        if isinstance(proj, PackedLinear):  # its packed copy of the slice
            return proj(x, rows=(start, end))
        return F.linear(x, proj.weight[start:end], proj.bias[start:end])

    def attend(
        self,
        q: Tensor,  # (B, H, T, Dh)
        k: Tensor,  # (B, H, S, Dh)
        v: Tensor,  # (B, H, S, Dh)
        mask: Tensor | None = None,  # bool, broadcastable to (B, H, T, S)
        is_causal: bool = False,  # query i sees keys <= i (right-aligned when T < S)
        need_weights: bool = False,
    ) -> AttentionOutput:
        dropout_p = self.dropout if self.training else 0.0
        # bf16/fp16 on CPU take the explicit path too: SDPA's CPU kernel is slower in bf16
        # than in fp32 (its backward 3.5x), while bf16 matmuls + an fp32 softmax are 2-7x
        # faster than either at Multi30k's lengths (benchmarks/bench_attention.py).
        explicit = need_weights or (q.device.type == "cpu" and q.dtype != torch.float32)
        if is_causal and (explicit or mask is not None or q.size(2) != k.size(2)):
            # SDPA's is_causal is top-left aligned and cannot be combined with a mask: build ours.
            causal = causal_mask(q.size(2), k.size(2), q.device)  # (T, S)
            mask = causal if mask is None else mask & causal
            is_causal = False
        if not need_weights and not is_causal and not self.training and q.size(2) <= 16:
            # A few queries per (row, head), as in a decoding step: plain matmuls beat the
            # blocked flash kernel on CPU (3x for 5 beams' queries against 20 keys).
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = None
            context = torch.matmul(torch.softmax(scores, dim=-1), v)  # (B, H, T, Dh)
        elif explicit:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, S)
            weights = masked_softmax(scores.float(), mask=mask).to(q.dtype)  # (B, H, T, S)
            context = dropout(weights, dropout_p, self.training) @ v  # (B, H, T, Dh)
            weights = weights if need_weights else None
        else:
            weights = None
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
            )  # (B, H, T, Dh)
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
            q = self.project_q(query)
            k, v = self.project_kv(key_value)
        return self.attend(q, k, v, mask, is_causal, need_weights)
