"""Greedy search with continuous batching: a row freed by a finished sentence takes the next
sentence at once, instead of the batch running on with ever fewer rows until its longest
sentence ends.

Legend: R rows (slots, `batch_size`), n live rows, H heads, Dh head dim, T longest history + 1 and
S longest source of the live rows, each rounded up to a multiple of `cache.WIDTH_STEP`.

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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from attnmt.data.batching import encode_source_batch
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import (
    Hypothesis,
    SpecialTokens,
    Stop,
    check_stop,
    length_penalty_divisor,
    max_lengths,
    pick_tokens,
)
from attnmt.engine.cache import SlotCache, SlotStep, StepCache, width
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


class QueuedSentence:
    """A sentence waiting for a row: its cross-attention K/V per layer, (H, S, Dh) each."""

    __slots__ = ("index", "kv", "src_len", "budget")

    def __init__(self, index: int, kv: list[tuple[Tensor, Tensor]], src_len: int, budget: int):
        self.index, self.kv, self.src_len, self.budget = index, kv, src_len, budget


def continuous_greedy_search(
    engine: RowDecoder,
    src_ids: list[list[int]],
    special: SpecialTokens,
    cfg: SearchConfig,
    progress: Callable[[int], object] | None = None,
    stop: Stop | None = None,
) -> list[list[Hypothesis]]:
    """Greedy search of `src_ids` (non-empty id lists, no specials) on `cfg.batch_size` rows,
    with the engine in eval mode.

    Returns one hypothesis per sentence, in input order. `progress(n)` is called as sentences
    finish; `stop` before each step (`search.check_stop`). One host sync per step (the chosen
    tokens with the running sums).

    Raises:
        ValueError: the engine is in training mode.
    """
    stream = GreedyStream(engine, special, cfg, rows=min(cfg.batch_size, len(src_ids)))
    return [[hypothesis] for hypothesis in drain(stream, src_ids, progress, stop)]


class SentenceStream(Protocol):
    """`GreedyStream` or `engine.beams.BeamStream`: `add` sentences, `step` until `live` is 0."""

    live: int

    def add(self, src_ids: list[list[int]]) -> range: ...

    def step(self) -> list[tuple[int, Any]]: ...


def drain(
    stream: SentenceStream,
    src_ids: list[list[int]],
    progress: Callable[[int], object] | None = None,
    stop: Stop | None = None,
) -> list[Any]:
    """`src_ids` through `stream` until it runs dry: what `step` reports of each sentence, in
    input order; `progress(n)` as sentences finish; `check_stop(stop)` before each step."""
    stream.add(src_ids)
    results: list[Any] = [None] * len(src_ids)
    while stream.live:
        check_stop(stop)
        finished = stream.step()
        for index, found in finished:
            results[index] = found
        if finished and progress is not None:
            progress(len(finished))
    return results


class GreedyStream:
    """Greedy search with continuous batching that takes new sentences between its steps
    (serve.py's model thread adds requests as they arrive, as vLLM's scheduler does).

    `add` queues sentences (non-empty id lists, no specials) and returns their indices; each
    `step` first gives free rows (of `rows`, default `cfg.batch_size`) to queued sentences in
    the order added, then decodes one token on every live row, and returns the sentences that
    finished with it. A sentence's hypothesis does not depend on when it was added or on the
    rows beside it (up to float rounding: see the module docstring).

    `gather` > 1: while other rows run, sentences added one by one wait up to `gather` steps
    for others, to be encoded `gather` at a time: the encoder's cost per sentence fell by 40%
    from one sentence a batch to three (bf16), and a server under load gets about one new
    sentence a step (docs/benchmarks.md, "The server's steps").

    Raises:
        ValueError: the engine is in training mode.
    """

    def __init__(
        self,
        engine: RowDecoder,
        special: SpecialTokens,
        cfg: SearchConfig,
        rows: int = 0,
        gather: int = 1,
    ) -> None:
        if engine.training:
            raise ValueError(
                "continuous_greedy_search needs the engine in eval mode (engine.eval())"
            )
        self.engine, self.special, self.cfg = engine, special, cfg
        self.slots = max(1, rows or cfg.batch_size)
        self.queue = SourceQueue(engine, [], special, cfg, self.slots)
        self.rows: _Rows | None = None
        self.live = 0  # sentences added and not yet finished
        self.gather = max(1, gather)
        self.held = 0  # steps the sentences not yet encoded have waited (`gather`)

    def add(self, src_ids: list[list[int]]) -> range:
        """Queue `src_ids`; their indices (as `step` reports them)."""
        self.live += len(src_ids)
        return self.queue.add(src_ids)

    @torch.inference_mode()
    def step(self) -> list[tuple[int, Hypothesis]]:
        """One token for every live row (after filling free rows); (index, hypothesis) of the
        sentences that finished."""
        rows, queue, special, cfg = self.rows, self.queue, self.special, self.cfg
        holding = self._holding()
        new = []
        while (
            not holding
            and (len(rows.sentences) if rows else 0) + len(new) < self.slots
            and (sentence := queue.next()) is not None
        ):
            new.append(sentence)
        if rows is None:
            if not new:
                return []
            self.rows = rows = _Rows(self.engine, new, self.slots, special.bos, queue.device)
        elif new:
            rows.extend(new, special.bos)
        chosen, totals = rows.step(self.engine, special)
        finished = rows.advance(chosen, special.eos)
        done = []
        for r in finished:
            penalty = length_penalty_divisor(rows.positions[r], cfg.length_penalty, cfg.lp_type)
            hypothesis = Hypothesis(rows.tokens[r], totals[r] / penalty, totals[r])
            done.append((rows.sentences[r].index, hypothesis))
        # a new sentence in the row, or the row goes
        emptied = [
            r
            for r in finished
            if not rows.refill(r, None if holding else queue.next(), special.bos)
        ]
        if emptied:
            rows.drop(emptied)
        if not rows.sentences:
            self.rows = None  # the next sentence starts fresh buffers
        self.live -= len(done)
        return done

    @torch.inference_mode()  # the buffers are inference tensors: moved in place
    def cancel(self, indices: Iterable[int]) -> int:
        """Drop sentences `indices` between two steps, queued or on a row (its row freed, the
        live rows compacted as when a sentence finishes); `step` never reports them. The
        other sentences' hypotheses stay as they were. How many were dropped."""
        drop = set(indices)
        dropped = self.queue.cancel(drop)
        rows = self.rows
        if rows is not None:
            emptied = [r for r, sentence in enumerate(rows.sentences) if sentence.index in drop]
            if emptied:
                rows.drop(emptied)
                dropped += len(emptied)
            if not rows.sentences:
                self.rows = None
        self.live -= dropped
        return dropped

    def _holding(self) -> bool:
        """Whether this step leaves the sentences added but not yet encoded waiting, to encode
        `gather` of them together: other rows run, none is encoded, fewer than `gather` were
        added, and they have waited fewer than `gather` steps."""
        queue = self.queue
        holding = self.rows is not None and not queue.waiting and 0 < queue.pending < self.gather
        holding = holding and self.held < self.gather
        self.held = self.held + 1 if holding else 0
        return holding


class SourceQueue:
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
        self.waiting: deque[QueuedSentence] = deque()
        self.next_index = 0  # of the next sentence to encode
        self.dropped: set[int] = set()  # cancelled, not yet encoded: never encoded

    def add(self, src_ids: list[list[int]]) -> range:
        """Queue `src_ids` (encoded when rows need them); their indices."""
        start = len(self.src_ids)
        self.src_ids.extend(src_ids)
        return range(start, len(self.src_ids))

    @property
    def pending(self) -> int:
        """Sentences added and not yet encoded (cancelled ones not counted)."""
        return len(self.src_ids) - self.next_index - len(self.dropped)

    def cancel(self, indices: set[int]) -> int:
        """Drop the queued sentences among `indices`, encoded or not; how many there were."""
        before = len(self.waiting)
        self.waiting = deque(s for s in self.waiting if s.index not in indices)
        later = {i for i in indices if self.next_index <= i < len(self.src_ids)} - self.dropped
        self.dropped |= later
        return before - len(self.waiting) + len(later)

    def next(self) -> QueuedSentence | None:
        """The next sentence, None when every one has had its row."""
        if not self.waiting and self.pending:
            self._encode_more()
        return self.waiting.popleft() if self.waiting else None

    def _encode_more(self) -> None:
        indices: list[int] = []  # the next `size` sentences not cancelled
        while len(indices) < self.size and self.next_index < len(self.src_ids):
            if self.next_index in self.dropped:
                self.dropped.discard(self.next_index)
            else:
                indices.append(self.next_index)
            self.next_index += 1
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
            self.waiting.append(QueuedSentence(i, kv, S, budgets[j]))


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
        sentences: list[QueuedSentence],
        slots: int,
        bos: int,
        device: torch.device,
    ) -> None:
        first = sentences[0]
        like = first.kv[0][0]
        H, Dh = engine.cfg.n_heads, engine.cfg.d_head
        self.device, self.n_heads = device, H
        self.caches = [SlotCache(slots, H, Dh, first.src_len, like) for _ in engine.decoder_linears]
        self.cross_bias = torch.full(  # (R, S): as wide as the widest source loaded, rounded
            (slots, width(like.size(1))), float("-inf"), dtype=like.dtype, device=device
        )
        self.sentences: list[QueuedSentence] = []
        self.positions: list[int] = []
        self.tokens: list[list[int]] = []
        self.pos = torch.zeros(0, dtype=torch.long, device=device)
        self.budget = torch.zeros(0, dtype=torch.long, device=device)
        self.last = torch.zeros(0, dtype=torch.long, device=device)
        self.sums = torch.zeros(0, device=device)
        self.extend(sentences, bos)

    def extend(self, sentences: list[QueuedSentence], bos: int) -> None:
        """New rows n..n+k-1 (k <= free slots) take `sentences` from their start."""
        for sentence in sentences:
            self._load(len(self.sentences), sentence)
        k, device = len(sentences), self.device
        self.pos = torch.cat([self.pos, self.pos.new_zeros(k)])
        budgets = torch.tensor([s.budget for s in sentences], dtype=torch.long, device=device)
        self.budget = torch.cat([self.budget, budgets])
        self.last = torch.cat([self.last, self.last.new_full((k,), bos)])
        self.sums = torch.cat([self.sums, self.sums.new_zeros(k)])

    def step(self, engine: RowDecoder, special: SpecialTokens) -> tuple[list[float], list[float]]:
        """One token for every live row: the chosen ids and the rows' running sums, on the host
        (the step's one sync; ids < 2^24 are exact in float32)."""
        pos, positions, sentences = self.pos, self.positions, self.sentences
        end = max(positions) + 1
        lengths = [sentence.src_len for sentence in sentences]
        step = slot_step(pos, width(end), lengths, self.cross_bias, self.n_heads)
        for cache in self.caches:
            cache.start_step(step)  # rows 0..n-1 read `width(end)` positions, sources rounded
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

    def refill(self, row: int, sentence: QueuedSentence | None, bos: int) -> bool:
        """Row `row` (finished) takes `sentence` from its start; False if None (no sentence)."""
        if sentence is None:
            return False
        self._load(row, sentence)
        self.pos[row], self.budget[row] = 0, sentence.budget
        self.last[row], self.sums[row] = bos, 0.0
        return True

    def _load(self, row: int, sentence: QueuedSentence) -> None:
        """Row `row` (a live one, or n: a new row) takes `sentence`'s K/V and source mask; on
        the host, from its start."""
        for cache, (k, v) in zip(self.caches, sentence.kv, strict=True):
            cache.load(row, k, v)
        self.cross_bias = source_bias(self.cross_bias, row, sentence.src_len, self.sentences)
        sentence.kv = []  # the rows hold them now
        if row == len(self.sentences):
            self.sentences.append(sentence), self.positions.append(0), self.tokens.append([])
        else:
            self.sentences[row], self.positions[row], self.tokens[row] = sentence, 0, []

    def drop(self, emptied: list[int]) -> None:
        """Rows `emptied` go (no sentence left to take), the others compacted (`compact`)."""
        m, movers, holes = compact(len(self.sentences), emptied)
        if movers:
            end = max(self.positions[r] for r in movers)
            src_len = max(self.sentences[r].src_len for r in movers)
            rows, to = move_slots(self.caches, movers, holes, end, src_len, self.device)
            for state in (self.cross_bias, self.pos, self.budget, self.last, self.sums):
                state[to] = state[rows]
            for host in (self.sentences, self.positions, self.tokens):
                for r, h in zip(movers, holes, strict=True):
                    host[h] = host[r]
        self.pos, self.budget = self.pos[:m], self.budget[:m]
        self.last, self.sums = self.last[:m], self.sums[:m]
        del self.sentences[m:], self.positions[m:], self.tokens[m:]


def compact(live: int, emptied: list[int]) -> tuple[int, list[int], list[int]]:
    """Slots 0..`live`-1 less `emptied`, kept in 0..m-1 (m = those that stay): (m, the live
    slots past m, the emptied slots below m, as many), the first moving into the second, so
    that only their own buffers are copied (slots are independent: their order does not
    matter)."""
    gone = set(emptied)
    m = live - len(gone)
    return m, [s for s in range(m, live) if s not in gone], sorted(s for s in gone if s < m)


def move_slots(
    caches: list[SlotCache], movers: list[int], holes: list[int], end: int, src_len: int,
    device: torch.device,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Sentence slots `movers` move to `holes` in every layer's cache (their first `end`
    positions, `src_len` sources); both as index tensors on `device`, for the caller's
    per-slot state."""
    slots = torch.tensor(movers, dtype=torch.long, device=device)
    to = torch.tensor(holes, dtype=torch.long, device=device)
    for cache in caches:
        cache.move(slots, to, end, src_len)
    return slots, to


def slot_step(
    pos: Tensor, end: int, src_lengths: list[int], cross_bias: Tensor, n_heads: int
) -> SlotStep:
    """A continuous-batching step (`cache.SlotStep`) of rows at positions `pos` (n,) reading
    `end` positions, for b sentences of `src_lengths` (b,) with K = n / b rows each (1 greedy,
    the beams): each row's past as a (n * H, 1, T) bias, each sentence's source mask from
    `cross_bias` (>= b, S_max) as a (b, H, 1, S) one, S the longest `width`-rounded."""
    n, b, H, device = pos.numel(), len(src_lengths), n_heads, pos.device
    src_len = width(max(src_lengths))
    hidden_pos = torch.arange(end, device=device).unsqueeze(0) > pos.unsqueeze(1)  # (n, T)
    self_bias = torch.zeros(n, end, dtype=cross_bias.dtype, device=device)
    self_bias.masked_fill_(hidden_pos, float("-inf"))
    self_bias = self_bias.unsqueeze(1).expand(n, H, end).reshape(n * H, 1, end)
    step_cross = cross_bias[:b, :src_len].view(b, 1, 1, src_len)
    step_cross = step_cross.expand(b, H, 1, src_len).contiguous()  # as `StepKVCache`'s
    return SlotStep(torch.arange(n, device=device), pos, end, src_len, self_bias, step_cross)


def source_bias(cross_bias: Tensor, slot: int, src_len: int, live: list[QueuedSentence]) -> Tensor:
    """The source masks (R, S_max) as 0 / -inf with slot `slot` taking a source of `src_len`
    tokens: widened (`width`-rounded) when it is longer than any before, the `live` slots'
    sources kept. In place where no widening is needed."""
    if src_len > cross_bias.size(1):  # rebuilt from the live sources: no copy of the old
        cross_bias = cross_bias.new_full((cross_bias.size(0), width(src_len)), float("-inf"))
        for s, sentence in enumerate(live):
            cross_bias[s, : sentence.src_len] = 0.0
    cross_bias[slot].fill_(float("-inf"))
    cross_bias[slot, :src_len] = 0.0
    return cross_bias
