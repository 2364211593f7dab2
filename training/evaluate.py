"""What validation and the final test compute, as plain functions (`Run.validate` and
`Run.test` call them): the valid loss, translations shared over ranks, BLEU/chrF, `results.json`.

Under DDP every rank translates its share of the sentences and rank 0 scores the whole set, so
validation takes 1/W of the time and no rank idles in a collective while another decodes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnmt.common.files import atomic_write
from attnmt.data.batching import Batch
from attnmt.decoding.config import RunDecoding
from attnmt.decoding.translator import Translator
from attnmt.evaluation import corpus_bleu, corpus_chrf
from attnmt.training import distributed
from attnmt.training.kernels import label_smoothed_cross_entropy

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import datasets

    from attnmt.training.state import Progress

    Autocast = Callable[[], AbstractContextManager]  # a fresh precision context per use

log = logging.getLogger(__name__)


@torch.no_grad()
def valid_loss(
    model: torch.nn.Module,
    batches: Iterable[Batch],
    label_smoothing: float,
    autocast: Autocast,
    ctx: distributed.DistContext,
) -> tuple[float, float]:
    """Per-token label-smoothed loss and NLL over all ranks' validation batches."""
    model.eval()
    loss = torch.zeros((), device=ctx.device, dtype=torch.float64)
    nll = torch.zeros((), device=ctx.device, dtype=torch.float64)
    n_tokens = 0
    for batch in batches:
        batch = batch.to(ctx.device)
        with autocast():
            logits = model(batch.src_ids, batch.tgt_in)
        out = label_smoothed_cross_entropy(logits, batch.tgt_out, batch.pad_id, label_smoothing)
        loss += out.loss
        nll += out.nll
        n_tokens += batch.n_tgt_tokens
    loss_sum, nll_sum, n = distributed.all_reduce_sum([loss.item(), nll.item(), n_tokens], ctx)
    return loss_sum / max(n, 1), nll_sum / max(n, 1)


def translate_shared(
    translator: Translator, sentences: list[str], ctx: distributed.DistContext
) -> list[str]:
    """Translations of `sentences` in order; each rank translates every W-th sentence."""
    mine = translator.translate(sentences[ctx.rank :: ctx.world_size])
    shards = distributed.gather_objects(mine, ctx)
    out = [""] * len(sentences)
    for rank, shard in enumerate(shards):
        out[rank :: ctx.world_size] = shard
    return out


def texts(raw: datasets.Dataset, limit: int = 0) -> tuple[list[str], list[str]]:
    """The source and target sentences of a split (its first `limit` pairs, if given)."""
    columns = raw[:limit] if limit else raw[:]  # one Arrow read (column access is row by row)
    return columns["src"], columns["tgt"]


def scores(hyps: list[str], refs: list[str]) -> dict[str, Any]:
    """Corpus BLEU and chrF of `hyps` against `refs`, with their sacreBLEU signatures."""
    bleu, chrf = corpus_bleu(hyps, refs), corpus_chrf(hyps, refs)
    return {
        "bleu": bleu.score,
        "chrf": chrf.score,
        "signature": bleu.signature,
        "chrf_signature": chrf.signature,
    }


def results_summary(
    state: Progress,
    decoding: RunDecoding,
    model: torch.nn.Module,
    world_size: int,
    dropped: dict[str, int] | None = None,
    tokens_per_update: int = 0,
) -> dict[str, Any]:
    """What `results.json` holds about the run; its "test" scores are filled in per split.
    `dropped`: training pairs the data preparation skipped, by rule; `tokens_per_update`: the
    update's token budget (`training.build.tokens_per_update`); `decoding`: the search,
    precision and device the test scores come from (what translate.py -c RUN decodes with
    when no search flag is given)."""
    return {
        "valid": {k: state.best_valid.get(k, 0.0) for k in ("bleu", "chrf", "loss", "ppl")},
        "test": {},
        "steps": state.step,
        "best_step": state.best_step,
        "epochs": state.epoch,
        "train_seconds": round(state.train_seconds, 1),
        "wall_seconds": round(state.wall_seconds, 1),
        "nonfinite_updates": state.nonfinite_total,
        "rollbacks": state.rollbacks,
        "dropped_pairs": dict(dropped or {}),
        "decoding": decoding.as_dict(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "world_size": world_size,
        "tokens_per_update": tokens_per_update,
    }


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    """Write `results` to `run_dir/results.json` atomically."""
    atomic_write(run_dir / "results.json", json.dumps(results, indent=2) + "\n")
    log.info("wrote %s", run_dir / "results.json")
