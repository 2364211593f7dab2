"""Ensembles: several models translating together, their log-probabilities averaged per step.

Legend: B batch, N rows (live hypotheses), S src len, T new tokens, V vocab, D_i member i's
d_model.

`Ensemble` satisfies the search protocol (`decoding.search.Seq2SeqModel`: `encode`, `decode`,
`new_caches`), so greedy and beam search run it exactly as they run one model:
- `encode` runs every member's encoder and lays the memories side by side along the feature
  axis, (B, S, D_1 + ... + D_n): search selects rows of it when it prunes finished sentences,
  like any memory, and `decode` splits it again. Members may differ in size and depth.
- `new_caches` returns every member's KV caches in one flat list, so search's cache moves
  (beams re-ranked, sentences pruned) move every member's caches.
- `decode` runs every member one step on its own memory and caches, and returns the mean of
  their float32 logits. Search turns what `decode` returns into log-probabilities with a
  log-softmax, and log_softmax(mean_i z_i) = log_softmax(mean_i log p_i), because
  log p_i = z_i - logsumexp(z_i) differs from z_i by one constant per row. So each step scores
  a token by the members' averaged log-probabilities, renormalised over the vocabulary (the
  normalised geometric mean of the members' distributions; fairseq averages probabilities
  instead). Averaging logits rather than log-probabilities saves n log-softmaxes and makes an
  ensemble of one, or of identical copies, compute exactly the single model's numbers.

Members must share the tokenizer (`engine.load_engine` checks it): the same ids must mean the same
pieces, on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnmt.model.transformer import AttentionMaps


class Ensemble(nn.Module):
    """Models that decode as one: the mean of their logits at every step (see module doc).

    Args:
        members: encoder-decoders with the search API (e.g. `model.Transformer`), on the same
            device, sharing one tokenizer.

    Example:
        >>> ensemble = Ensemble([model_a, model_b])
        >>> beam_search(ensemble, src_ids, tokenizer.special, SearchConfig(beam_size=5))
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        self.members = nn.ModuleList(members)
        self._widths: list[int] = []  # D_i of each member's memory, set by `encode`
        self._n_caches: list[int] = []  # caches per member, set by `new_caches`

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) ids -> the members' memories side by side, (B, S, D_1 + ... + D_n)."""
        memories = [m.encode(src_ids, src_mask) for m in self.members]
        self._widths = [memory.size(-1) for memory in memories]
        return torch.cat(memories, dim=-1)

    def new_caches(self) -> list:
        """Every member's caches, member after member, in one list."""
        per_member = [m.new_caches() for m in self.members]
        self._n_caches = [len(caches) for caches in per_member]
        return [cache for caches in per_member for cache in caches]

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        caches: list | None = None,
        offset: int = 0,
    ) -> Tensor:
        """The mean of the members' float32 logits (N, T, V) for the tokens after `tgt_ids`.

        `memory` comes from `encode`, `caches` from `new_caches` (search keeps both in step
        with its rows); each member decodes with its own slice of both. Without `caches`,
        every member runs the full teacher-forced pass (scoring).
        """
        if sum(self._widths) != memory.size(-1):
            raise RuntimeError("decode needs the memory of `encode`")
        if caches is not None and sum(self._n_caches) != len(caches):
            raise RuntimeError("decode needs the caches of `new_caches`")
        memories = memory.split(self._widths, dim=-1)
        total: Tensor | None = None
        start = 0
        for member, member_memory, n in zip(self.members, memories, self._n_members(), strict=True):
            member_caches = None if caches is None else caches[start : start + n]
            start += n
            logits = member.decode(tgt_ids, member_memory, src_mask, member_caches, offset).float()
            total = logits if total is None else total + logits
        assert total is not None
        return total / len(self.members)

    def _n_members(self) -> list[int]:
        """Caches per member (0 each before `new_caches`: a decode without caches)."""
        return self._n_caches or [0] * len(self.members)

    def attention_maps(self, src_ids: Tensor, tgt_in: Tensor) -> AttentionMaps:
        """The first member's attention weights (members' maps differ in shape; not averaged)."""
        return self.members[0].attention_maps(src_ids, tgt_in)
