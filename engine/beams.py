"""Beam search with continuous batching: a sentence slot freed by a finished sentence takes the
next sentence at once, as `engine.continuous` does for greedy search.

Legend: R sentence slots (`batch_size`), b live sentences, K beams, n = b * K rows, H heads, V
vocab, C = 2K candidates per sentence; T and S as `engine.continuous`'s.

Batch by batch (`search.beam_search`), a batch runs as many steps as its longest sentence, its
last steps on a few sentences; in a server, requests that arrive while a batch runs wait for
it to end. Here each sentence holds K consecutive rows of a `SlotCache` (its beams) and its
own step count: its beams are at its own position, see only their own past (a 0 / -inf score
bias), and read its own source once per sentence (K queries per head, as `beam_search`'s).
Each step is `beam_search`'s on every live sentence at once: the top 2K tokens of each beam,
the top 2K (beam, token) extensions of each sentence, fairseq's EOS handling (`accept_eos`),
the first K non-EOS candidates kept and the rows' histories re-ranked inside each sentence.
A sentence that starts has one beam (its K rows are equal; only the first one's candidates
count, as `beam_search`'s first step, which has one row per sentence). The outputs are
`beam_search`'s, up to float rounding (as `engine.continuous`'s are `greedy_search`'s).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import (
    Candidates,
    Hypothesis,
    SpecialTokens,
    accept_eos,
    best_hypotheses,
    length_penalty_divisor,
    pick_tokens,
    top_candidates,
)
from attnmt.engine.cache import SlotCache, slot_rows, width
from attnmt.engine.continuous import (
    QueuedSentence,
    RowDecoder,
    SourceQueue,
    compact,
    drain,
    move_slots,
    slot_step,
    source_bias,
)


def continuous_beam_search(
    engine: RowDecoder,
    src_ids: list[list[int]],
    special: SpecialTokens,
    cfg: SearchConfig,
    progress: Callable[[int], object] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search of `src_ids` (non-empty id lists, no specials) on `cfg.batch_size` sentence
    slots of `cfg.beam_size` rows, the engine in eval mode: `cfg.nbest` hypotheses per
    sentence, best first, in input order. `progress(n)` is called as sentences finish.

    Raises:
        ValueError: the engine is in training mode.
    """
    stream = BeamStream(engine, special, cfg, slots=min(cfg.batch_size, len(src_ids)))
    return drain(stream, src_ids, progress, stop)


class BeamStream:
    """Beam search with continuous batching that takes new sentences between its steps (as
    `engine.continuous.GreedyStream`): `add` queues sentences (non-empty id lists, no
    specials) and returns their indices; each `step` first gives free slots (of `slots`,
    default `cfg.batch_size`) to queued sentences in the order added, then runs one step of
    every live sentence, and returns (index, `cfg.nbest` hypotheses best first) of those that
    finished. A sentence's hypotheses do not depend on when it was added or on the sentences
    beside it (up to float rounding).

    Raises:
        ValueError: the engine is in training mode or `cfg.beam_size` < 2.
    """

    def __init__(
        self, engine: RowDecoder, special: SpecialTokens, cfg: SearchConfig, slots: int = 0
    ) -> None:
        if engine.training:
            raise ValueError("continuous beam search needs the engine in eval mode (engine.eval())")
        if cfg.beam_size < 2:
            raise ValueError(f"beam search needs beam_size >= 2, got {cfg.beam_size}")
        self.engine, self.special, self.cfg = engine, special, cfg
        self.slots = max(1, slots or cfg.batch_size)
        self.queue = SourceQueue(engine, [], special, cfg, self.slots)
        self.beams: _SlotBeams | None = None
        self.live = 0  # sentences added and not yet finished

    def add(self, src_ids: list[list[int]]) -> range:
        """Queue `src_ids`; their indices (as `step` reports them)."""
        self.live += len(src_ids)
        return self.queue.add(src_ids)

    @torch.inference_mode()
    def step(self) -> list[tuple[int, list[Hypothesis]]]:
        """One step of every live sentence (after filling free slots); (index, n-best) of the
        sentences that finished."""
        beams, queue = self.beams, self.queue
        new = []
        taken = len(beams.sentences) if beams else 0
        while taken + len(new) < self.slots and (sentence := queue.next()) is not None:
            new.append(sentence)
        if beams is None:
            if not new:
                return []
            self.beams = beams = _SlotBeams(self.engine, self.cfg, self.slots, queue.device)
        for sentence in new:
            beams.load(len(beams.sentences), sentence, self.special.bos)
        done = beams.step(self.engine, self.special)
        nbest = self.cfg.nbest
        finished = [
            (beams.sentences[s].index, best_hypotheses(beams.finished[s], nbest)) for s in done
        ]
        emptied = [s for s in done if not beams.refill(s, queue.next(), self.special.bos)]
        if emptied:
            beams.drop(emptied)
        if not beams.sentences:
            self.beams = None  # the next sentence starts fresh buffers
        self.live -= len(finished)
        return finished

    @torch.inference_mode()  # the buffers are inference tensors: moved in place
    def cancel(self, indices: Iterable[int]) -> int:
        """Drop sentences `indices` between two steps, queued or in a slot (its K rows freed,
        the live slots compacted as when a sentence finishes); `step` never reports them. The
        other sentences' hypotheses stay as they were. How many were dropped."""
        drop = set(indices)
        dropped = self.queue.cancel(drop)
        beams = self.beams
        if beams is not None:
            emptied = [s for s, sentence in enumerate(beams.sentences) if sentence.index in drop]
            if emptied:
                beams.drop(emptied)
                dropped += len(emptied)
            if not beams.sentences:
                self.beams = None
        self.live -= dropped
        return dropped


class _SlotBeams:
    """The live sentences in slots 0..b-1, each with K rows (its beams) of the layers'
    `SlotCache`s, and the source mask as a score bias (R, S_max), 0 / -inf.

    On the host, per slot: its sentence, step (tokens so far on each beam), finished
    hypotheses; per row: its tokens. On the device, kept equal without syncs: per row `pos`
    (the slot's step) and `last` token; per slot `scores` (b, K), `n_finished`, `max_len`.
    """

    def __init__(self, engine: RowDecoder, cfg: SearchConfig, slots: int, device: torch.device):
        self.K, self.cfg, self.device = cfg.beam_size, cfg, device
        self.caches: list[SlotCache] = []
        self.cross_bias: Tensor | None = None  # (R, S): as wide as the widest source, rounded
        self.n_heads, self.d_head = engine.cfg.n_heads, engine.cfg.d_head
        self.slots, self.n_layers = slots, len(engine.decoder_linears)
        self.sentences: list[QueuedSentence] = []
        self.steps: list[int] = []
        self.finished: list[list[Hypothesis]] = []
        self.tokens: list[list[int]] = []  # per row
        long = dict(dtype=torch.long, device=device)
        self.pos, self.last = torch.zeros(0, **long), torch.zeros(0, **long)
        self.n_finished, self.max_len = torch.zeros(0, **long), torch.zeros(0, **long)
        self.scores = torch.zeros(0, self.K, device=device)

    def load(self, slot: int, sentence: QueuedSentence, bos: int) -> None:
        """Slot `slot` (a live one, or b: a new slot) takes `sentence` from its start: one
        live beam (the others at -inf), BOS on every row."""
        K, like = self.K, sentence.kv[0][0]
        if not self.caches:
            self.caches = [
                SlotCache(self.slots * K, self.n_heads, self.d_head, sentence.src_len, like, K)
                for _ in range(self.n_layers)
            ]
            shape = (self.slots, width(sentence.src_len))
            self.cross_bias = torch.full(shape, float("-inf"), dtype=like.dtype, device=self.device)
        for cache, (k, v) in zip(self.caches, sentence.kv, strict=True):
            cache.load(slot, k, v)
        self.cross_bias = source_bias(self.cross_bias, slot, sentence.src_len, self.sentences)
        sentence.kv = []  # the cache holds them now
        start = torch.full((self.K,), float("-inf"), device=self.device)
        start[0] = 0.0
        row = slice(slot * K, slot * K + K)
        if slot == len(self.sentences):  # a new slot
            self.sentences.append(sentence), self.steps.append(0), self.finished.append([])
            self.tokens += [[] for _ in range(K)]
            self.pos = torch.cat([self.pos, self.pos.new_zeros(K)])
            self.last = torch.cat([self.last, self.last.new_full((K,), bos)])
            self.scores = torch.cat([self.scores, start.unsqueeze(0)])
            self.n_finished = torch.cat([self.n_finished, self.n_finished.new_zeros(1)])
            budget = self.max_len.new_full((1,), sentence.budget)
            self.max_len = torch.cat([self.max_len, budget])
            return
        self.sentences[slot], self.steps[slot], self.finished[slot] = sentence, 0, []
        self.tokens[row] = [[] for _ in range(K)]
        self.pos[row], self.last[row], self.scores[slot] = 0, bos, start
        self.n_finished[slot], self.max_len[slot] = 0, sentence.budget

    def refill(self, slot: int, sentence: QueuedSentence | None, bos: int) -> bool:
        """Slot `slot` (finished) takes `sentence`; False if None (no sentence)."""
        if sentence is None:
            return False
        self.load(slot, sentence, bos)
        return True

    def step(self, engine: RowDecoder, special: SpecialTokens) -> list[int]:
        """One step of every live sentence; the slots that finished (`beam_search`'s rule: K
        finished hypotheses, or the budget passed)."""
        K, eos = self.K, special.eos
        cands = self._candidates(*self._decode(engine, special))  # (b, C) each
        accept = accept_eos(cands, self.n_finished, K, eos)  # (b, K)
        self.n_finished = self.n_finished + accept.sum(dim=1)
        self.steps = [t + 1 for t in self.steps]
        step = torch.tensor(self.steps, device=self.device)
        done = self.n_finished.ge(K) | self.max_len.lt(step)  # (b,)
        # the first K non-EOS candidates in rank order, as `search._advance`
        n_cands = cands.tokens.size(1)
        rank = torch.arange(n_cands, device=self.device)
        picked = (cands.tokens.eq(eos).long() * n_cands + rank).topk(K, largest=False).indices
        tokens = cands.tokens.gather(1, picked)  # (b, K)
        self.scores = cands.scores.gather(1, picked).masked_fill(tokens.eq(eos), float("-inf"))
        origin = cands.beams.gather(1, picked)  # (b, K): the beam each new one extends
        ended = cands.beams[:, :K]  # (b, K): the beam each accepted EOS ends
        # one host sync: per slot, K accept flags, done, K origins, K tokens, K ended beams
        host = torch.cat([accept.long(), done.long().unsqueeze(1), origin, tokens, ended], 1)
        flags = host.tolist()
        if any(any(row[:K]) for row in flags):
            self._finalize(flags, cands.scores[:, :K].tolist())
        rows = torch.arange(len(self.steps), device=self.device).unsqueeze(1) * K + origin
        for cache in self.caches:
            cache.reorder(rows.view(-1))  # (n,): row i takes row rows[i]'s history
        old = self.tokens
        self.tokens = [
            old[s * K + row[K + 1 + j]] + [row[2 * K + 1 + j]]
            for s, row in enumerate(flags)
            for j in range(K)
        ]
        self.last, self.pos = tokens.view(-1), self.pos + 1
        return [s for s, row in enumerate(flags) if row[K]]

    def _decode(self, engine: RowDecoder, special: SpecialTokens) -> tuple[Tensor, Tensor]:
        """Every row's top 2K next tokens and their log-probabilities, (n, 2K) each: EOS not
        at a sentence's first step, only EOS once a sentence holds its budget of tokens."""
        end = width(max(self.steps) + 1)
        lengths = [sentence.src_len for sentence in self.sentences]
        step = slot_step(self.pos, end, lengths, self.cross_bias, self.n_heads)
        for cache in self.caches:
            cache.start_step(step)
        x = engine.embed_rows(self.last, self.pos, end)  # (n, D)
        hidden = engine.decoder_step(x, None, None, self.caches)  # (n, D)
        at_budget = any(t >= s.budget for t, s in zip(self.steps, self.sentences, strict=True))
        # (n,) rows at their sentence's budget, only when a sentence is (known on the host)
        limit = self.pos.ge(self.max_len.repeat_interleave(self.K)) if at_budget else None
        return pick_tokens(engine.generator(hidden), special, 2 * self.K, self.pos.eq(0), limit)

    def _candidates(self, lprobs: Tensor, tokens: Tensor) -> Candidates:
        """The best 2K extensions of each sentence over its beams (`search.top_candidates`);
        a sentence at its first step has one beam: its first row's candidates only."""
        K, b = self.K, len(self.steps)
        cands = top_candidates(lprobs, tokens, self.scores, K)  # (b, C)
        starting = [s for s, t in enumerate(self.steps) if t == 0]
        if not starting:
            return cands
        slots = torch.tensor(starting, device=self.device)
        first = slots * K  # their first rows
        zeros = self.scores.new_zeros(len(starting), 1)
        fresh = top_candidates(lprobs[first], tokens[first], zeros, K)
        if len(starting) == b:
            return fresh
        pairs = zip(cands, fresh, strict=True)
        return Candidates(*(None if f is None else f.index_put((slots,), g) for f, g in pairs))

    def _finalize(self, host: list[list[int]], top_scores: list[list[float]]) -> None:
        """Store each accepted hypothesis (tokens before EOS, score), as `search._finalize`."""
        K, cfg = self.K, self.cfg
        for s, (h, scores) in enumerate(zip(host, top_scores, strict=True)):
            for j in range(K):
                if h[j]:
                    total = scores[j]
                    penalty = length_penalty_divisor(self.steps[s], cfg.length_penalty, cfg.lp_type)
                    prefix = self.tokens[s * K + h[3 * K + 1 + j]]
                    self.finished[s].append(Hypothesis(list(prefix), total / penalty, total))

    def drop(self, emptied: list[int]) -> None:
        """Slots `emptied` go (no sentence left to take), the others compacted
        (`engine.continuous.compact`), each slot with its K rows."""
        K = self.K
        m, movers, holes = compact(len(self.sentences), emptied)
        if movers:
            end = max(self.steps[s] for s in movers)
            src_len = max(self.sentences[s].src_len for s in movers)
            slots, to = move_slots(self.caches, movers, holes, end, src_len, self.device)
            for state in (self.cross_bias, self.scores, self.n_finished, self.max_len):
                state[to] = state[slots]
            rows, to_rows = slot_rows(slots, K), slot_rows(to, K)
            for state in (self.pos, self.last):
                state[to_rows] = state[rows]
            for host in (self.sentences, self.steps, self.finished):
                for s, h in zip(movers, holes, strict=True):
                    host[h] = host[s]
            for s, h in zip(movers, holes, strict=True):
                self.tokens[h * K : h * K + K] = self.tokens[s * K : s * K + K]
        self.scores, self.n_finished = self.scores[:m], self.n_finished[:m]
        self.max_len, self.pos, self.last = self.max_len[:m], self.pos[: m * K], self.last[: m * K]
        del self.sentences[m:], self.steps[m:], self.finished[m:], self.tokens[m * K :]
