"""What both exports share: the error type, optional imports, probe sentences, our budgets.

`export_hf` and `export_ct2` check the folder they wrote against our model on probe sentences
(`probe_sentences`, `our_search_ids`). `hf_search_ids` and `ct2_search_ids` give every
sentence our output budget, `int(max_len_a * src_len + max_len_b)` tokens, where `generate`
and `translate_batch` take one limit per call: `by_budget` groups sentences by budget, which
reproduces ours exactly.
"""

from __future__ import annotations

import importlib
import math
from collections import defaultdict
from collections.abc import Callable
from types import ModuleType

import torch
from torch import Tensor

from attnmt.common.errors import UserError
from attnmt.data.tokenizer import SpecialIds, Tokenizer
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.translator import Translator
from attnmt.model import Transformer

INSTALL_HINT = "pip install -e '.[export]'"
# Positions the exported models have a table for (ours grows without limit): sentences up to
# this many tokens, EOS included, on either side.
MAX_POSITIONS = 1024


class ExportError(UserError):
    """A model or a request that cannot be exported; one line: problem and fix."""


def require(package: str) -> ModuleType:
    """Import an optional package, or raise a one-line `ExportError` naming the extra."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ExportError(
            f"exporting needs the Python package {package!r}, which is not installed; "
            f"install it with: {INSTALL_HINT}"
        ) from None


def fp32(t: Tensor) -> Tensor:
    """A detached float32 CPU copy (the caller's model stays where and what it is)."""
    return t.detach().to("cpu", torch.float32).clone()


def fp32_model(model: Transformer) -> Transformer:
    """A float32 CPU copy in eval mode (or the model itself when it already is one)."""
    p = next(model.parameters())
    if p.device.type == "cpu" and p.dtype == torch.float32 and not model.training:
        return model
    copy = Transformer(model.cfg)
    copy.load_state_dict({k: fp32(v) for k, v in model.state_dict().items()})
    return copy.eval()


def our_search_ids(
    model: Transformer, tokenizer: Tokenizer, src_ids: list[list[int]], cfg: SearchConfig
) -> list[list[int]]:
    """Our search (as `translate.py` runs it) on source ids: the best target ids each."""
    return [nbest[0].tokens for nbest in Translator(model, tokenizer, cfg).search_ids(src_ids)]


def probe_sentences(tokenizer: Tokenizer, n: int = 8, seed: int = 0) -> list[str]:
    """Deterministic source text made of the vocabulary's own pieces (any language)."""
    gen = torch.Generator().manual_seed(seed)
    specials = set(vars(tokenizer.special).values())  # (an imported model's may come last)
    pieces = torch.tensor([i for i in range(tokenizer.src_vocab_size) if i not in specials])
    ids = [
        pieces[torch.randint(0, len(pieces), (int(k),), generator=gen)].tolist()
        for k in torch.randint(3, 16, (n,), generator=gen)
    ]
    return [text for text in tokenizer.decode_src(ids) if text.strip()] or ["a"]


def budgets(src_ids: list[list[int]], special: SpecialIds, cfg: SearchConfig) -> list[int]:
    """Our output budget of each sentence (`decoding.search.max_lengths`, the same float64
    arithmetic, in Python: no torch op, see `benchmarks.peers.ct2_from_folder`); 0 for an
    empty source, which our search never decodes."""
    not_counted = {special.pad, special.eos}
    return [
        math.floor(sum(i not in not_counted for i in ids) * cfg.max_len_a + cfg.max_len_b)
        if ids
        else 0
        for ids in src_ids
    ]


def by_budget(
    src_ids: list[list[int]],
    special: SpecialIds,
    cfg: SearchConfig,
    batch_size: int,
    search: Callable[[list[list[int]], int], list[list[int]]],
) -> list[list[int]]:
    """Run `search(batch, budget)` on the sentences grouped by our output budget (equal
    budgets share a call); results in input order, [] for an empty source."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (ids, budget) in enumerate(zip(src_ids, budgets(src_ids, special, cfg), strict=True)):
        if ids:
            groups[budget].append(i)
    results: list[list[int]] = [[] for _ in src_ids]
    for budget, members in sorted(groups.items()):
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            for i, ids in zip(chunk, search([src_ids[i] for i in chunk], budget), strict=True):
                results[i] = ids
    return results
