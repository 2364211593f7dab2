"""Scores of given translations: one teacher-forced pass, no search (fairseq's
`--score-reference`, `marian-scorer`, CTranslate2's `score_batch`).

Legend: B pairs, S src len, T target len + 1 (EOS), V vocab.

A translation's `log_prob` is the sum of the log-probabilities of its subwords and of EOS,
each under the model's distribution given the source and the subwords before it; its `score`
is `log_prob / length_penalty_divisor(T)` with T the subwords plus EOS. These are the numbers
search reports for a hypothesis (`decoding.search`): scoring search's own output gives its
scores back, up to float rounding between the cached step-by-step pass and this full one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnmt.data.batching import encode_source_batch, pad_rows
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import Seq2SeqModel, SpecialTokens, length_penalty_divisor
from attnmt.model.attention import padding_mask


class TokenScores(NamedTuple):
    """The score of one (source, translation) pair."""

    score: float  # log_prob / length penalty (`length_penalty`, `lp_type`)
    log_prob: float  # sum of `token_log_probs`
    token_log_probs: list[float]  # per target subword, then EOS


@torch.inference_mode()
def score_batch(
    model: Seq2SeqModel,
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    special: SpecialTokens,
    cfg: SearchConfig,
    device: torch.device | str = "cpu",
    given: int = 0,
) -> list[TokenScores]:
    """Teacher-forced scores of `tgt_ids` given `src_ids` (id lists without specials); the
    first `given` target tokens (a language token that search forces) score 0, as in search.

    `model.decode` runs once on [bos] + target (no caches), so the cost is one training
    forward pass without the loss: no step-by-step loop.
    """
    src = encode_source_batch(src_ids, special).to(device)  # (B, S) ids + eos
    src_mask = padding_mask(src, special.pad)  # (B, S)
    memory = model.encode(src, src_mask)  # (B, S, D)
    tgt_in = pad_rows(tgt_ids, special.pad, prefix=[special.bos]).to(device)  # (B, T)
    target = pad_rows(tgt_ids, special.pad, suffix=[special.eos]).to(device)  # (B, T)
    logits = model.decode(tgt_in, memory, src_mask)  # (B, T, V)
    lprobs = token_log_probs(logits, target)  # (B, T)
    lprobs[:, :given] = 0.0
    scores = []
    for row, tokens in zip(lprobs.cpu().tolist(), tgt_ids, strict=True):
        length = len(tokens) + 1  # subwords + EOS, as search counts
        per_token = row[:length]
        total = sum(per_token)
        penalty = length_penalty_divisor(length, cfg.length_penalty, cfg.lp_type)
        scores.append(TokenScores(total / penalty, total, per_token))
    return scores


def token_log_probs(logits: Tensor, target: Tensor) -> Tensor:
    """log p(target[b, t]) from logits (B, T, V) in float32: (B, T)."""
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
