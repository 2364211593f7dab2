"""Token-budget batches: the ``Batch`` dataclass, ``collate`` and a length-bucketed sampler.

Legend: B batch, S source length (with eos), T target length (with bos or eos).

Batches are sized by tokens, not sentences (Vaswani et al. 2017, sec. 5.1: "each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
tokens"). A batch's cost counts padding: ``B * max(S, T) <= max_tokens``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from attnmt.data.errors import DataError
from attnmt.data.tokenizer import SpecialIds

if TYPE_CHECKING:  # inference never needs `datasets` (it costs ~1 s to import)
    import datasets

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """One batch for teacher forcing.

    Attributes:
        src_ids: (B, S) long; each row is ``ids + [eos]``, right-padded with pad.
        tgt_in: (B, T) long; ``[bos] + y``, right-padded (decoder input).
        tgt_out: (B, T) long; ``y + [eos]``, right-padded (what the decoder must predict).
        n_src_tokens: Non-pad source tokens.
        n_tgt_tokens: Non-pad ``tgt_out`` tokens: the loss normaliser.
        indices: Dataset row of each example, in batch order (to put hypotheses back in
            corpus order).
        pad_id: The pad id, so that :attr:`src_mask` needs no other argument.
    """

    src_ids: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    n_src_tokens: int
    n_tgt_tokens: int
    indices: list[int]
    pad_id: int = 0

    @property
    def src_mask(self) -> Tensor:
        """(B, S) bool, True = real token (may be attended to)."""
        return self.src_ids != self.pad_id

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with the tensors on ``device``."""
        return dataclasses.replace(
            self,
            src_ids=self.src_ids.to(device, non_blocking=non_blocking),
            tgt_in=self.tgt_in.to(device, non_blocking=non_blocking),
            tgt_out=self.tgt_out.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        """A copy in page-locked memory (for asynchronous host-to-GPU copies)."""
        return dataclasses.replace(
            self,
            src_ids=self.src_ids.pin_memory(),
            tgt_in=self.tgt_in.pin_memory(),
            tgt_out=self.tgt_out.pin_memory(),
        )

    def __len__(self) -> int:
        return self.src_ids.size(0)


def pad_rows(
    rows: Sequence[Sequence[int]],
    pad: int,
    prefix: Sequence[int] = (),
    suffix: Sequence[int] = (),
    width: int = 0,
) -> Tensor:
    """``prefix + row + suffix`` for each row, right-padded with ``pad``: a (B, L) long tensor,
    L the longest row + ``len(prefix) + len(suffix)``, or ``width`` if that is more."""
    width = max(width, max((len(row) for row in rows), default=0) + len(prefix) + len(suffix))
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(prefix) + len(row) + len(suffix)] = [*prefix, *row, *suffix]
    return torch.from_numpy(out)


def encode_source_batch(src_ids: list[list[int]], special: SpecialIds, width: int = 0) -> Tensor:
    """Source ids (no specials) -> (B, S) tensor of ``ids + [eos]``, right-padded (to ``width``
    if that is more); inference and training alike."""
    return pad_rows(src_ids, special.pad, suffix=[special.eos], width=width)


def collate(
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    special: SpecialIds,
    indices: list[int] | None = None,
    widths: tuple[int, int] = (0, 0),
) -> Batch:
    """Pad a list of (source, target) id lists (no specials) into a :class:`Batch`.

    Shape:
        src_ids: (B, S) with S = longest source + 1; tgt_in, tgt_out: (B, T), T = longest
        target + 1; or `widths` (S, T) where they are more (a length bucket's).
    """
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
    S, T = widths
    tgt_in = pad_rows(tgt_ids, special.pad, prefix=[special.bos], width=T)  # (B, T)
    tgt_out = pad_rows(tgt_ids, special.pad, suffix=[special.eos], width=T)  # tgt_in shifted left
    return Batch(
        src_ids=encode_source_batch(src_ids, special, width=S),  # (B, S)
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        n_src_tokens=sum(len(s) + 1 for s in src_ids),
        n_tgt_tokens=sum(len(t) + 1 for t in tgt_ids),
        indices=list(range(len(src_ids))) if indices is None else list(indices),
        pad_id=special.pad,
    )


def token_lengths(ds: datasets.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(src_len, tgt_len)`` of an encoded split as int arrays, read straight from Arrow.

    Use it to build a sampler: ``TokenBatchSampler(*token_lengths(ds), max_tokens)``.
    """
    columns = ds.select_columns(["src_len", "tgt_len"]).with_format("numpy")[:]
    return columns["src_len"], columns["tgt_len"]


def _as_array(lengths: Sequence[int]) -> np.ndarray:
    if type(lengths).__module__.startswith("datasets"):  # datasets >= 4: a lazy Column
        lengths = lengths[:]  # one Arrow read; np.asarray would format row by row (slow)
    return np.asarray(lengths, dtype=np.int64)


class TokenBatchSampler:
    """Length-bucketed batches of dataset indices under a token budget, sharded over ranks.

    Each epoch: sort by (source length, target length) with random tie-breaking, pack greedily
    so that ``B * max(S, T) <= max_tokens`` (an example longer than the budget gets a batch of
    its own). With ``bucket_growth`` (> 1), batches come in a few shapes instead, as a compiled
    or CUDA-graphed step wants (fairseq's ``--num-batch-buckets``, NVIDIA's rows rounded to 8):
    lengths are padded up a ladder (1-8 to 8, then each rung ``growth`` times the last: 8, 9,
    10, 11, 13, 15, ... for 1.1), pairs are grouped by the rung of ``max(S, T)`` in random
    order, and a rung of length L fills batches of ``max_tokens // L`` rows, rounded down to a
    multiple of 8; the pairs left over join the next rung's batches (they fit: shorter), so
    only the longest rung leaves a smaller batch. Each side of a batch is padded to the rung of
    its longest sentence (:meth:`padded_length`). Then, if the number of batches is not a
    multiple of ``world_size``, split the batch with the largest padded size in two (length
    order is kept) until it is. Consecutive
    runs of ``world_size`` batches form one step: their shapes are similar, so no rank waits
    long for the others. Steps are shuffled with a generator seeded by ``(seed, epoch)``, and
    rank ``r`` takes batch ``r`` of every step. So every rank yields the same number of
    batches, and over an epoch each pair appears on exactly one rank, exactly once.

    Args:
        src_lengths: Source token counts, without specials (one eos is added); e.g. from
            :func:`token_lengths`.
        tgt_lengths: Target token counts, without specials (one bos/eos is added).
        max_tokens: Budget per batch and rank, padding included.
        seed: Base seed; the batches depend only on ``(seed, epoch)``.
        shuffle: False gives a fixed length-sorted order (validation).
        rank: This process's data-parallel rank.
        world_size: Number of data-parallel ranks.
        mixture: Several corpora laid end to end, ``[(size, weight), ...]`` in row order: each
            epoch then draws ``N * weight / sum(weights)`` pairs from a corpus (``N`` = all
            rows; a random subset, or every pair as often as fits plus a random subset), seeded
            by ``(seed, epoch)``, before packing. None: every pair once per epoch.
        bucket_growth: > 1: the ratio between rungs of the length ladder (few batch shapes);
            0: exact lengths, greedy packing (a shape per batch).

    Raises:
        DataError: Fewer pairs than needed to give every rank the same number of batches.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        mixture: Sequence[tuple[int, float]] | None = None,
        bucket_growth: float = 0.0,
    ) -> None:
        self.src_sizes = _as_array(src_lengths) + 1  # + eos
        self.tgt_sizes = _as_array(tgt_lengths) + 1  # + bos (tgt_in) or eos
        if self.src_sizes.shape != self.tgt_sizes.shape or self.src_sizes.ndim != 1:
            raise ValueError("src_lengths and tgt_lengths must be 1-D and equally long")
        if max_tokens <= 0 or not 0 <= rank < world_size:
            raise ValueError(f"bad max_tokens={max_tokens}, rank={rank}, world_size={world_size}")
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.mixture = None if mixture is None else [(int(n), float(w)) for n, w in mixture]
        if self.mixture is not None and sum(n for n, _ in self.mixture) != len(self.src_sizes):
            raise ValueError("the mixture's sizes must add up to the number of pairs")
        self._cached: tuple[int, list[np.ndarray]] | None = None
        if bucket_growth and bucket_growth <= 1.0:
            raise ValueError(f"bucket_growth={bucket_growth}: use a ratio > 1 (or 0: off)")
        longest = int(max(self.src_sizes.max(initial=1), self.tgt_sizes.max(initial=1)))
        self.ladder = length_ladder(bucket_growth, longest) if bucket_growth else None
        too_long = int((np.maximum(self.src_sizes, self.tgt_sizes) > max_tokens).sum())
        if too_long:
            log.warning(
                "%d examples are longer than max_tokens=%d and get a batch of their own",
                too_long,
                max_tokens,
            )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order :meth:`__iter__` yields (call before each epoch)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches()
        for step in range(len(batches) // self.world_size):
            yield batches[step * self.world_size + self.rank].tolist()

    def __len__(self) -> int:
        return len(self._epoch_batches()) // self.world_size

    def padding_stats(self) -> dict:
        """Padding for the current epoch over all ranks (src and tgt_out slots both counted).

        Returns:
            ``tokens`` (real tokens incl. eos), ``padded`` (slots in the padded tensors),
            ``waste`` (1 - tokens / padded), ``batches`` (all ranks), ``shapes`` (distinct
            (B, S, T)) and ``max_batch_cost`` (largest ``B * max(S, T)``).
        """
        batches = self._epoch_batches()
        tokens = sum(int(self.src_sizes[b].sum() + self.tgt_sizes[b].sum()) for b in batches)
        shapes = [self.shape(b) for b in batches]
        padded = sum(B * (S + T) for B, S, T in shapes)
        return {
            "tokens": tokens,
            "padded": padded,
            "waste": 1.0 - tokens / padded if padded else 0.0,
            "batches": len(batches),
            "shapes": len(set(shapes)),
            "max_batch_cost": max((self._cost(b) for b in batches), default=0),
        }

    def padded_length(self, length: int) -> int:
        """The width a side whose longest sentence has `length` tokens is padded to."""
        if self.ladder is None:
            return length
        return int(self.ladder[np.searchsorted(self.ladder, length)])

    def shape(self, batch: Sequence[int]) -> tuple[int, int, int]:
        """(B, S, T) of the padded tensors of a batch of indices."""
        src, tgt = self.src_sizes[batch], self.tgt_sizes[batch]
        return len(batch), self.padded_length(int(src.max())), self.padded_length(int(tgt.max()))

    # --- internals ----------------------------------------------------------------------------

    def _cost(self, batch: np.ndarray) -> int:
        """Padded size that the budget limits: B * max(S, T)."""
        _, S, T = self.shape(batch)
        return len(batch) * max(S, T)

    def _epoch_batches(self) -> list[np.ndarray]:
        """All ranks' batches in step order: step k is ``batches[k * W:(k + 1) * W]``."""
        if self._cached is not None and self._cached[0] == self.epoch:
            return self._cached[1]
        rng = np.random.default_rng([self.seed, self.epoch])
        n = len(self.src_sizes)
        if self.mixture is not None:
            pool = self._mixed_rows()
            order = rng.permutation(pool) if self.shuffle else pool
        else:
            order = rng.permutation(n) if self.shuffle else np.arange(n)
        if self.ladder is not None:
            batches = self._pack_rungs(order)
        else:
            # Stable sorts, least significant key first: source length, then target length,
            # then the random (or corpus) order breaks ties, so buckets vary between epochs.
            order = order[np.argsort(self.tgt_sizes[order], kind="stable")]
            order = order[np.argsort(self.src_sizes[order], kind="stable")]
            batches = self._pack(order)
        batches = self._split_until_divisible(batches)
        n_steps = len(batches) // self.world_size
        steps = rng.permutation(n_steps) if self.shuffle else np.arange(n_steps)
        W = self.world_size
        batches = [batches[s * W + r] for s in steps for r in range(W)]
        self._cached = (self.epoch, batches)
        return batches

    def _mixed_rows(self) -> np.ndarray:
        """This epoch's rows under the mixture: corpus i gives round(N * w_i / sum(w)) of its
        rows, as whole copies of the corpus plus a random subset (its own generator, so the
        batch order's generator draws as without a mixture)."""
        assert self.mixture is not None
        rng = np.random.default_rng([self.seed, self.epoch, 1])
        total, weights = len(self.src_sizes), sum(w for _, w in self.mixture)
        rows, offset = [], 0
        for size, weight in self.mixture:
            copies, rest = divmod(round(total * weight / weights), size)
            rows += [np.arange(offset, offset + size)] * copies
            rows.append(offset + np.sort(rng.choice(size, rest, replace=False)))
            offset += size
        return np.concatenate(rows)

    def _pack(self, order: np.ndarray) -> list[np.ndarray]:
        """Greedy packing of length-sorted indices into batches within the budget."""
        lengths = np.maximum(self.src_sizes, self.tgt_sizes)[order].tolist()  # plain ints: fast
        batches, start, longest = [], 0, 0
        for i, length in enumerate(lengths):
            longest = max(longest, length)
            if i > start and (i - start + 1) * longest > self.max_tokens:
                batches.append(order[start:i])
                start, longest = i, length
        if start < len(lengths):
            batches.append(order[start:])
        return batches

    def _pack_rungs(self, order: np.ndarray) -> list[np.ndarray]:
        """Batches of ``rows(L)`` pairs per rung L of the ladder, in `order` within a rung; the
        pairs left over at a rung go first into the next rung's batches."""
        assert self.ladder is not None
        longest = np.maximum(self.src_sizes, self.tgt_sizes)[order]
        rung = self.ladder[np.searchsorted(self.ladder, longest)]
        by_rung = np.argsort(rung, kind="stable")
        order, rung = order[by_rung], rung[by_rung]
        starts = np.flatnonzero(np.r_[True, rung[1:] != rung[:-1]])
        batches: list[np.ndarray] = []
        carry = order[:0]
        for start, end in zip(starts, [*starts[1:], len(order)], strict=True):
            rows = max(1, self.max_tokens // int(rung[start]))
            rows -= rows % 8 if rows >= 8 else 0  # tensor-core friendly B * L (NVIDIA, fairseq)
            members = np.concatenate([carry, order[start:end]])
            full = len(members) // rows * rows
            batches += np.split(members[:full], full // rows) if full else []
            carry = members[full:]
        if len(carry):
            batches.append(carry)
        return batches

    def _split_until_divisible(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """Halve the costliest batches until every rank can get the same number.

        Splitting (rather than dropping or repeating pairs) keeps each pair exactly once and
        only makes a few batches smaller; at most ``world_size - 1`` splits are needed.
        """
        batches = list(batches)
        costs = [self._cost(b) for b in batches]
        for _ in range(-len(batches) % self.world_size):
            splittable = [i for i, b in enumerate(batches) if len(b) > 1]
            if not splittable:
                raise DataError(
                    f"{len(self.src_sizes)} pairs cannot give {self.world_size} ranks the same "
                    "number of batches; use fewer ranks or a larger split"
                )
            i = max(splittable, key=costs.__getitem__)  # first of equals: deterministic
            half = len(batches[i]) // 2
            batches[i : i + 1] = [batches[i][:half], batches[i][half:]]
            costs[i : i + 1] = [self._cost(batches[i]), self._cost(batches[i + 1])]
        return batches


def length_ladder(growth: float, longest: int, first: int = 8) -> np.ndarray:
    """Padded lengths ``first, ceil(first * growth), ...`` (each at least one more than the
    last) up to the first rung >= `longest`."""
    rungs = [first]
    while rungs[-1] < longest:
        rungs.append(max(rungs[-1] + 1, math.ceil(rungs[-1] * growth)))
    return np.array(rungs, dtype=np.int64)


class BatchIterator:
    """Sampler + encoded dataset -> :class:`Batch` objects, reading rows per batch.

    Only the batch's id columns are read from the memory-mapped dataset, so a WMT-sized split
    never sits in Python lists.

    Args:
        ds: Encoded split (columns ``src_ids``, ``tgt_ids``; see ``encode_split``).
        special: Special ids for padding and shifting.
        sampler: Yields the batches of dataset indices for this rank.
    """

    def __init__(
        self, ds: datasets.Dataset, special: SpecialIds, sampler: TokenBatchSampler
    ) -> None:
        self.ds = ds.select_columns(["src_ids", "tgt_ids"]).with_format(None)
        self.special = special
        self.sampler = sampler

    def __iter__(self) -> Iterator[Batch]:
        return self.epoch(self.sampler.epoch)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of `epoch` from the `start`-th on (a resumed run skips those it has
        trained on without reading them)."""
        self.sampler.set_epoch(epoch)
        for i, indices in enumerate(self.sampler):
            if i >= start:
                rows = self.ds[indices]
                _, S, T = self.sampler.shape(indices)
                yield collate(rows["src_ids"], rows["tgt_ids"], self.special, indices, (S, T))

    def __len__(self) -> int:
        return len(self.sampler)


def prefetch(batches: Iterator[Batch], depth: int = 2, pin_memory: bool = False) -> Iterator[Batch]:
    """Build `batches` on a background thread, up to `depth` ahead of the consumer.

    Reading Arrow rows and padding happen off the training thread, so a GPU step does not wait
    for them; `pin_memory` (CUDA) makes the later `Batch.to(device, non_blocking=True)` a true
    asynchronous copy. Order and content are those of `batches`; an exception in the producer
    is raised here, at the batch where it happened. `depth=0` iterates inline.
    """
    if depth <= 0:
        yield from batches
        return
    done = object()
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batch in batches:
                if stop.is_set():
                    return
                slots.put(batch.pin_memory() if pin_memory else batch)
            slots.put(done)
        except BaseException as e:  # handed to the consumer
            slots.put(e)

    worker = threading.Thread(target=produce, name="batch-prefetch", daemon=True)
    worker.start()
    try:
        while (item := slots.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                slots.get_nowait()
            except queue.Empty:
                worker.join(timeout=0.01)
