"""The encoder-decoder Transformer (Vaswani et al. 2017, fig. 1).

Legend: B batch, S src len, T tgt len, D d_model, H heads, V vocab.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnmt.model.attention import KVCache, MultiHeadAttention, padding_mask
from attnmt.model.config import ModelConfig
from attnmt.model.layers import DecoderLayer, EncoderLayer
from attnmt.model.positional import SinusoidalPositionalEncoding


class StackOutput(NamedTuple):
    hidden: Tensor  # (B, T, D)
    self_attn: list[Tensor] | None  # per layer (B, H, T, T|S') when need_weights
    cross_attn: list[Tensor] | None = None  # per layer (B, H, T, S), decoder only


class AttentionMaps(NamedTuple):
    """Every layer's attention weights for one teacher-forced pass, for heatmaps."""

    encoder_self: list[Tensor]  # n_encoder_layers x (B, H, S, S)
    decoder_self: list[Tensor]  # n_decoder_layers x (B, H, T, T)
    cross: list[Tensor]  # n_decoder_layers x (B, H, T, S)


class Encoder(nn.Module):
    """N encoder layers (+ a final LayerNorm when pre-norm)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.checkpoint_activations = False  # training's trainer.activation_checkpointing

    def forward(self, x: Tensor, src_mask: Tensor, need_weights: bool = False) -> StackOutput:
        weights = []
        for layer in self.layers:
            if self.checkpoint_activations and torch.is_grad_enabled():
                # Keep only the layer's input; recompute the rest in the backward pass (the
                # random state is restored, so dropout draws the same masks).
                x, attn, _ = checkpoint(layer, x, src_mask, need_weights, use_reentrant=False)
            else:
                x, attn, _ = layer(x, src_mask, need_weights)
            weights.append(attn)
        return StackOutput(self.final_norm(x), weights if need_weights else None)


class Decoder(nn.Module):
    """N decoder layers (+ a final LayerNorm when pre-norm)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.checkpoint_activations = False  # as Encoder's; never with caches (decoding)

    def forward(
        self,
        x: Tensor,  # (N, T, D), N = B or B * K (see `Transformer.decode`)
        memory: Tensor,  # (B, S, D)
        src_mask: Tensor,  # (B, 1, 1, S)
        caches: list[KVCache] | None = None,
        need_weights: bool = False,
    ) -> StackOutput:
        self_weights, cross_weights = [], []
        for i, layer in enumerate(self.layers):
            if self.checkpoint_activations and caches is None and torch.is_grad_enabled():
                x, self_attn, cross_attn = checkpoint(
                    layer, x, memory, src_mask, None, need_weights, use_reentrant=False
                )
            else:
                cache = None if caches is None else caches[i]
                x, self_attn, cross_attn = layer(x, memory, src_mask, cache, need_weights)
            self_weights.append(self_attn)
            cross_weights.append(cross_attn)
        if not need_weights:
            return StackOutput(self.final_norm(x), None, None)
        return StackOutput(self.final_norm(x), self_weights, cross_weights)


class Transformer(nn.Module):
    """Encoder-decoder Transformer for translation.

    `encode()` runs the encoder once; `decode()` runs the decoder, either teacher-forced over a
    whole target prefix or, with `caches`, on only the newest tokens (one token of work per
    step); `forward()` is both, for training. Masks are bool, True = real token.

    Example:
        >>> model = Transformer(ModelConfig(src_vocab_size=100, tgt_vocab_size=100))
        >>> logits = model(src_ids, tgt_in)          # (B, T, V)
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        D = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, D, padding_idx=cfg.pad_id)
        if cfg.share_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, D, padding_idx=cfg.pad_id)
        self.positional = SinusoidalPositionalEncoding(
            D, cfg.dropout, layout=cfg.positions, pad_id=cfg.pad_id
        )
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.generator = nn.Linear(D, cfg.tgt_vocab_size, bias=cfg.output_bias)
        self.embed_scale = math.sqrt(D)  # sec. 3.4: embeddings are multiplied by sqrt(d_model)
        self._reset_parameters()
        if cfg.tie_output:  # sec. 3.4: the pre-softmax projection shares the embedding
            self.generator.weight = self.tgt_embed.weight

    def _reset_parameters(self) -> None:
        # Xavier-uniform for projections (as fairseq / the reference tensor2tensor code), each of
        # q, k, v initialised as its own (D, D) matrix; N(0, D^-1/2) embeddings, zero pad row.
        fused_qkv = {m.in_proj.weight for m in self.modules() if isinstance(m, MultiHeadAttention)}
        for module in self.modules():
            if isinstance(module, nn.Linear):
                if module.weight in fused_qkv:
                    for block in module.weight.data.chunk(3, dim=0):
                        nn.init.xavier_uniform_(block)
                else:
                    nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.d_model**-0.5)
                with torch.no_grad():
                    module.weight[self.cfg.pad_id].zero_()

    # ------------------------------------------------------------------------- core API

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) ids -> memory (B, S, D)."""
        if src_mask is None:
            src_mask = padding_mask(src_ids, self.cfg.pad_id)
        return self.encoder(self.embed_source(src_ids), src_mask[:, None, None, :]).hidden

    def decode(
        self,
        tgt_ids: Tensor,  # (N, T) the target tokens at positions offset .. offset+T-1
        memory: Tensor,  # (B, S, D)
        src_mask: Tensor,  # (B, S) bool
        caches: list[KVCache] | None = None,
        offset: int = 0,
    ) -> Tensor:
        """Logits (N, T, V) for the next token after each of `tgt_ids`.

        Without `caches` this is the full teacher-forced pass (offset 0). With `caches`, pass
        only the new tokens and the number already decoded as `offset`; the caches are updated.
        N is B (one target row per sentence) or B * K: K consecutive rows per sentence (beam
        search's hypotheses), which share their sentence's memory row without copies of it.
        """
        x = self.embed_target(tgt_ids, offset)  # (N, T, D)
        hidden = self.decoder(x, memory, src_mask[:, None, None, :], caches).hidden
        return self.generator(hidden)  # (N, T, V)

    def embed_source(self, src_ids: Tensor) -> Tensor:
        """(B, S) ids -> (B, S, D): embeddings * sqrt(D) + positions (sec. 3.4, 3.5)."""
        return self.positional(self.src_embed(src_ids) * self.embed_scale)

    def embed_target(self, tgt_ids: Tensor, offset: int = 0) -> Tensor:
        """(N, T) ids at positions offset .. offset+T-1 -> (N, T, D)."""
        return self.positional(self.tgt_embed(tgt_ids) * self.embed_scale, offset)

    def forward(self, src_ids: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for `tgt_in` = [bos] + y."""
        src_mask = padding_mask(src_ids, self.cfg.pad_id)  # (B, S)
        return self.decode(tgt_in, self.encode(src_ids, src_mask), src_mask)

    def new_caches(self) -> list[KVCache]:
        """Empty KV caches, one per decoder layer, for incremental decoding."""
        return [KVCache() for _ in self.decoder.layers]

    # ---------------------------------------------------------------------- inspection

    @torch.no_grad()
    def attention_maps(self, src_ids: Tensor, tgt_in: Tensor) -> AttentionMaps:
        """Every layer's self- and cross-attention weights for a (source, target) pair.

        Use it after translating: feed [bos] + hypothesis as `tgt_in`. Weights are exact (the
        explicit attention path); they equal what cached decoding computed step by step.
        """
        was_training = self.training
        self.eval()  # dropout would change the maps
        src_mask = padding_mask(src_ids, self.cfg.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        enc = self.encoder(self.embed_source(src_ids), src_mask, need_weights=True)
        dec = self.decoder(self.embed_target(tgt_in), enc.hidden, src_mask, need_weights=True)
        self.train(was_training)
        return AttentionMaps(enc.self_attn, dec.self_attn, dec.cross_attn)

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())
