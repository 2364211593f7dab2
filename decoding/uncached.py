"""A reference decoder without a KV cache: the same model and search API, each step re-running
the decoder over the whole target prefix. For verifying cached decoding and for benchmarks."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnmt.model import Transformer


class PrefixCache:
    """Not a KV cache: the target prefix so far, (N, t) ids, with the row moves of a
    `model.KVCache` (`reorder`, `reorder_beams`), so that search moves it with the beams
    exactly as it moves real self-attention keys and values."""

    def __init__(self) -> None:
        self.prefix: Tensor | None = None  # (N, t)

    def append(self, tgt_ids: Tensor) -> Tensor:
        """Add the new tokens (N, T); return the whole prefix (N, t + T)."""
        self.prefix = tgt_ids if self.prefix is None else torch.cat([self.prefix, tgt_ids], 1)
        return self.prefix

    def reorder_beams(self, rows: Tensor) -> None:
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, rows)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.reorder_beams(rows)


class UncachedModel(nn.Module):
    """The same Transformer decoding without a KV cache (the search API unchanged).

    Step t re-runs the decoder over all t target positions (O(t) positions, O(t^2)
    self-attention) instead of one. Only the new positions go through the output layer, as any
    sensible uncached decoder would do. Same weights, same tokens out.
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.model.encode(src_ids, src_mask)

    def new_caches(self) -> list[PrefixCache]:
        return [PrefixCache()]

    def decode(
        self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor, caches: list, offset: int = 0
    ) -> Tensor:
        prefix = caches[0].append(tgt_ids)  # (N, offset + T)
        if prefix.size(1) != offset + tgt_ids.size(1):
            raise RuntimeError("the prefix cache is out of step with the search")
        model, mask = self.model, src_mask[:, None, None, :]
        hidden = model.decoder(model.embed_target(prefix), memory, mask).hidden  # (N, t, D)
        return model.generator(hidden[:, -tgt_ids.size(1) :])  # (N, T, V): new positions only
