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
    cross_bias: Tensor  # (n, H, 1, S) 0 / -inf: each row's own source


class SlotCache:
    """One decoder layer's cache for rows at different positions (a `StepCache`).

    Self-attention K/V live in (R, H, T, Dh) buffers: row i writes position `positions[i]`;
    `self_bias` hides what is not its own past. The cross-attention K/V of each row's sentence
    live in (R, H, S, Dh) buffers, zeros past its length (masked by `cross_bias`; zeros, since
    0 * garbage could be NaN). T and S are the step's widths (`SlotStep`: `width`-rounded):
    `start_step` resizes a buffer when they change, so that a step reads rows 0..n-1 of each
    buffer whole. Those views are contiguous, which oneDNN's bf16 `bmm` reads as they are,
    where a narrower slice of a wider buffer was copied first, every layer and step; and the
    rounding keeps the number of matmul shapes, each a oneDNN primitive made once, small
    (docs/benchmarks.md, "The server's steps").
    """

    def __init__(self, rows: int, n_heads: int, d_head: int, src_len: int, like: Tensor) -> None:
        self._k: Tensor | None = None  # (R, H, T, Dh), made by the first `append`
        self._v: Tensor | None = None
        cross = (rows, n_heads, width(src_len), d_head)
        self._ck, self._cv = like.new_zeros(cross), like.new_zeros(cross)
        self.cross_k = self.cross_v = self.cross_bias = self.self_bias = None
        self._n, self._end, self._rows, self._positions = 0, 0, None, None

    def load(self, row: int, k: Tensor, v: Tensor) -> None:
        """Row `row` takes a new sentence's cross-attention K/V (H, S, Dh); its self-attention
        history is zeroed (masked anyway, but an inf or NaN left there would leak as 0 * NaN)."""
        S = k.size(1)
        if S > self._ck.size(2):  # a longer source than the step's: widen (zeros after)
            self._ck, self._cv = resized(self._ck, 2, width(S)), resized(self._cv, 2, width(S))
        for buf in (self._ck, self._cv, self._k, self._v):
            if buf is not None:
                buf[row].zero_()
        self._ck[row, :, :S].copy_(k)
        self._cv[row, :, :S].copy_(v)

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
        self.cross_k, self.cross_v = self._ck[:n], self._cv[:n]
        self.self_bias, self.cross_bias = step.self_bias, step.cross_bias

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write each row's new K/V (n, H, 1, Dh) at its position; (n, H, T, Dh) views back."""
        if self._k is None or self._v is None:  # in the projections' dtype (autocast's)
            shape = (self._ck.size(0), k.size(1), self._end, k.size(3))
            self._k, self._v = k.new_zeros(shape), v.new_zeros(shape)
        self._k[self._rows, :, self._positions] = k.squeeze(2)
        self._v[self._rows, :, self._positions] = v.squeeze(2)
        return self._k[: self._n], self._v[: self._n]

    def move(self, rows: Tensor, to: Tensor, end: int, src_len: int) -> None:
        """Rows `rows` (m,) move to rows `to` (m,) (their first `end` positions, `src_len`
        sources); the other rows stay where they are."""
        widths = [(self._k, end), (self._v, end), (self._ck, src_len), (self._cv, src_len)]
        for buf, size in widths:
            if buf is not None:
                size = min(size, buf.size(2))
                buf[to, :, :size] = buf[rows, :, :size]


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
