"""One training run as one object: `Run` holds what a run is built from (config, devices, data,
model/optimizer/state, TensorBoard, run dir) and does everything but the updates: validate,
save, test. The updates are `loop.train_step`, a plain function of the run's `Learner` part.

Under DDP every method is called on every rank: each rank decodes its share of the sentences
and rank 0 scores, logs and writes (`evaluate.translate_shared`).
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnmt.checkpoint import keep_newest_step_checkpoints, load_checkpoint, save_checkpoint
from attnmt.common import runtime
from attnmt.common.files import atomic_write
from attnmt.data.batching import BatchIterator
from attnmt.data.dataset import cache_root
from attnmt.decoding.config import RunDecoding
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine
from attnmt.training import build, distributed
from attnmt.training.config import Configs
from attnmt.training.evaluate import (
    results_summary,
    scores,
    texts,
    translate_shared,
    valid_loss,
    write_results,
)
from attnmt.training.init import command_line_keys, initial_checkpoint
from attnmt.training.logger import TrainLogger
from attnmt.training.resume_config import tokens_check
from attnmt.training.state import Trainee, checkpoint_payloads, resume, rng_state, seed_everything

log = logging.getLogger(__name__)


@dataclass
class Learner:
    """What one update (`loop.train_step`) uses: the config, the devices, what training changes,
    and the model that trains: `trainee.model` itself, or its DDP/compiled wrapper."""

    cfg: Configs
    ctx: distributed.DistContext
    trainee: Trainee
    train_model: torch.nn.Module


@dataclass
class Run(Learner):
    """A training run once built: its `Learner`, data, TensorBoard and run dir."""

    run_dir: Path
    data: build.Data
    logger: TrainLogger
    valid_batches: BatchIterator  # this rank's share of the validation pairs

    @classmethod
    def start(cls, cfg: Configs, run_dir: Path, ctx: distributed.DistContext) -> Run:
        """Data, model, optimizer; resume from `last.pt` if there is one (before DDP wraps),
        else start from `trainer.init_from`'s weights if set (`training.init`)."""
        log.info(
            "device: %s (%s), world size %d", ctx.device, _device_name(ctx.device), ctx.world_size
        )
        seed_everything(cfg.trainer.seed)  # the same initial weights on every rank
        initial = initial_checkpoint(cfg, run_dir, command_line_keys())  # trainer.init_from
        tokenizer = initial.tokenizer if initial else None
        data = build.prepare_data(cfg, run_dir, ctx, tokenizer)
        trainee = build.build_trainee(cfg, data.tokenizer, ctx.device)
        trainer = cfg.trainer
        check = tokens_check(
            trainer.max_tokens, trainer.update_freq, ctx.world_size, trainer.allow_config_change
        )
        if not resume(trainee, run_dir / "checkpoints" / "last.pt", ctx, check):
            if initial is not None:
                initial.load_into(trainee, cfg.trainer.init_keep_optimizer)
            seed_everything(cfg.trainer.seed + 1000 * ctx.rank)  # per-rank dropout streams
        return cls(
            cfg=cfg,
            ctx=ctx,
            trainee=trainee,
            train_model=build.wrap_model(trainee.model, ctx, cfg.trainer.compile),
            run_dir=run_dir,
            data=data,
            logger=TrainLogger(run_dir / "tb", cfg.logger, enabled=ctx.is_main),
            valid_batches=build.valid_batches(data, cfg, ctx),
        )

    def autocast(self) -> AbstractContextManager:
        """A fresh context of `trainer.precision` on this rank's device."""
        return runtime.autocast(self.ctx.device, self.cfg.trainer.precision)

    def decoding(self) -> RunDecoding:
        """How validation and the test decode: the `decoding` config, in `trainer.precision`
        (resolved by then: never `auto`) on this device. Recorded in `results.json` and in
        every checkpoint, where translate.py and serve.py find it."""
        return RunDecoding(self.cfg.decoding, self.cfg.trainer.precision, self.ctx.device.type)

    def translator(self, model: torch.nn.Module) -> Translator:
        """Validation's and the test's translator: the inference engine on the model's own
        parameters, in the run's decoding config (entered in `self.autocast()` by the caller,
        as translate.py enters the recorded precision). Its packed layers are chosen once and
        remembered in the run's data cache (`data.cache_dir`), not in HOME: a node of a
        multi-node run writes nothing there."""
        engine = Engine(model, pack_cache=cache_root(self.cfg.data) / "packing.json")
        return Translator(engine, self.data.tokenizer, self.cfg.decoding, self.ctx.device)

    def validate(self) -> dict[str, float]:
        """Loss, perplexity, BLEU and chrF on the validation split of the weights checkpoints
        hold (the average, with EMA); the same values on all ranks. Rank 0 logs them, sample
        translations and an attention heatmap."""
        cfg, ctx, model, ema = self.cfg, self.ctx, self.trainee.model, self.trainee.ema
        step, smoothing = self.trainee.state.step, cfg.optim.label_smoothing
        with ema.applied() if ema else nullcontext():  # validate what best.pt will hold
            loss, nll = valid_loss(model, self.valid_batches, smoothing, self.autocast, ctx)
            metrics = {"loss": loss, "ppl": math.exp(min(nll, 50)), "bleu": 0.0, "chrf": 0.0}
            src, ref = texts(self.data.valid, cfg.trainer.valid_max_sentences)
            translator = self.translator(model)
            with self.autocast():
                hyps = translate_shared(translator, src, ctx)
            if ctx.is_main:
                score = scores(hyps, ref)
                metrics.update(bleu=score["bleu"], chrf=score["chrf"])
                log.info(
                    "valid step %d | loss %.3f | ppl %.2f | BLEU %.2f | chrF %.2f | %s",
                    step,
                    loss,
                    metrics["ppl"],
                    score["bleu"],
                    score["chrf"],
                    score["signature"],
                )
                self.logger.scalars("valid", metrics, step)
                self.logger.samples(src, ref, hyps, step)
                if src:
                    self.logger.attention(translator, src[0], step)
        metrics["bleu"], metrics["chrf"] = distributed.broadcast_object(
            (metrics["bleu"], metrics["chrf"]), ctx
        )
        return metrics

    def validate_and_save(self) -> None:
        """Validate; track the best BLEU (early stopping); write last/best/step_N.pt, their
        `wall_seconds` counting this validation (the loop's clock sets the exact figure later)."""
        state, started = self.trainee.state, time.perf_counter()
        metrics = self.validate()
        state.wall_seconds += time.perf_counter() - started
        state.valid_loss = metrics["loss"]
        # A model whose validation loss is NaN/inf (a diverged run) never becomes best.pt.
        improved = metrics["bleu"] > state.best_bleu and math.isfinite(metrics["loss"])
        if improved:
            state.best_bleu, state.best_step, state.best_valid = (
                metrics["bleu"],
                state.step,
                metrics,
            )
        state.bad_evals = 0 if improved else state.bad_evals + 1
        state.validated_step = state.step
        self.save(self.cfg.trainer.keep_last, is_best=improved)

    def save(self, keep_last: int, is_best: bool = False) -> None:
        """Write `last.pt` (+ `best.pt`, + `step_<N>.pt` keeping the newest `keep_last`).
        `step_<N>.pt` holds what `last.pt` holds, so a damaged `last.pt` resumes from it.

        Call on every rank: each contributes its random state, rank 0 writes, and no rank goes
        on before the files are written."""
        rngs = distributed.gather_objects(rng_state(), self.ctx)
        if self.ctx.is_main:
            folder, config = self.run_dir / "checkpoints", self.cfg.raw
            decoding = self.decoding().as_dict()
            tokenizer = self.data.tokenizer
            base, last = checkpoint_payloads(self.trainee, tokenizer, config, rngs, decoding)
            save_checkpoint(folder / "last.pt", last)
            if is_best:
                save_checkpoint(folder / "best.pt", {**base, "config": config})
            if keep_last > 0:
                save_checkpoint(folder / f"step_{self.trainee.state.step}.pt", last)
                keep_newest_step_checkpoints(folder, keep_last)
        distributed.barrier(self.ctx)

    def stop(self, reason: str) -> None:
        """Save `last.pt` at this exact step (no validation) and close TensorBoard: the run
        ends early and resumes from here."""
        self.save(keep_last=0)
        self.logger.close()
        log.warning(
            "stopped by %s after step %d; checkpoints/last.pt saved",
            reason,
            self.trainee.state.step,
        )

    def test(self, stopped_by: str | None = None) -> dict[str, Any]:
        """Translate every test split with `best.pt`'s weights; rank 0 writes
        `hyp.<split>.<lang>` and `results.json` (`stopped_by`: the rule that ended training).
        Closes TensorBoard; returns the results on every rank."""
        model, state, ctx = self.trainee.model, self.trainee.state, self.ctx
        best = self.run_dir / "checkpoints" / "best.pt"
        if best.is_file():
            model.load_state_dict(load_checkpoint(best)["model"])
        budget = build.tokens_per_update(self.cfg, ctx)
        results = results_summary(
            state, self.decoding(), model, ctx.world_size, self.data.dropped, budget
        )
        results["stopped_by"] = stopped_by
        translator = self.translator(model)
        for split, raw in self.data.test.items():
            src, ref = texts(raw)
            with self.autocast():
                hyps = translate_shared(translator, src, ctx)
            if not ctx.is_main:
                continue
            score = results["test"][split] = scores(hyps, ref)
            log.info(
                "test %s (best.pt, step %d) | BLEU %.2f | chrF %.2f | %s",
                split,
                state.best_step,
                score["bleu"],
                score["chrf"],
                score["signature"],
            )
            hyp_file = self.run_dir / f"hyp.{split}.{self.data.test_langs[split]}"
            atomic_write(hyp_file, "\n".join(hyps) + "\n")
        if ctx.is_main:
            write_results(self.run_dir, results)
        results = distributed.broadcast_object(results, ctx)
        self.logger.hparams(self.cfg.raw, state.best_bleu)
        self.logger.close()
        return results


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
