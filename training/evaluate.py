"""Validation (loss, BLEU, chrF) and the final test of the best checkpoint (`results.json`).

Under DDP every rank translates its share of the sentences and rank 0 scores the whole set, so
validation takes 1/W of the time and no rank idles in a collective while another decodes.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from common.files import atomic_write
from data.batching import Batch
from decoding.search import SearchConfig
from decoding.translator import Translator
from evaluation import corpus_bleu, corpus_chrf
from model.kernels import label_smoothed_cross_entropy
from training import distributed

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import datasets

    from data.tokenizer import Tokenizer
    from training.logger import TrainLogger
    from training.state import TrainState

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


def _texts(raw: datasets.Dataset, limit: int = 0) -> tuple[list[str], list[str]]:
    columns = raw[:limit] if limit else raw[:]  # one Arrow read (column access is row by row)
    return columns["src"], columns["tgt"]


def validate(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    valid: datasets.Dataset,
    batches: Iterable[Batch],
    search: SearchConfig,
    max_sentences: int,
    label_smoothing: float,
    autocast: Autocast,
    ctx: distributed.DistContext,
    logger: TrainLogger,
    step: int,
) -> dict[str, float]:
    """Loss, perplexity, BLEU and chrF on the validation split (the same values on all ranks);
    rank 0 logs them, sample translations and an attention heatmap."""
    loss, nll = valid_loss(model, batches, label_smoothing, autocast, ctx)
    metrics = {"loss": loss, "ppl": math.exp(min(nll, 50)), "bleu": 0.0, "chrf": 0.0}
    src, ref = _texts(valid, max_sentences)
    translator = Translator(model, tokenizer, search, ctx.device)
    with autocast():
        hyps = translate_shared(translator, src, ctx)
    if ctx.is_main:
        bleu, chrf = corpus_bleu(hyps, ref), corpus_chrf(hyps, ref)
        metrics.update(bleu=bleu.score, chrf=chrf.score)
        log.info(
            "valid step %d | loss %.3f | ppl %.2f | BLEU %.2f | chrF %.2f | %s",
            step,
            loss,
            metrics["ppl"],
            bleu.score,
            chrf.score,
            bleu.signature,
        )
        logger.scalars("valid", metrics, step)
        logger.samples(src, ref, hyps, step)
        if src:
            logger.attention(translator, src[0], step)
    metrics["bleu"], metrics["chrf"] = distributed.broadcast_object(
        (metrics["bleu"], metrics["chrf"]), ctx
    )
    return metrics


def test_and_report(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    test: dict[str, datasets.Dataset],
    search: SearchConfig,
    autocast: Autocast,
    ctx: distributed.DistContext,
    state: TrainState,
    run_dir: Path,
    tgt_lang: str,
) -> dict[str, Any]:
    """Translate every test split with `model` (the best checkpoint's weights); rank 0 writes
    `hyp.<split>.<lang>` and `results.json`. Returns the results on every rank."""
    results: dict[str, Any] = {
        "valid": {k: state.best_valid.get(k, 0.0) for k in ("bleu", "chrf", "loss", "ppl")},
        "test": {},
        "steps": state.step,
        "best_step": state.best_step,
        "epochs": state.epoch,
        "train_seconds": round(state.train_seconds, 1),
        "nonfinite_updates": state.nonfinite_total,
        "decoding": asdict(search),
        "parameters": sum(p.numel() for p in model.parameters()),
        "world_size": ctx.world_size,
    }
    translator = Translator(model, tokenizer, search, ctx.device)
    for split, raw in test.items():
        src, ref = _texts(raw)
        with autocast():
            hyps = translate_shared(translator, src, ctx)
        if not ctx.is_main:
            continue
        bleu, chrf = corpus_bleu(hyps, ref), corpus_chrf(hyps, ref)
        results["test"][split] = {
            "bleu": bleu.score,
            "chrf": chrf.score,
            "signature": bleu.signature,
            "chrf_signature": chrf.signature,
        }
        log.info(
            "test %s (best.pt, step %d) | BLEU %.2f | chrF %.2f | %s",
            split,
            state.best_step,
            bleu.score,
            chrf.score,
            bleu.signature,
        )
        atomic_write(run_dir / f"hyp.{split}.{tgt_lang}", "\n".join(hyps) + "\n")
    if ctx.is_main:
        atomic_write(run_dir / "results.json", json.dumps(results, indent=2) + "\n")
        log.info("wrote %s", run_dir / "results.json")
    return distributed.broadcast_object(results, ctx)
