"""The engine's KV caches: what the one-token decoder step (`Engine.decoder_step`) reads and writes.

Legend: N rows, B sentences, R slots, H heads, Dh head dim, t positions so far, S src len.

Both satisfy `StepCache`: `append` the step's keys/values and get the history back,
cross-attention keys/values (`cross_k`, `cross_v`, computed once per sentence), the source mask
as a 0 / -inf score bias (`cross_bias`), and `self_bias`, which positions of the history each
row may see (None: all of them). `StepKVCache` serves greedy and beam search on int8 layers
(rows in step), `SlotCache` continuous batching (rows at different positions).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from attnmt.model.attention import KVCache


class StepCache(Protocol):
    """What `Engine.decoder_step` needs of one layer's cache."""

    cross_k: Tensor | None  # (B, H, S, Dh)
    cross_v: Tensor | None
    cross_bias: Tensor | None  # (B, H, 1, S)
    self_bias: Tensor | None  # (N * H, 1, t) or None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...


class StepKVCache(KVCache):
    """The model's `KVCache` plus the source mask as a score bias (`cross_bias`, made on the
    first step and moved with the sentences), for `decoder_step` on int8 layers."""

    def __init__(self) -> None:
        super().__init__()
        self.cross_bias: Tensor | None = None  # (B, H, 1, S) 0 / -inf: the source mask
        self.self_bias: Tensor | None = None  # always None: every row sees its whole past

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        super().reorder(rows, sentences)
        if self.cross_bias is not None:
            sentences = rows if sentences is None else sentences
            self.cross_bias = self.cross_bias.index_select(0, sentences)


class SlotStep(NamedTuple):
    """What one continuous-batching step reads, the same for every layer's `SlotCache`: rows
    0..n-1 write `positions` (n,) and read T = `end` positions and S = `src_len` sources, both
    multiples of `WIDTH_STEP` (`width`), past each row's own masked by the biases."""

    rows: Tensor  # (n,) 0..n-1
    positions: Tensor  # (n,)
    end: int
    src_len: int
    self_bias: Tensor  # (n * H, 1, T) 0 / -inf: each row's own past
    cross_bias: Tensor  # (b, H, 1, S) 0 / -inf: each sentence's own source (b = n / group)


class SlotCache:
    """One decoder layer's cache for rows at different positions (a `StepCache`).

    Self-attention K/V live in (R, H, T, Dh) buffers: row i writes position `positions[i]`;
    `self_bias` hides what is not its own past. Sentences hold `group` consecutive rows each
    (1 greedy, K beam search: slot j rows j * K .. j * K + K - 1, its beams); their
    cross-attention K/V live in (R / group, H, S, Dh) buffers, one entry per sentence, zeros
    past its length (masked by `cross_bias`; zeros, since 0 * garbage could be NaN). T and S
    are the step's widths (`SlotStep`: `width`-rounded): `start_step` resizes a buffer when
    they change, so that a step reads rows 0..n-1 of each buffer whole. Those views are
    contiguous, which oneDNN's bf16 `bmm` reads as they are, where a narrower slice of a wider
    buffer was copied first, every layer and step; and the rounding keeps the number of matmul
    shapes, each a oneDNN primitive made once, small (docs/benchmarks.md, "The server's
    steps").
    """

    def __init__(
        self, rows: int, n_heads: int, d_head: int, src_len: int, like: Tensor, group: int = 1
    ) -> None:
        self._k: Tensor | None = None  # (R, H, T, Dh), made by the first `append`
        self._v: Tensor | None = None
        self._spare: tuple[Tensor, Tensor] | None = None  # `reorder`'s other K/V buffers
        self.rows, self.group = rows, group
        cross = (rows // group, n_heads, width(src_len), d_head)
        self._ck, self._cv = like.new_zeros(cross), like.new_zeros(cross)
        self.cross_k = self.cross_v = self.cross_bias = self.self_bias = None
        self._n, self._end, self._rows, self._positions = 0, 0, None, None

    def load(self, slot: int, k: Tensor, v: Tensor) -> None:
        """Sentence slot `slot` takes a new sentence's cross-attention K/V (H, S, Dh); its rows'
        self-attention history is zeroed (masked anyway, but an inf or NaN left there would
        leak as 0 * NaN)."""
        S = k.size(1)
        if S > self._ck.size(2):  # a longer source than the step's: widen (zeros after)
            self._ck, self._cv = resized(self._ck, 2, width(S)), resized(self._cv, 2, width(S))
        rows = slice(slot * self.group, (slot + 1) * self.group)
        for buf, at in ((self._ck, slot), (self._cv, slot), (self._k, rows), (self._v, rows)):
            if buf is not None:
                buf[at].zero_()
        self._ck[slot, :, :S].copy_(k)
        self._cv[slot, :, :S].copy_(v)

    def start_step(self, step: SlotStep) -> None:
        """Set the views the step reads (see `SlotStep`), resizing the buffers to its widths.
        Live rows lose nothing: their positions are below `end`, their sources within
        `src_len`; rows past them are loaded afresh (`load`) before they are read again."""
        n, end, src_len = step.rows.numel(), step.end, step.src_len
        if self._k is not None and self._v is not None and end != self._k.size(2):
            self._k, self._v = resized(self._k, 2, end), resized(self._v, 2, end)
        if src_len != self._ck.size(2):
            self._ck, self._cv = resized(self._ck, 2, src_len), resized(self._cv, 2, src_len)
        self._n, self._end, self._rows, self._positions = n, end, step.rows, step.positions
        b = n // self.group  # sentences
        self.cross_k, self.cross_v = self._ck[:b], self._cv[:b]
        self.self_bias, self.cross_bias = step.self_bias, step.cross_bias

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write each row's new K/V (n, H, 1, Dh) at its position; (n, H, T, Dh) views back."""
        if self._k is None or self._v is None:  # in the projections' dtype (autocast's)
            shape = (self.rows, k.size(1), self._end, k.size(3))
            self._k, self._v = k.new_zeros(shape), v.new_zeros(shape)
        self._k[self._rows, :, self._positions] = k.squeeze(2)
        self._v[self._rows, :, self._positions] = v.squeeze(2)
        return self._k[: self._n], self._v[: self._n]

    def move(self, slots: Tensor, to: Tensor, end: int, src_len: int) -> None:
        """Sentence slots `slots` (m,) move to slots `to` (m,) with their rows (their first
        `end` positions, `src_len` sources); the other slots stay where they are."""
        g = self.group
        rows, to_rows = (slot_rows(x, g) for x in (slots, to))
        widths = [(self._k, end, rows, to_rows), (self._v, end, rows, to_rows)]
        widths += [(self._ck, src_len, slots, to), (self._cv, src_len, slots, to)]
        for buf, size, src, dst in widths:
            if buf is not None:
                size = min(size, buf.size(2))
                buf[dst, :, :size] = buf[src, :, :size]

    def reorder(self, rows: Tensor) -> None:
        """Row i of rows 0..n-1 takes the self-attention history of row `rows[i]` (n,): beams
        re-ranked inside their sentences (the cross-attention K/V are per sentence). One copy:
        gathered into a spare buffer, which becomes the buffer (rows past n are not live:
        `load` clears a slot's rows before they are read). Copying only the rows that change
        took longer: about two thirds of them do, at beam 5."""
        if self._k is None or self._v is None:
            return
        n = rows.numel()
        if self._spare is None or self._spare[0].shape != self._k.shape:
            self._spare = (torch.empty_like(self._k), torch.empty_like(self._v))
        spare_k, spare_v = self._spare
        torch.index_select(self._k, 0, rows, out=spare_k[:n])
        torch.index_select(self._v, 0, rows, out=spare_v[:n])
        self._spare = (self._k, self._v)
        self._k, self._v = spare_k, spare_v


def slot_rows(slots: Tensor, group: int) -> Tensor:
    """The rows of sentence slots (m,) -> (m * group,), each slot's rows in order."""
    if group == 1:
        return slots
    offsets = torch.arange(group, device=slots.device)
    return (slots.unsqueeze(1) * group + offsets).view(-1)


def resized(buf: Tensor, dim: int, size: int) -> Tensor:
    """A copy of `buf` with dimension `dim` of `size`: its first entries, zeros after if it
    grows, cut if it shrinks."""
    shape = list(buf.shape)
    shape[dim] = size
    new = buf.new_zeros(shape)
    kept = min(size, buf.size(dim))
    new.narrow(dim, 0, kept).copy_(buf.narrow(dim, 0, kept))
    return new


# Histories and sources are read in widths rounded up to a multiple of this (`width`)
WIDTH_STEP = 8


def width(length: int) -> int:
    """`length` rounded up to a multiple of `WIDTH_STEP`: the widths a continuous-batching
    step reads (`SlotStep`), so a buffer is resized once in `WIDTH_STEP` positions."""
    return -(-length // WIDTH_STEP) * WIDTH_STEP
