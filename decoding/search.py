"""Greedy and beam search on the model's KV cache: source ids in, target ids out.

Legend: B batch (live sentences), K beam, N = B * K rows, S src len, V vocab, t steps so far.

Both searches run many sentences at once, each with its own beams, and feed the decoder only
the newest token per step (`offset` = tokens already decoded), so a step costs one token of
work per row. Sentences that are done are pruned from the batch (their rows are dropped from
the caches, the encoder memory and the mask), so they stop costing work; the search ends as
soon as every sentence is done.

Conventions (fairseq's `SequenceGenerator`, simplified):
- A hypothesis's `log_prob` is the sum of its tokens' log-probabilities including EOS; its
  `score` is `log_prob / length_penalty_divisor(len)`, with `len` the number of generated tokens
  including EOS. `lp_type="fairseq"` (the default) uses `len ** alpha`; `"gnmt"` uses
  `((5 + len) / 6) ** alpha` (Wu et al. 2016, eq. 14). `alpha = 0` is the raw log-probability.
- Maximum output length per sentence: `int(max_len_a * src_len + max_len_b)` tokens before
  EOS, `src_len` counting that sentence's real source tokens (no pad, no EOS). A hypothesis
  that reaches it gets EOS forced as its next token (fairseq does the same), so every
  hypothesis ends in EOS and its score includes log p(EOS).
- Beam search takes the top `2 * K` candidates per sentence, so the beam stays full when up to
  half are EOS. EOS candidates ranked within the top K are finished; the top K non-EOS
  candidates go on. A sentence is done once it has K finished hypotheses (fairseq's rule: no
  check whether a live hypothesis could still beat them) or reaches its maximum length.
- Minimum length 1: EOS is never the first generated token (fairseq's default `min_len=1`,
  CTranslate2's `min_decoding_length=1`), so an empty translation is never a hypothesis. Only
  a length budget of 0 (e.g. `max_len_a=0, max_len_b=0`) still forces EOS at once.
- Pad and BOS (the decoder's start token) are never generated; EOS stays possible where it is
  also the start token (NLLB).
- A target prefix (per sentence, optional) is forced: while a hypothesis is shorter than its
  sentence's prefix, its next token is the prefix's, with the model's log-probability for it,
  so scores cover the whole output, prefix included. Its first `given` tokens (an NLLB
  model's target language token) score 0 instead, as Transformers' forced BOS does. The output budget is at least the
  prefix's length. Beam search keeps one live hypothesis per sentence until its prefix ends.
- Sampling (`sample_search`) draws each next token from the model's distribution shaped by
  `temperature`, `topk` and `topp` (`sample_tokens`), `nbest` samples per sentence, with the
  same length rules; a sample's `log_prob` is under the model's own distribution (temperature
  1, no truncation), the one `--score` computes, so samples can be reranked with beam outputs.
- Lexical constraints (terms each output must use; `decoding.constraints`) take their own
  path through beam search (`_constrained_candidates`: dynamic beam allocation); without them
  the search runs exactly as before. Greedy search with constraints is that beam search.
  Only hypotheses that use every term may end, so K finished ones come slowly: a constrained
  sentence is also done once no live hypothesis can score above its `nbest`-th finished one
  (`_cannot_improve`), which returns exactly the n-best list of running on to K.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from attnmt.decoding import constraints as lexical
from attnmt.decoding.config import LP_TYPES, LengthPenaltyType, SearchConfig
from attnmt.model.attention import padding_mask

logger = logging.getLogger(__name__)

# The beam greedy search runs for sentences with terms. One width for every sentence, so a
# translation does not depend on the others in its batch; 8 rather than one hypothesis per bank
# (2-8 here): greedy with the usual glossary kept its BLEU (25.29 against 24.34 without) where
# per-sentence widths lost it (24.01) (docs/benchmarks.md#terminology-glossaries).
GREEDY_CONSTRAINED_BEAM = 8


class SpecialTokens(Protocol):
    """The special ids search needs (`data.tokenizer.SpecialIds` satisfies it)."""

    pad: int
    bos: int
    eos: int


class Seq2SeqModel(Protocol):
    """What search needs from a model (`model.Transformer` satisfies it).

    `decode` gets one row of `memory` and `src_mask` per live sentence (B) and one row of
    `tgt_ids` per live hypothesis: N = B * K, the K hypotheses of a sentence in consecutive
    rows. `new_caches` returns caches with the methods of `model.KVCache`: search
    keeps them in step with its rows through `reorder(rows, sentences)` (sentences pruned or
    the beam widened) and `reorder_beams(rows)` (beams re-ranked within their sentences).
    """

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor: ...

    def decode(
        self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor, caches: list, offset: int = 0
    ) -> Tensor: ...

    def new_caches(self) -> list: ...


class ContinuousGreedy(Protocol):
    """A model that runs greedy search itself with continuous batching (`engine.Engine`):
    `Translator` hands it the sentences when `continuous_batching` is true."""

    continuous_batching: bool

    def greedy_search_continuous(
        self,
        src_ids: list[list[int]],
        special: SpecialTokens,
        cfg: SearchConfig,
        progress: Callable[[int], object] | None = None,
        stop: Stop | None = None,
    ) -> list[list[Hypothesis]]: ...


class Hypothesis(NamedTuple):
    """One finished translation of one sentence."""

    tokens: list[int]  # target ids, without bos/eos
    score: float  # log_prob / length penalty: what the n-best list is sorted by
    log_prob: float  # sum of token log-probabilities, EOS included


class Cancelled(Exception):
    """A search stopped between two steps because its `stop()` said so (its callers gone)."""


# stop(): checked before each decoding step; True ends the search with `Cancelled`
Stop = Callable[[], bool]


def check_stop(stop: Stop | None) -> None:
    """Raise `Cancelled` if `stop` is given and says so (the searches call it between steps)."""
    if stop is not None and stop():
        raise Cancelled("the search was cancelled between two steps")


@dataclass
class SearchResult:
    """Per input sentence (in input order), its n-best hypotheses, best first."""

    hypotheses: list[list[Hypothesis]]

    def best_tokens(self) -> list[list[int]]:
        """The best hypothesis's tokens for each sentence."""
        return [nbest[0].tokens for nbest in self.hypotheses]


def length_penalty_divisor(
    length: Any, alpha: float, lp_type: LengthPenaltyType = "fairseq"
) -> Any:
    """Divisor of a hypothesis's log-probability; `length` counts tokens including EOS (an int,
    or a float tensor of lengths)."""
    if lp_type == "fairseq":
        return length**alpha  # fairseq: score / len ** lenpen
    if lp_type == "gnmt":
        return ((5 + length) / 6) ** alpha  # GNMT length penalty: ((5 + len) / 6) ** alpha
    raise ValueError(f"lp_type must be one of {', '.join(LP_TYPES)}, got {lp_type!r}")


def max_lengths(
    src_ids: Tensor, special: SpecialTokens, max_len_a: float, max_len_b: int
) -> Tensor:
    """Per-sentence output budget `int(a * src_len + b)` (tokens before EOS).

    Shape: src_ids (B, S) -> (B,) long.
    """
    src_len = (src_ids.ne(special.pad) & src_ids.ne(special.eos)).sum(dim=1)  # (B,)
    return (src_len.double() * max_len_a + max_len_b).floor().long()  # (B,)


# ---------------------------------------------------------------------------- shared steps


class _Batch(NamedTuple):
    """The decoder inputs of the live sentences: one row per sentence (its hypotheses, the
    rows of the caches, share it)."""

    memory: Tensor  # (B, S, D)
    src_mask: Tensor  # (B, S) bool, True = real token
    max_len: Tensor  # (B,) output budget of each sentence
    caches: list
    prefix: Tensor | None  # (B, P) forced target tokens, -1 past each sentence's prefix
    given: int = 0  # the prefix's first tokens that score 0 (a language token, not predicted)
    constraints: lexical.ConstraintSet | None = None  # terms to use (`decoding.constraints`)


def _start(
    model: Seq2SeqModel,
    src_ids: Tensor,
    special: SpecialTokens,
    cfg: SearchConfig,
    prefix: Tensor | None = None,
    copies: int = 1,
    given: int = 0,
    constraints: lexical.ConstraintSet | None = None,
) -> _Batch:
    """Encode once; one row per sentence, or `copies` consecutive rows per sentence (samples
    drawn independently), which then get pruned one by one like sentences."""
    src_mask = padding_mask(src_ids, special.pad)  # (B, S)
    memory = model.encode(src_ids, src_mask)  # (B, S, D)
    max_len = max_lengths(src_ids, special, cfg.max_len_a, cfg.max_len_b)  # (B,)
    if prefix is not None:  # the budget holds at least the prefix
        max_len = torch.maximum(max_len, prefix.ge(0).sum(dim=1))
    if constraints is not None:  # and every term, each in its longest variant
        max_len = torch.maximum(max_len, constraints.sizes.sum(dim=1))
    if copies > 1:  # (B * copies, ...): the encoder still ran once per sentence
        memory, src_mask, max_len = (
            x.repeat_interleave(copies, dim=0) for x in (memory, src_mask, max_len)
        )
        prefix = None if prefix is None else prefix.repeat_interleave(copies, dim=0)
    return _Batch(memory, src_mask, max_len, model.new_caches(), prefix, given, constraints)


def prefix_tensor(prefixes: list[list[int]], device: torch.device | str = "cpu") -> Tensor | None:
    """(B, P) long: each sentence's forced target ids, right-padded with -1 (None if all are
    empty)."""
    width = max((len(p) for p in prefixes), default=0)
    if width == 0:
        return None
    rows = [p + [-1] * (width - len(p)) for p in prefixes]
    return torch.tensor(rows, dtype=torch.long, device=device)


def _per_row(x: Tensor, n_rows: int) -> Tensor:
    """One row per hypothesis from one row per sentence (K consecutive rows each)."""
    return x if x.size(0) == n_rows else x.repeat_interleave(n_rows // x.size(0), dim=0)


def _next_tokens(
    model: Seq2SeqModel,
    batch: _Batch,
    last: Tensor,
    step: int,
    special: SpecialTokens,
    pick: Callable[[Tensor, bool, Tensor], tuple[Tensor, Tensor]],
) -> tuple[Tensor, Tensor]:
    """The next tokens of each row and their log-probabilities, chosen by `pick(logits,
    no_eos, at_limit)`: `last` (N,) is the token at position `step`, so EOS may not come at
    step 0, and a row whose sentence holds its budget of tokens may only end. Rows still
    inside their prefix get the prefix's token (`_force_prefix`).

    Shape: last (N,) -> log-probs (N, n) float32, token ids (N, n).
    """
    logits = model.decode(last.unsqueeze(1), batch.memory, batch.src_mask, batch.caches, step)
    logits = logits[:, -1]  # (N, V)
    at_limit = _per_row(batch.max_len.le(step), last.size(0))  # (N,)
    lprobs, tokens = pick(logits, step == 0, at_limit)
    if batch.prefix is None or step >= batch.prefix.size(1):
        return lprobs, tokens
    forced = _per_row(batch.prefix[:, step], last.size(0))  # (N,) -1 = free
    return _force_prefix(logits, lprobs, tokens, forced, given=step < batch.given)


def _force_prefix(
    logits: Tensor, lprobs: Tensor, tokens: Tensor, forced: Tensor, given: bool = False
) -> tuple[Tensor, Tensor]:
    """Rows with `forced` >= 0 get that token as their only candidate, with its model
    log-probability (0 when `given`, as Transformers' forced BOS); the other candidates of
    those rows become -inf.

    Shape: logits (N, V), lprobs/tokens (N, n), forced (N,) -> (N, n), (N, n).
    """
    is_forced = forced.ge(0).unsqueeze(1)  # (N, 1)
    token = forced.clamp(min=0).unsqueeze(1)  # (N, 1)
    lprob = torch.log_softmax(logits.float(), dim=-1).gather(1, token)  # (N, 1)
    if given:
        lprob = torch.zeros_like(lprob)
    first = torch.arange(lprobs.size(1), device=lprobs.device).eq(0)  # (n,)
    forced_lprobs = lprob.masked_fill(~first, float("-inf"))  # (N, n)
    return (
        torch.where(is_forced, forced_lprobs, lprobs),
        torch.where(is_forced, token.expand_as(tokens), tokens),
    )


def never_generated(special: SpecialTokens) -> list[int]:
    """Pad and the decoder's start token (BOS; OPUS-MT starts from pad), unless the start
    token is EOS (NLLB), which ends every output."""
    return sorted({special.pad, special.bos} - {special.eos})


def pick_tokens(
    logits: Tensor, special: SpecialTokens, n: int, no_eos: bool | Tensor, at_limit: Tensor | None
) -> tuple[Tensor, Tensor]:
    """The `n` most probable tokens of each row of `logits` and their log-probabilities.

    Pad and BOS are never proposed, nor EOS where `no_eos` holds (True for every row, or (N,)
    bool per row: minimum length 1, fairseq's min_len=1). A row where `at_limit` (N,) bool
    holds (None: no row) has its budget of tokens and gets EOS as its only finite candidate
    (fairseq forces EOS at max_len), also where `no_eos` holds (a budget of 0).

    Shape: logits (N, V) -> log-probs (N, n') float32, token ids (N, n'), n' = min(n, V).
    """
    # float32 (bf16 is too coarse); one fused pass, since logsumexp's separate sub + exp_ + amax
    # passes over (N, V) were a visible share of a beam-5 search profile
    lprobs, eos_lprob = _log_probs(logits, special, no_eos)  # (N, V), (N, 1)
    lprobs, tokens = topk(lprobs, min(n, lprobs.size(-1)))  # (N, n)
    return _eos_at_limit(lprobs, tokens, eos_lprob, at_limit, special.eos)


def _log_probs(
    logits: Tensor, special: SpecialTokens, no_eos: bool | Tensor
) -> tuple[Tensor, Tensor]:
    """`pick_tokens`' log-probabilities: pad, BOS and (where `no_eos`) EOS at -inf; and EOS's
    own log-probability, for rows at their limit.

    Shape: logits (N, V) -> (N, V) float32, (N, 1) float32.
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    eos_lprob = lprobs[:, special.eos : special.eos + 1].clone()  # (N, 1)
    lprobs[:, never_generated(special)] = float("-inf")
    if isinstance(no_eos, Tensor):
        lprobs[:, special.eos] = eos_lprob.squeeze(1).masked_fill(no_eos, float("-inf"))
    elif no_eos:
        lprobs[:, special.eos] = float("-inf")
    return lprobs, eos_lprob


def _eos_at_limit(
    lprobs: Tensor, tokens: Tensor, eos_lprob: Tensor, at_limit: Tensor | None, eos: int
) -> tuple[Tensor, Tensor]:
    """Rows `at_limit` (N,) get EOS as their only finite candidate.

    Shape: lprobs, tokens (N, n), eos_lprob (N, 1) -> (N, n), (N, n).
    """
    if at_limit is None:
        return lprobs, tokens
    at_limit = at_limit.unsqueeze(1)  # (N, 1): EOS first, then -inf
    first = torch.arange(lprobs.size(1), device=lprobs.device).eq(0)  # (n,)
    forced = eos_lprob.masked_fill(~first, float("-inf"))  # (N, n)
    return torch.where(at_limit, forced, lprobs), tokens.masked_fill(at_limit, eos)


def sample_tokens(
    logits: Tensor,
    special: SpecialTokens,
    cfg: SearchConfig,
    no_eos: bool,
    at_limit: Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """One token per row drawn from softmax(logits / temperature), restricted to the `topk`
    most probable tokens (0: all), then to the smallest set of those whose probability reaches
    `topp` (the most probable token always stays), renormalised. Pad, BOS and (where `no_eos`)
    EOS are never drawn; a row `at_limit` gets EOS, as in `pick_tokens`.

    Returns the token's log-probability under the model's own distribution (log_softmax of
    `logits`: no temperature, no truncation) and the token.

    Shape: logits (N, V), at_limit (N,) bool -> log-probs (N, 1) float32, token ids (N, 1).
    """
    logits = logits.float()
    lprobs = torch.log_softmax(logits, dim=-1)  # (N, V) what the sample is scored by
    weights = temperature_scaled(logits, cfg.temperature)  # (N, V)
    banned = never_generated(special) + ([special.eos] if no_eos else [])
    weights[:, banned] = float("-inf")
    if 0 < cfg.topk < weights.size(-1):
        kth = weights.topk(cfg.topk, dim=-1).values[:, -1:]  # (N, 1)
        weights = weights.masked_fill(weights < kth, float("-inf"))
    if cfg.topp < 1:
        probs, order = torch.softmax(weights, dim=-1).sort(dim=-1, descending=True)  # (N, V)
        before = probs.cumsum(dim=-1) - probs  # mass of the more probable tokens
        drop = before.ge(cfg.topp)  # the set already reached topp without this token
        drop[:, 0] = False  # the most probable stays, even for a topp float32 rounds to 0
        weights = weights.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    if at_limit is not None:
        only_eos = torch.full_like(weights, float("-inf"))
        only_eos[:, special.eos] = 0.0
        weights = torch.where(at_limit.unsqueeze(1), only_eos, weights)
    token = torch.multinomial(torch.softmax(weights, dim=-1), 1, generator=generator)  # (N, 1)
    return lprobs.gather(1, token), token


# The factor logits are scaled by (1 / temperature) is kept in float32's finite normal range:
# a temperature below 1 / MAX_SCALE samples as it does (the most probable token), one above
# MAX_SCALE samples as it does (uniformly); any temperature SearchConfig accepts gives no NaN.
MAX_SCALE = 1e30


def temperature_scaled(logits: Tensor, temperature: float) -> Tensor:
    """float32 `logits / temperature`, shifted so that each row's maximum is 0: finite rows
    stay finite or -inf (never NaN) for every temperature > 0, the softmax is unchanged."""
    scale = min(max(1.0 / temperature, 1.0 / MAX_SCALE), MAX_SCALE)
    return (logits - logits.max(dim=-1, keepdim=True).values) * scale


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`torch.topk(x, k, dim=-1)` of (N, V) rows (sorted, largest first), faster on the CPU.

    torch's CPU `topk` (like `max` with indices) does not vectorise: on (320, 8000) float32 it
    took ~2.7 ms where `amax` took ~0.1 ms (2 threads here). So: split each row into C chunks
    of L, take the chunk maxima (`amax`), keep the k chunks with the largest maxima and run
    `topk` on their k * L values. Exact: with
    tau the k-th largest chunk maximum, every value outside the kept chunks is <= tau, while
    the kept chunks hold k values >= tau. Tied values may come back in another order or with
    other indices than torch's (whose order among ties is unspecified too).
    """
    N, V = x.shape
    L = _chunk_length(V)
    if x.device.type != "cpu" or L == 0 or k * L * 4 > V:  # nothing to gain
        return x.topk(k, dim=-1)
    C = V // L
    chunk_max = x.view(N, C, L).amax(dim=-1)  # (N, C)
    chunks = chunk_max.topk(k, dim=-1).indices  # (N, k) chunk ids
    cols = (chunks.unsqueeze(-1) * L + torch.arange(L, device=x.device)).view(N, k * L)
    values, picked = x.gather(1, cols).topk(k, dim=-1)  # (N, k) among the k * L candidates
    return values, cols.gather(1, picked)


def _chunk_length(vocab: int) -> int:
    """Chunk length of `topk`: 64 where it divides `vocab`, else 32, 128, 96, 48, 16 (0 if
    none does). `amax` vectorises over multiples of 16, and 64 was the fastest length on greedy
    and beam-5 rows over an 8,000-token vocabulary, where this `topk` beat torch's (the searches
    it serves: docs/benchmarks.md, "Decoding speed, per CPU kind")."""
    return next((L for L in (64, 32, 128, 96, 48, 16) if vocab % L == 0), 0)


def _select_rows(batch: _Batch, rows: Tensor, sentences: Tensor) -> _Batch:
    """Keep hypothesis rows `rows` (N',) and sentences `sentences` (B',): prune finished
    sentences, cross-attention caches included."""
    for cache in batch.caches:
        cache.reorder(rows, sentences)
    return _Batch(
        batch.memory.index_select(0, sentences),
        batch.src_mask.index_select(0, sentences),
        batch.max_len.index_select(0, sentences),
        batch.caches,
        None if batch.prefix is None else batch.prefix.index_select(0, sentences),
        batch.given,
        None if batch.constraints is None else batch.constraints.select(sentences),
    )


def _reorder_beams(caches: list, rows: Tensor) -> None:
    """Re-rank (or widen) beams inside their sentences: row i takes the history of `rows[i]`.

    Only self-attention K/V move: the cross-attention K/V (and memory, mask) are per sentence,
    shared by its beams.
    """
    for cache in caches:
        cache.reorder_beams(rows)


# ----------------------------------------------------------------- greedy search, sampling


@torch.inference_mode()
def greedy_search(
    model: Seq2SeqModel,
    src_ids: Tensor,
    special: SpecialTokens,
    cfg: SearchConfig,
    prefix: Tensor | None = None,
    given: int = 0,
    constraints: lexical.ConstraintSet | None = None,
    stop: Stop | None = None,
) -> SearchResult:
    """Pick the most probable token at every step (equals `beam_search` with beam 1).

    With `constraints`, a greedy choice cannot place a term well (with one hypothesis, dynamic
    beam allocation would start every term at once), so the search is the constrained beam
    search with a beam of `GREEDY_CONSTRAINED_BEAM` (room for the best hypothesis with each
    count of constraint tokens met, Post & Vilar's smallest beam, for most sentences), one
    output.

    Args:
        model: an encoder-decoder with `encode`, `decode(..., caches, offset)`, `new_caches`.
        src_ids: source ids, each row ending in EOS, right-padded with pad.
        special: pad/bos/eos ids.
        cfg: `max_len_a`, `max_len_b` (output budget per sentence), and `length_penalty`,
            `lp_type` (the reported `score`; greedy choices ignore them). `beam_size` and
            `nbest` are not used: greedy keeps one hypothesis.
        prefix: forced target ids per sentence (`prefix_tensor`), or None.
        given: how many of the prefix's first tokens are given, not predicted: they score
            0 (an NLLB model's target language token).
        constraints: terms each translation must use (`decoding.constraints`), or None.
        stop: checked before each step (`check_stop`: `Cancelled` when it says so), or None.

    Shape:
        src_ids: (B, S). The result holds one hypothesis per sentence, in input order.
    """
    if constraints is not None:
        cfg = replace(cfg, beam_size=GREEDY_CONSTRAINED_BEAM, nbest=1)
        return beam_search(model, src_ids, special, cfg, prefix, given, constraints, stop)

    def best(logits: Tensor, no_eos: bool, at_limit: Tensor) -> tuple[Tensor, Tensor]:
        return pick_tokens(logits, special, 1, no_eos, at_limit)

    what = "greedy search"
    return _one_per_row(model, src_ids, special, cfg, prefix, best, what, given=given, stop=stop)


@torch.inference_mode()
def sample_search(
    model: Seq2SeqModel,
    src_ids: Tensor,
    special: SpecialTokens,
    cfg: SearchConfig,
    prefix: Tensor | None = None,
    generator: torch.Generator | None = None,
    given: int = 0,
    stop: Stop | None = None,
) -> SearchResult:
    """`cfg.nbest` samples per sentence, each token drawn by `sample_tokens` (`topk`, `topp`,
    `temperature`) with `generator`; each sentence's samples come back best score first. `stop`:
    as `greedy_search`'s.

    Shape:
        src_ids: (B, S). The result holds `nbest` hypotheses per sentence, in input order.
    """
    n = cfg.nbest  # n rows per sentence, each sampled on its own

    def draw(logits: Tensor, no_eos: bool, at_limit: Tensor) -> tuple[Tensor, Tensor]:
        return sample_tokens(logits, special, cfg, no_eos, at_limit, generator)

    rows = _one_per_row(model, src_ids, special, cfg, prefix, draw, "sampling", n, given, stop)
    rows = rows.hypotheses
    per_sentence = [[hyp for row in rows[i : i + n] for hyp in row] for i in range(0, len(rows), n)]
    return SearchResult([best_hypotheses(hyps, n) for hyps in per_sentence])


def _one_per_row(
    model: Seq2SeqModel,
    src_ids: Tensor,
    special: SpecialTokens,
    cfg: SearchConfig,
    prefix: Tensor | None,
    pick: Callable[[Tensor, bool, Tensor], tuple[Tensor, Tensor]],
    what: str,
    copies: int = 1,
    given: int = 0,
    stop: Stop | None = None,
) -> SearchResult:
    """`copies` hypotheses per source row (rows of the result: B * copies), each extended by
    `pick`'s token until EOS (greedy search picks the best token, sampling draws one);
    `check_stop(stop)` before each step."""
    batch = _start(model, src_ids, special, cfg, prefix, copies, given)
    B, device = src_ids.size(0) * copies, src_ids.device
    sent_ids = torch.arange(B)  # (N,) on the CPU: input index of each live row
    tokens = torch.full((B, 1), special.bos, dtype=torch.long, device=device)  # (N, t + 1)
    sums = torch.zeros(B, 1, device=device)  # (N, 1) log-probability so far
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    step = 0
    while sent_ids.numel() > 0:
        check_stop(stop)
        lprob, token = _next_tokens(model, batch, tokens[:, -1], step, special, pick)  # (N, 1)
        sums = sums + lprob
        tokens = torch.cat([tokens, token], dim=1)  # (N, t + 2)
        step += 1
        done = token.squeeze(1).eq(special.eos).cpu()  # (N,) EOS is forced at max_len
        if not done.any():
            continue
        penalty = length_penalty_divisor(step, cfg.length_penalty, cfg.lp_type)
        finished_rows = done.nonzero().squeeze(1).to(device)  # (F,)
        prefixes = tokens.index_select(0, finished_rows)[:, 1:-1].tolist()  # no bos, no eos
        totals = sums.index_select(0, finished_rows).squeeze(1).tolist()
        for sent, prefix, total in zip(sent_ids[done].tolist(), prefixes, totals, strict=True):
            results[sent].append(Hypothesis(prefix, total / penalty, total))
        keep_cpu = (~done).nonzero().squeeze(1)  # (N',)
        sent_ids = sent_ids[keep_cpu]
        if keep_cpu.numel() > 0:  # prune: finished sentences stop costing work
            keep = keep_cpu.to(device)
            batch = _select_rows(batch, keep, keep)
            tokens, sums = tokens.index_select(0, keep), sums.index_select(0, keep)
    logger.debug("%s: %d rows, %d steps", what, B, step)
    return SearchResult(results)


# ------------------------------------------------------------------------------ beam search


@dataclass
class _Beams:
    """Bookkeeping of the live sentences' beams (k = current beam width: 1 at the start)."""

    sent_ids: Tensor  # (B,) on the CPU: input index of each live sentence
    scores: Tensor  # (B, k) log-probability of each live hypothesis
    tokens: Tensor  # (B * k, t + 1) bos + generated tokens
    n_finished: Tensor  # (B,) finished hypotheses per sentence
    max_len: Tensor  # (B,) output budget per sentence
    state: Tensor | None = None  # (B * k, W) constraint state per hypothesis, or None
    # constraints: the `nbest` best scores of finished hypotheses that use every term, per
    # sentence, best first (-inf where fewer have finished); None without constraints
    kept: Tensor | None = None  # (B, nbest), float64 once set, as `Hypothesis.score`


class Candidates(NamedTuple):
    """The best `C = 2K` (beam, token) extensions of each sentence, best first."""

    scores: Tensor  # (B, C) log-probability after the extension
    beams: Tensor  # (B, C) which of the k beams it extends
    tokens: Tensor  # (B, C) the new token
    state: Tensor | None = None  # (B, C, W) the constraint state after it, or None


@torch.inference_mode()
def beam_search(
    model: Seq2SeqModel,
    src_ids: Tensor,
    special: SpecialTokens,
    cfg: SearchConfig,
    prefix: Tensor | None = None,
    given: int = 0,
    constraints: lexical.ConstraintSet | None = None,
    stop: Stop | None = None,
) -> SearchResult:
    """Batched beam search with fairseq's 2K-candidate EOS handling (see the module docstring).

    Args:
        model: an encoder-decoder with `encode`, `decode(..., caches, offset)`, `new_caches`.
        src_ids: source ids, each row ending in EOS, right-padded with pad.
        special: pad/bos/eos ids.
        cfg: `beam_size` (K hypotheses kept per sentence), `length_penalty` and `lp_type`
            (alpha and formula of the score), `max_len_a`, `max_len_b` (output budget
            `int(a * src_len + b)` per sentence), `nbest` (hypotheses returned per sentence,
            best first).
        prefix: forced target ids per sentence (`prefix_tensor`), or None. While a sentence
            is inside its prefix, only one of its hypotheses is live (the others score -inf).
        given: the prefix's first tokens that score 0 (see `greedy_search`).
        constraints: terms each translation must use, or None: the candidates and their
            order come from dynamic beam allocation (`decoding.constraints`), EOS only once
            every term is met.
        stop: checked before each step (`check_stop`), or None.

    Shape:
        src_ids: (B, S). The result holds `nbest` hypotheses per sentence, in input order.
    """
    beam_size = cfg.beam_size
    batch = _start(model, src_ids, special, cfg, prefix, given=given, constraints=constraints)
    B, device = src_ids.size(0), src_ids.device
    beams = _Beams(
        sent_ids=torch.arange(B),
        scores=torch.zeros(B, 1, device=device),  # one beam per sentence before the first step
        tokens=torch.full((B, 1), special.bos, dtype=torch.long, device=device),
        n_finished=torch.zeros(B, dtype=torch.long, device=device),
        max_len=batch.max_len,
        state=None if constraints is None else lexical.initial_state(constraints),
        kept=None if constraints is None else torch.full((B, cfg.nbest), -math.inf, device=device),
    )
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    missed: list[list[Hypothesis]] = [[] for _ in range(B)]  # constraints: a term missing

    def pick(logits: Tensor, no_eos: bool, at_limit: Tensor) -> tuple[Tensor, Tensor]:
        return pick_tokens(logits, special, 2 * beam_size, no_eos, at_limit)

    step = 0
    while beams.sent_ids.numel() > 0:
        check_stop(stop)
        if batch.constraints is None:
            lprobs, tokens = _next_tokens(model, batch, beams.tokens[:, -1], step, special, pick)
            cands = top_candidates(lprobs, tokens, beams.scores, beam_size)
        else:
            cands = _constrained_candidates(model, batch, beams, step, special, beam_size)
        step += 1
        accept = accept_eos(cands, beams.n_finished, beam_size, special.eos)  # (B, K)
        beams.n_finished += accept.sum(dim=1)
        done = beams.n_finished.ge(beam_size) | beams.max_len.lt(step)  # (B,)
        if batch.constraints is not None:
            done |= _cannot_improve(batch.constraints, beams, cands, accept, step, cfg, special.eos)
        flags = torch.cat([accept, done.unsqueeze(1)], dim=1).cpu()  # (B, K + 1): one sync
        if flags[:, :-1].any():
            penalty = length_penalty_divisor(step, cfg.length_penalty, cfg.lp_type)
            _finalize(finished, beams, cands, flags[:, :-1], penalty, batch.constraints, missed)
        batch, beams = _advance(batch, beams, cands, flags[:, -1], beam_size, special.eos)
    logger.debug("beam search: %d sentences, beam %d, %d steps", B, beam_size, step)
    if constraints is not None:  # outputs that miss a term (ended by the budget) come last
        pairs = zip(finished, missed, strict=True)
        return SearchResult([best_hypotheses(hyps, cfg.nbest, miss) for hyps, miss in pairs])
    return SearchResult([best_hypotheses(hyps, cfg.nbest) for hyps in finished])


def top_candidates(lprobs: Tensor, tokens: Tensor, scores: Tensor, beam_size: int) -> Candidates:
    """The best 2K extensions per sentence over all its beams.

    The global top 2K of `score + log p(token)` over k beams x V tokens are among each beam's
    own top 2K tokens, so `lprobs`/`tokens` only hold those.

    Shape: lprobs, tokens (B * k, n); scores (B, k) -> each field (B, C), C = min(2K, k * n).
    """
    B, k = scores.shape
    n = lprobs.size(-1)
    total = (scores.unsqueeze(-1) + lprobs.view(B, k, n)).view(B, k * n)  # (B, k * n)
    # fairseq: 2K candidates "in case half are EOS", so K non-EOS ones always remain
    top_scores, flat = total.topk(min(2 * beam_size, k * n), dim=1)  # (B, C)
    return Candidates(top_scores, flat // n, tokens.view(B, k * n).gather(1, flat))


def _constrained_candidates(
    model: Seq2SeqModel,
    batch: _Batch,
    beams: _Beams,
    step: int,
    special: SpecialTokens,
    beam_size: int,
) -> Candidates:
    """`top_candidates` under constraints (`decoding.constraints`): each row proposes its top
    2K tokens plus the next token of each unmet term variant; EOS and the sentence's last final
    mark wait until every term is met; no row writes a term's avoided (usual) translation; the
    2K candidates kept are in dynamic beam allocation's order, with their new state."""
    assert batch.constraints is not None and beams.state is not None
    B, k = beams.scores.shape
    cons = batch.constraints.rows(B * k)
    last = beams.tokens[:, -1]  # (N,)

    def pick(logits: Tensor, no_eos: bool, at_limit: Tensor) -> tuple[Tensor, Tensor]:
        no_eos_rows = lexical.unmet(cons, beams.state) | no_eos  # (N,)
        lprobs, eos_lprob = _log_probs(logits, special, no_eos_rows)  # (N, V)
        lprobs = lexical.mask_glued(cons, beams.state, lprobs)
        lprobs = lexical.mask_final(cons, beams.state, lprobs)
        lprobs = lexical.mask_usual(cons, beams.tokens, lprobs)
        top, tokens = topk(lprobs, min(2 * beam_size, lprobs.size(-1)))  # (N, n)
        extra, extra_tokens = lexical.extra_candidates(cons, beams.state, lprobs, tokens, last)
        top, tokens = torch.cat([top, extra], dim=1), torch.cat([tokens, extra_tokens], dim=1)
        return _eos_at_limit(top, tokens, eos_lprob, at_limit, special.eos)

    lprobs, tokens = _next_tokens(model, batch, last, step, special, pick)  # (N, c)
    state, bank = lexical.advance(cons, beams.state, tokens, last)  # (N, c, W), (N, c)
    c = tokens.size(1)
    total = (beams.scores.unsqueeze(-1) + lprobs.view(B, k, c)).view(B, k * c)  # (B, k * c)
    order = lexical.allocate(total, bank.view(B, k * c), 2 * beam_size, cons.n_banks)  # (B, C)
    state = state.view(B, k * c, -1)
    picked_state = state.gather(1, order.unsqueeze(2).expand(-1, -1, state.size(2)))
    flat_tokens = tokens.view(B, k * c).gather(1, order)
    return Candidates(total.gather(1, order), order // c, flat_tokens, picked_state)


def _cannot_improve(
    cons: lexical.ConstraintSet,
    beams: _Beams,
    cands: Candidates,
    accept: Tensor,
    step: int,
    cfg: SearchConfig,
    eos: int,
) -> Tensor:
    """(B,) bool: sentences whose `nbest` best finished hypotheses (all terms used) are final.

    Updates `beams.kept` with this step's accepted hypotheses that use every term. A live
    hypothesis's log-probability only falls as it grows, and it ends with at most
    `max_len + 1` tokens (EOS included), so its final score is at most
    `log_prob / max(divisor(step + 1), divisor(max_len + 1))` (the divisor is monotone in the
    length). Where that bound of every non-EOS candidate (the live hypotheses are among them)
    is below the `nbest`-th kept score, no later hypothesis can enter the n-best list: stopping
    returns exactly what the search would return had it run on to `beam_size` finished ones.

    Shape: accept (B, K) bool -> (B,) bool.
    """
    assert beams.kept is not None and cands.state is not None
    B, K = accept.shape
    state = cands.state[:, :K].reshape(B * K, -1)  # (B * K, W)
    met = accept & ~lexical.unmet(cons.rows(B * K), state).view(B, K)  # (B, K)
    penalty = length_penalty_divisor(step, cfg.length_penalty, cfg.lp_type)  # this step's
    new = (cands.scores[:, :K].double() / penalty).masked_fill(~met, float("-inf"))  # (B, K)
    kept = torch.cat([beams.kept.double(), new], dim=1).topk(beams.kept.size(1), dim=1).values
    beams.kept = kept  # (B, nbest)
    shortest = length_penalty_divisor(step + 1, cfg.length_penalty, cfg.lp_type)
    lengths = beams.max_len.double() + 1  # EOS included; tensors broadcast like ints
    divisor = length_penalty_divisor(lengths, cfg.length_penalty, cfg.lp_type)
    divisor = divisor.clamp(min=shortest)  # (B,)
    live = cands.scores.masked_fill(cands.tokens.eq(eos), float("-inf"))  # (B, C)
    best_live = live.max(dim=1).values.double() / divisor  # (B,)
    return best_live.lt(kept[:, -1])


def accept_eos(cands: Candidates, n_finished: Tensor, beam_size: int, eos: int) -> Tensor:
    """(B, K) bool: the EOS candidates ranked in the top K that finish a hypothesis.

    A sentence keeps at most K finished hypotheses (the best ones of the step that fills it).
    """
    top_tokens = cands.tokens[:, :beam_size]  # (B, K)
    top_scores = cands.scores[:, :beam_size]  # (B, K)
    is_eos = top_tokens.eq(eos) & top_scores.isfinite()  # (B, K)
    rank = is_eos.cumsum(dim=1) + n_finished.unsqueeze(1)  # (B, K) 1-based finished count
    return is_eos & rank.le(beam_size)


def _finalize(
    finished: list[list[Hypothesis]],
    beams: _Beams,
    cands: Candidates,
    accept: Tensor,  # (B, K) bool, on the CPU
    penalty: float,
    constraints: lexical.ConstraintSet | None = None,
    missed: list[list[Hypothesis]] | None = None,
) -> None:
    """Store the accepted hypotheses (their tokens before EOS) with their scores; under
    `constraints`, those that miss a term (only the output budget ends them) go to `missed`."""
    sent_cpu, pos_cpu = accept.nonzero(as_tuple=True)  # (F,), (F,)
    sent, pos = sent_cpu.to(beams.scores.device), pos_cpu.to(beams.scores.device)
    rows = sent * beams.scores.size(1) + cands.beams[sent, pos]  # (F,) rows that end here
    prefixes = beams.tokens.index_select(0, rows)[:, 1:].tolist()  # drop bos
    totals = cands.scores[sent, pos].tolist()
    misses = [False] * len(totals)
    if constraints is not None and cands.state is not None and missed is not None:
        state = cands.state[sent, pos]  # (F, W)
        misses = lexical.unmet(constraints.select(sent), state).tolist()
    sentences = beams.sent_ids[sent_cpu].tolist()
    for s, prefix, total, miss in zip(sentences, prefixes, totals, misses, strict=True):
        (missed if miss else finished)[s].append(Hypothesis(prefix, total / penalty, total))


def _advance(
    batch: _Batch, beams: _Beams, cands: Candidates, done: Tensor, beam_size: int, eos: int
) -> tuple[_Batch, _Beams]:
    """Prune done sentences, keep the best K non-EOS candidates of the others, move caches.

    Shape: done (B,) bool on the CPU. The new beams have B' = live sentences x K rows.
    """
    B, k = beams.scores.shape
    keep_cpu = (~done).nonzero().squeeze(1)  # (B',)
    if keep_cpu.numel() == 0:
        empty = beams.n_finished[:0]
        return batch, _Beams(keep_cpu, beams.scores[:0], beams.tokens[:0], empty, empty)
    pruned = keep_cpu.numel() < B
    device = beams.scores.device
    keep = keep_cpu.to(device) if pruned else torch.arange(B, device=device)  # (B',)
    if pruned:
        cands = Candidates(*(f if f is None else f.index_select(0, keep) for f in cands))
    n_cands = cands.tokens.size(1)
    # the first K non-EOS candidates in rank order (fairseq's `active_mask` trick)
    order = cands.tokens.eq(eos).long() * n_cands + torch.arange(n_cands, device=device)
    picked = order.topk(min(beam_size, n_cands), dim=1, largest=False).indices  # (B', K)
    tokens = cands.tokens.gather(1, picked)  # (B', K)
    scores = cands.scores.gather(1, picked).masked_fill(tokens.eq(eos), float("-inf"))
    rows = (keep.unsqueeze(1) * k + cands.beams.gather(1, picked)).view(-1)  # (B' * K,) old rows
    if pruned:  # fewer sentences: their rows, memory and cross-attention caches go
        batch = _select_rows(batch, rows, keep)
    elif k > 1 or picked.size(1) != k:  # beams re-ranked or widened (one beam never moves)
        _reorder_beams(batch.caches, rows)
    new_tokens = torch.cat([beams.tokens.index_select(0, rows), tokens.view(-1, 1)], dim=1)
    n_finished, max_len, kept = beams.n_finished, beams.max_len, beams.kept
    if pruned:
        n_finished, max_len = n_finished.index_select(0, keep), max_len.index_select(0, keep)
        kept = None if kept is None else kept.index_select(0, keep)
    state = None
    if cands.state is not None:  # (B' * K, W): each kept candidate's constraint state
        width = cands.state.size(2)
        state = cands.state.gather(1, picked.unsqueeze(2).expand(-1, -1, width)).view(-1, width)
    sent_ids = beams.sent_ids[keep_cpu]
    return batch, _Beams(sent_ids, scores, new_tokens, n_finished, max_len, state, kept)


def best_hypotheses(
    hyps: list[Hypothesis], nbest: int, after: list[Hypothesis] | None = None
) -> list[Hypothesis]:
    """Best `nbest` by score, then (where too few) the best of `after`; a sentence always gets
    at least one (possibly empty) hypothesis."""
    ranked = sorted(hyps, key=lambda hyp: hyp.score, reverse=True)
    if after:
        ranked += sorted(after, key=lambda hyp: hyp.score, reverse=True)
    if not ranked:  # only with a vocabulary too small to fill the beam
        return [Hypothesis([], float("-inf"), float("-inf"))]
    return ranked[:nbest]
