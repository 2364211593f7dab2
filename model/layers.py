"""Encoder and decoder layers (Vaswani et al. 2017, sec. 3.1 and 3.3).

Legend: B batch, T tgt len, S src len, D d_model, H heads.
Each sublayer is wrapped in a residual connection with dropout and LayerNorm. The paper
normalises after the residual add (post-norm, the default); `norm_first=True` normalises the
sublayer input instead (pre-norm, Wang et al. 2019), which trains deep or big models more
stably and needs a final LayerNorm after the stack (see `transformer.py`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor, nn

from attnmt.model.attention import AttentionOutput, KVCache, MultiHeadAttention, causal_mask
from attnmt.model.config import Activation, ModelConfig


def rows_per_sentence(n_rows: int, n_sentences: int) -> int:
    """K, the decoder rows (beams) per sentence, when `n_rows` = `n_sentences` * K."""
    if n_rows % n_sentences:
        raise ValueError(f"{n_rows} decoder rows do not split evenly over {n_sentences} sentences")
    return n_rows // n_sentences


class LayerOutput(NamedTuple):
    hidden: Tensor  # (B, T, D)
    self_attn: Tensor | None  # (B, H, T, T) when need_weights
    cross_attn: Tensor | None = None  # (B, H, T, S), decoder layers only


# The feed-forward activation by `ModelConfig.activation`: ReLU in the paper; GELU and SiLU
# (swish) in imported models.
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}


class FeedForward(nn.Module):
    """Position-wise feed-forward network: max(0, x W1 + b1) W2 + b2 (eq. 2)."""

    def __init__(
        self, d_model: int, d_ff: int, act_dropout: float = 0.0, activation: Activation = "relu"
    ) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.act_dropout = nn.Dropout(act_dropout)
        self.activation = _ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.linear1(x))  # (B, T, F)
        if self.training:  # skipped at inference: a module call
            hidden = self.act_dropout(hidden)
        return self.linear2(hidden)  # (B, T, D)


class _ResidualLayer(nn.Module):
    """The residual + dropout + LayerNorm wiring shared by encoder and decoder layers."""

    def __init__(self, cfg: ModelConfig, n_sublayers: int) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.dropout = nn.Dropout(cfg.dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.d_model) for _ in range(n_sublayers))

    def sublayer_input(self, x: Tensor, i: int) -> Tensor:
        return self.norms[i](x) if self.norm_first else x

    def residual(self, x: Tensor, sublayer_output: Tensor, i: int) -> Tensor:
        if self.training:  # sec. 5.4: dropout before the residual add (skipped: a module call)
            sublayer_output = self.dropout(sublayer_output)
        x = x + sublayer_output
        return x if self.norm_first else self.norms[i](x)


class EncoderLayer(_ResidualLayer):
    """Self-attention, then feed-forward."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, n_sublayers=2)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff, cfg.act_dropout, cfg.activation)

    def forward(self, x: Tensor, src_mask: Tensor, need_weights: bool = False) -> LayerOutput:
        """x: (B, S, D); src_mask: (B, 1, 1, S) bool."""
        attn = self.self_attn(self.sublayer_input(x, 0), mask=src_mask, need_weights=need_weights)
        x = self.residual(x, attn.output, 0)
        x = self.residual(x, self.feed_forward(self.sublayer_input(x, 1)), 1)
        return LayerOutput(x, attn.weights)


class DecoderLayer(_ResidualLayer):
    """Masked (causal) self-attention, then encoder-decoder attention, then feed-forward.

    The same `forward` serves training (the whole target, causal), and cached decoding: with a
    `KVCache`, x holds only the newest positions, whose keys and values are appended to the
    cache, and the cross-attention keys and values are computed on the first step only.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, n_sublayers=3)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff, cfg.act_dropout, cfg.activation)

    def forward(
        self,
        x: Tensor,  # (B, T, D): the T newest target positions
        memory: Tensor,  # (B, S, D) encoder output
        src_mask: Tensor,  # (B, 1, 1, S) bool
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> LayerOutput:
        self_out = self._self_attention(self.sublayer_input(x, 0), cache, need_weights)
        x = self.residual(x, self_out.output, 0)
        cross_out = self._cross_attention(
            self.sublayer_input(x, 1), memory, src_mask, cache, need_weights
        )
        x = self.residual(x, cross_out.output, 1)
        x = self.residual(x, self.feed_forward(self.sublayer_input(x, 2)), 2)
        return LayerOutput(x, self_out.weights, cross_out.weights)

    def _self_attention(
        self, h: Tensor, cache: KVCache | None, need_weights: bool
    ) -> AttentionOutput:
        q, k, v = self.self_attn.project_qkv(h)  # (B, H, T, Dh) each
        if cache is not None:  # after the cached past: (B, H, t + T, Dh)
            k, v = cache.append(k, v)
        n_queries, n_keys = q.size(2), k.size(2)
        if n_queries == 1:  # one new token may see every cached position: no mask needed
            return self.self_attn.attend(q, k, v, need_weights=need_weights)
        if n_queries == n_keys:  # full teacher-forced pass
            return self.self_attn.attend(q, k, v, is_causal=True, need_weights=need_weights)
        mask = causal_mask(n_queries, n_keys, q.device)  # several new tokens on a cache: (T, t+T)
        return self.self_attn.attend(q, k, v, mask=mask, need_weights=need_weights)

    def _cross_attention(
        self, h: Tensor, memory: Tensor, src_mask: Tensor, cache: KVCache | None, need_weights: bool
    ) -> AttentionOutput:
        """h (N, T, D) with N = B * K: K consecutive rows (beams) per sentence of `memory`
        (B, S, D) and `src_mask` (B, 1, 1, S). The K rows' T queries attend together, as K * T
        queries of their sentence, to its one set of keys and values."""
        if cache is None and h.size(0) == memory.size(0):  # teacher forcing: one row a sentence
            q, k, v = self.cross_attn.project_cross(h, memory)
            return self.cross_attn.attend(q, k, v, mask=src_mask, need_weights=need_weights)
        if cache is None:
            k, v = self.cross_attn.project_kv(memory)  # (B, H, S, Dh) each
        elif cache.cross_k is None or cache.cross_v is None:  # the first step: once per sentence
            k, v = self.cross_attn.project_kv(memory)
            cache.cross_k, cache.cross_v = k, v
        else:
            k, v = cache.cross_k, cache.cross_v
        N, T, D = h.shape
        B = k.size(0)
        if N != B:
            # (B, K * T, D): queries are independent
            h = h.reshape(B, rows_per_sentence(N, B) * T, D)
        q = self.cross_attn.project_q(h)  # (B, H, K * T, Dh)
        out = self.cross_attn.attend(q, k, v, mask=src_mask, need_weights=need_weights)
        if N == B:
            return out
        weights = out.weights
        if weights is not None:  # (B, H, K * T, S) -> (N, H, T, S)
            H, S = weights.size(1), weights.size(-1)
            weights = weights.view(B, H, N // B, T, S).transpose(1, 2).reshape(N, H, T, S)
        return AttentionOutput(out.output.view(N, T, D), weights)
