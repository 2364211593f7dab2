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
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnmt.data.batching import encode_source_batch
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import (
    Hypothesis,
    SpecialTokens,
    length_penalty_divisor,
    max_lengths,
    pick_tokens,
)
from attnmt.engine.cache import SlotCache, SlotStep, widened
from attnmt.model.attention import padding_mask

if TYPE_CHECKING:
    from attnmt.engine.engine import Engine


class _Sentence:
    """A sentence waiting for a row: its cross-attention K/V per layer, (H, S, Dh) each."""

    __slots__ = ("index", "kv", "src_len", "budget")

    def __init__(self, index: int, kv: list[tuple[Tensor, Tensor]], src_len: int, budget: int):
        self.index, self.kv, self.src_len, self.budget = index, kv, src_len, budget


@torch.inference_mode()
def continuous_greedy_search(
    engine: Engine,
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
    device = next(engine.parameters()).device
    n_layers = len(engine.decoder_linears)
    H, Dh = engine.cfg.n_heads, engine.cfg.d_head
    R = max(1, min(cfg.batch_size, len(src_ids)))
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    waiting: deque[_Sentence] = deque()
    next_index = 0

    def encode_more() -> None:  # the next R sentences, as `greedy_search` encodes a batch
        nonlocal next_index
        indices = range(next_index, min(next_index + R, len(src_ids)))
        next_index = indices.stop
        src = encode_source_batch([src_ids[i] for i in indices], special).to(device)  # (B, S)
        mask = padding_mask(src, special.pad)
        memory = engine.encode(src, mask)  # (B, S, D)
        budgets = max_lengths(src, special, cfg.max_len_a, cfg.max_len_b).tolist()
        kvs = engine.cross_kv(memory)  # L x (B, H, S, Dh)
        lengths = mask.sum(dim=1).tolist()
        for j, i in enumerate(indices):
            S = lengths[j]  # real tokens + EOS: the K/V a row needs
            kv = [(k[j, :, :S], v[j, :, :S]) for k, v in kvs]
            waiting.append(_Sentence(i, kv, S, budgets[j]))

    def next_sentence() -> _Sentence | None:
        if not waiting and next_index < len(src_ids):
            encode_more()
        return waiting.popleft() if waiting else None

    first = next_sentence()
    if first is None:
        return results
    like = first.kv[0][0]
    caches = [SlotCache(R, H, Dh, first.src_len, like) for _ in range(n_layers)]
    cross_bias = torch.full((R, like.size(1)), float("-inf"), dtype=like.dtype, device=device)
    # Per live row. On the host: its sentence, position (tokens so far) and tokens; on the
    # device, kept equal without syncs: position, budget, last token, log-probability so far.
    rows: list[_Sentence] = []
    positions: list[int] = []
    tokens: list[list[int]] = []
    new_rows = [first]
    while len(new_rows) < R and (sentence := next_sentence()) is not None:
        new_rows.append(sentence)
    pos = torch.zeros(len(new_rows), dtype=torch.long, device=device)  # (n,)
    budget = torch.tensor([s.budget for s in new_rows], device=device)  # (n,)
    last = torch.full((len(new_rows),), special.bos, dtype=torch.long, device=device)  # (n,)
    sums = torch.zeros(len(new_rows), device=device)  # (n,)

    def load(row: int, sentence: _Sentence) -> None:
        nonlocal cross_bias
        for cache, (k, v) in zip(caches, sentence.kv, strict=True):
            cache.load(row, k, v)
        if sentence.src_len > cross_bias.size(1):
            cross_bias = widened(cross_bias, 1, sentence.src_len).fill_(float("-inf"))
            for r, other in enumerate(rows):
                cross_bias[r, : other.src_len] = 0.0
        cross_bias[row].fill_(float("-inf"))
        cross_bias[row, : sentence.src_len] = 0.0
        sentence.kv = []  # the rows hold them now
        if row == len(rows):
            rows.append(sentence), positions.append(0), tokens.append([])
        else:
            rows[row], positions[row], tokens[row] = sentence, 0, []

    for r, sentence in enumerate(new_rows):
        load(r, sentence)
    while rows:
        n = len(rows)
        end = max(positions) + 1
        src_len = max(sentence.src_len for sentence in rows)
        row_ids = torch.arange(n, device=device)
        hidden_pos = torch.arange(end, device=device).unsqueeze(0) > pos.unsqueeze(1)  # (n, T)
        self_bias = torch.zeros(n, end, dtype=like.dtype, device=device)
        self_bias.masked_fill_(hidden_pos, float("-inf"))
        self_bias = self_bias.unsqueeze(1).expand(n, H, end).reshape(n * H, 1, end)
        step_cross = cross_bias[:n, :src_len].view(n, 1, 1, src_len).expand(n, H, 1, src_len)
        step_cross = step_cross.contiguous()  # (n, H, 1, S), as `StepKVCache.cross_bias`
        step = SlotStep(row_ids, pos, end, src_len, self_bias, step_cross)
        for cache in caches:
            cache.start_step(step)
        x = engine.embed_rows(last, pos, end)  # (n, D)
        hidden = engine.decoder_step(x, None, None, caches)  # (n, D)
        # rows at their budget, if any (known on the host): no device-side test otherwise
        at_budget = any(p >= s.budget for p, s in zip(positions, rows, strict=True))
        best, picked = pick_tokens(
            engine.generator(hidden), special, 1, pos.eq(0), pos.ge(budget) if at_budget else None
        )
        lprob, token = best.squeeze(1), picked.squeeze(1)  # (n,)
        sums = sums + lprob
        pos = pos + 1
        last = token
        # the step's one sync; ids < 2^24 are exact in float32
        chosen, totals = torch.stack([token.to(sums.dtype), sums]).tolist()
        finished = []
        for r, t in enumerate(chosen):
            positions[r] += 1
            if t == special.eos:
                finished.append(r)
            else:
                tokens[r].append(int(t))
        if not finished:
            continue
        for r in finished:
            penalty = length_penalty_divisor(positions[r], cfg.length_penalty, cfg.lp_type)
            results[rows[r].index] = [Hypothesis(tokens[r], totals[r] / penalty, totals[r])]
        if progress is not None:
            progress(len(finished))
        emptied = []
        for r in finished:  # a new sentence in the row, or the row goes
            sentence = next_sentence()
            if sentence is None:
                emptied.append(r)
                continue
            load(r, sentence)
            pos[r], budget[r], last[r], sums[r] = 0, sentence.budget, special.bos, 0.0
        if emptied:  # no sentence left to take: keep the live rows only, in rows 0..m-1
            gone = set(emptied)
            keep_list = [r for r in range(n) if r not in gone]
            keep = torch.tensor(keep_list, dtype=torch.long, device=device)
            end = max((positions[r] for r in keep_list), default=0)
            src_len = max((rows[r].src_len for r in keep_list), default=0)
            for cache in caches:
                cache.keep(keep, end, src_len)
            cross_bias[: len(keep_list)] = cross_bias.index_select(0, keep)
            pos, budget = pos.index_select(0, keep), budget.index_select(0, keep)
            last, sums = last.index_select(0, keep), sums.index_select(0, keep)
            rows[:] = [rows[r] for r in keep_list]
            positions[:] = [positions[r] for r in keep_list]
            tokens[:] = [tokens[r] for r in keep_list]
    return results
