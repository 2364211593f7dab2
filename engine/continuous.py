"""Greedy search with continuous batching: a row freed by a finished sentence takes the next
sentence at once, instead of the batch running on with ever fewer rows until its longest
sentence ends.

Legend: R rows (slots, `batch_size`), n live rows, H heads, Dh head dim, T longest history + 1,
S longest source of the live rows.

Batch by batch (`search.greedy_search`), a batch of 64 test2016 sentences takes as many steps
as its longest output, and its last steps run a handful of rows at nearly the cost of 64 (a
decoder step on one row took 2.7 ms against 8.5 ms on 64: docs/benchmarks.md). Here rows
are at different positions: each keeps its own position and history length, its
self-attention sees only its own past (a 0 / -inf score bias), and its cross-attention reads
its own sentence's keys and values (padded to S, masked the same way). Sentences are encoded
`batch_size` at a time, in the order given (`Translator` gives them longest first), as they
are needed. The choices are `greedy_search`'s (minimum length 1, the per-sentence budget,
forced EOS, pad and BOS never generated), and so are the outputs, up to float rounding: the
masked positions add exact zeros to the softmax sums, but the sums may run in another order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

import torch
from torch import Tensor, nn

from attnmt.data.batching import encode_source_batch
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import (
    Hypothesis,
    SpecialTokens,
    length_penalty_divisor,
    max_lengths,
    pick_tokens,
)
from attnmt.engine.cache import SlotCache, SlotStep, StepCache, widened
from attnmt.model.attention import padding_mask
from attnmt.model.config import ModelConfig


class RowDecoder(Protocol):
    """What continuous batching runs (`engine.Engine` has it): the encoder, each decoder
    layer's cross-attention K/V, and the one-token decoder step on rows at their own
    positions."""

    training: bool
    cfg: ModelConfig
    decoder_linears: nn.ModuleList  # one entry per decoder layer
    generator: Callable[[Tensor], Tensor]  # (n, D) -> logits (n, V)

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor: ...

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]: ...

    def embed_rows(self, tgt_ids: Tensor, positions: Tensor, end: int) -> Tensor: ...

    def decoder_step(
        self, x: Tensor, memory: Tensor | None, src_mask: Tensor | None, caches: list[StepCache]
    ) -> Tensor: ...


class _Sentence:
    """A sentence waiting for a row: its cross-attention K/V per layer, (H, S, Dh) each."""

    __slots__ = ("index", "kv", "src_len", "budget")

    def __init__(self, index: int, kv: list[tuple[Tensor, Tensor]], src_len: int, budget: int):
        self.index, self.kv, self.src_len, self.budget = index, kv, src_len, budget


@torch.inference_mode()
def continuous_greedy_search(
    engine: RowDecoder,
    src_ids: list[list[int]],
    special: SpecialTokens,
    cfg: SearchConfig,
    progress: Callable[[int], object] | None = None,
) -> list[list[Hypothesis]]:
    """Greedy search of `src_ids` (non-empty id lists, no specials) on `cfg.batch_size` rows,
    with the engine in eval mode.

    Returns one hypothesis per sentence, in input order. `progress(n)` is called as sentences
    finish. One host sync per step (the chosen tokens with the running sums).

    Raises:
        ValueError: the engine is in training mode.
    """
    if engine.training:
        raise ValueError("continuous_greedy_search needs the engine in eval mode (engine.eval())")
    R = max(1, min(cfg.batch_size, len(src_ids)))
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    queue = _Queue(engine, src_ids, special, cfg, R)
    first = queue.next()
    if first is None:
        return results
    new_rows = [first]
    while len(new_rows) < R and (sentence := queue.next()) is not None:
        new_rows.append(sentence)
    rows = _Rows(engine, new_rows, R, special.bos, queue.device)
    while rows.sentences:
        chosen, totals = rows.step(engine, special)
        finished = rows.advance(chosen, special.eos)
        if not finished:
            continue
        for r in finished:
            penalty = length_penalty_divisor(rows.positions[r], cfg.length_penalty, cfg.lp_type)
            hypothesis = Hypothesis(rows.tokens[r], totals[r] / penalty, totals[r])
            results[rows.sentences[r].index] = [hypothesis]
        if progress is not None:
            progress(len(finished))
        # a new sentence in the row, or the row goes
        emptied = [r for r in finished if not rows.refill(r, queue.next(), special.bos)]
        if emptied:
            rows.drop(emptied)
    return results


class _Queue:
    """The sentences in input order, encoded `size` at a time (as `greedy_search` encodes a
    batch) when a row needs one and none is encoded yet."""

    def __init__(
        self,
        engine: RowDecoder,
        src_ids: list[list[int]],
        special: SpecialTokens,
        cfg: SearchConfig,
        size: int,
    ) -> None:
        self.engine, self.src_ids, self.special, self.cfg = engine, src_ids, special, cfg
        self.size = size
        self.device = next(engine.parameters()).device
        self.waiting: deque[_Sentence] = deque()
        self.next_index = 0  # of the next sentence to encode

    def next(self) -> _Sentence | None:
        """The next sentence, None when every one has had its row."""
        if not self.waiting and self.next_index < len(self.src_ids):
            self._encode_more()
        return self.waiting.popleft() if self.waiting else None

    def _encode_more(self) -> None:
        indices = range(self.next_index, min(self.next_index + self.size, len(self.src_ids)))
        self.next_index = indices.stop
        special, engine = self.special, self.engine
        src = encode_source_batch([self.src_ids[i] for i in indices], special)  # (B, S)
        src = src.to(self.device)
        mask = padding_mask(src, special.pad)
        memory = engine.encode(src, mask)  # (B, S, D)
        budgets = max_lengths(src, special, self.cfg.max_len_a, self.cfg.max_len_b).tolist()
        kvs = engine.cross_kv(memory)  # L x (B, H, S, Dh)
        lengths = mask.sum(dim=1).tolist()
        for j, i in enumerate(indices):
            S = lengths[j]  # real tokens + EOS: the K/V a row needs
            kv = [(k[j, :, :S], v[j, :, :S]) for k, v in kvs]
            self.waiting.append(_Sentence(i, kv, S, budgets[j]))


class _Rows:
    """The live rows 0..n-1 of R slots, each on its own sentence: the layers' `SlotCache`s and
    the source mask as a score bias (R, S_max), 0 / -inf.

    Per live row. On the host: its sentence, position (tokens so far) and tokens; on the
    device, kept equal without syncs: `pos`, `budget`, `last` token, `sums` (log-probability so
    far), each (n,).
    """

    def __init__(
        self,
        engine: RowDecoder,
        sentences: list[_Sentence],
        slots: int,
        bos: int,
        device: torch.device,
    ) -> None:
        first = sentences[0]
        like = first.kv[0][0]
        H, Dh = engine.cfg.n_heads, engine.cfg.d_head
        self.device, self.dtype, self.n_heads = device, like.dtype, H
        self.caches = [SlotCache(slots, H, Dh, first.src_len, like) for _ in engine.decoder_linears]
        self.cross_bias = torch.full(
            (slots, like.size(1)), float("-inf"), dtype=like.dtype, device=device
        )
        self.sentences: list[_Sentence] = []
        self.positions: list[int] = []
        self.tokens: list[list[int]] = []
        n = len(sentences)
        self.pos = torch.zeros(n, dtype=torch.long, device=device)
        self.budget = torch.tensor([s.budget for s in sentences], device=device)
        self.last = torch.full((n,), bos, dtype=torch.long, device=device)
        self.sums = torch.zeros(n, device=device)
        for r, sentence in enumerate(sentences):
            self._load(r, sentence)

    def step(self, engine: RowDecoder, special: SpecialTokens) -> tuple[list[float], list[float]]:
        """One token for every live row: the chosen ids and the rows' running sums, on the host
        (the step's one sync; ids < 2^24 are exact in float32)."""
        pos, positions, sentences = self.pos, self.positions, self.sentences
        end = max(positions) + 1
        slot_step = self._slot_step(end)
        for cache in self.caches:
            cache.start_step(slot_step)
        x = engine.embed_rows(self.last, pos, end)  # (n, D)
        hidden = engine.decoder_step(x, None, None, self.caches)  # (n, D)
        # rows at their budget, if any (known on the host): no device-side test otherwise
        at_budget = any(p >= s.budget for p, s in zip(positions, sentences, strict=True))
        best, picked = pick_tokens(
            engine.generator(hidden),
            special,
            1,
            pos.eq(0),
            pos.ge(self.budget) if at_budget else None,
        )
        lprob, token = best.squeeze(1), picked.squeeze(1)  # (n,)
        self.sums = sums = self.sums + lprob
        self.pos = pos + 1
        self.last = token
        chosen, totals = torch.stack([token.to(sums.dtype), sums]).tolist()
        return chosen, totals

    def _slot_step(self, end: int) -> SlotStep:
        """What the caches read this step: rows 0..n-1 write `pos` and read `end` positions."""
        n, H, pos, device = len(self.sentences), self.n_heads, self.pos, self.device
        src_len = max(sentence.src_len for sentence in self.sentences)
        row_ids = torch.arange(n, device=device)
        hidden_pos = torch.arange(end, device=device).unsqueeze(0) > pos.unsqueeze(1)  # (n, T)
        self_bias = torch.zeros(n, end, dtype=self.dtype, device=device)
        self_bias.masked_fill_(hidden_pos, float("-inf"))
        self_bias = self_bias.unsqueeze(1).expand(n, H, end).reshape(n * H, 1, end)
        step_cross = self.cross_bias[:n, :src_len].view(n, 1, 1, src_len)
        step_cross = step_cross.expand(n, H, 1, src_len).contiguous()  # as `StepKVCache`'s
        return SlotStep(row_ids, pos, end, src_len, self_bias, step_cross)

    def advance(self, chosen: list[float], eos: int) -> list[int]:
        """Each row moves on by its chosen token; the rows that chose EOS (they finished)."""
        positions, tokens = self.positions, self.tokens
        finished = []
        for r, t in enumerate(chosen):
            positions[r] += 1
            if t == eos:
                finished.append(r)
            else:
                tokens[r].append(int(t))
        return finished

    def refill(self, row: int, sentence: _Sentence | None, bos: int) -> bool:
        """Row `row` (finished) takes `sentence` from its start; False if None (no sentence)."""
        if sentence is None:
            return False
        self._load(row, sentence)
        self.pos[row], self.budget[row] = 0, sentence.budget
        self.last[row], self.sums[row] = bos, 0.0
        return True

    def _load(self, row: int, sentence: _Sentence) -> None:
        """Row `row` (a live one, or n: a new row) takes `sentence`'s K/V and source mask; on
        the host, from its start."""
        for cache, (k, v) in zip(self.caches, sentence.kv, strict=True):
            cache.load(row, k, v)
        cross_bias = self.cross_bias
        if sentence.src_len > cross_bias.size(1):
            cross_bias = widened(cross_bias, 1, sentence.src_len).fill_(float("-inf"))
            for r, other in enumerate(self.sentences):
                cross_bias[r, : other.src_len] = 0.0
            self.cross_bias = cross_bias
        cross_bias[row].fill_(float("-inf"))
        cross_bias[row, : sentence.src_len] = 0.0
        sentence.kv = []  # the rows hold them now
        if row == len(self.sentences):
            self.sentences.append(sentence), self.positions.append(0), self.tokens.append([])
        else:
            self.sentences[row], self.positions[row], self.tokens[row] = sentence, 0, []

    def drop(self, emptied: list[int]) -> None:
        """Rows `emptied` go (no sentence left to take): the live rows move to 0..m-1."""
        gone = set(emptied)
        keep_list = [r for r in range(len(self.sentences)) if r not in gone]
        keep = torch.tensor(keep_list, dtype=torch.long, device=self.device)
        end = max((self.positions[r] for r in keep_list), default=0)
        src_len = max((self.sentences[r].src_len for r in keep_list), default=0)
        for cache in self.caches:
            cache.keep(keep, end, src_len)
        self.cross_bias[: len(keep_list)] = self.cross_bias.index_select(0, keep)
        self.pos, self.budget = self.pos.index_select(0, keep), self.budget.index_select(0, keep)
        self.last, self.sums = self.last.index_select(0, keep), self.sums.index_select(0, keep)
        self.sentences[:] = [self.sentences[r] for r in keep_list]
        self.positions[:] = [self.positions[r] for r in keep_list]
        self.tokens[:] = [self.tokens[r] for r in keep_list]
