"""The training loop: `fit(cfg, run_dir)` builds everything, trains, validates, checkpoints,
resumes, and scores the best checkpoint on the test splits.

Data flow: corpus -> SentencePiece ids -> token-budget batches -> Transformer -> label-smoothed
loss -> Adam step (lr from `schedule.py`); every `eval_every` updates: valid loss + BLEU/chrF ->
TensorBoard -> checkpoints/{last,best,step_N}.pt.
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from common.errors import UserError
from data.batching import Batch, TokenBatchSampler, collate, token_lengths
from data.dataset import encode_split, filter_train_pairs, load_split
from data.tokenizer import train_or_load_tokenizer
from decoding.checkpoint import CheckpointError, load_checkpoint, model_payload, save_checkpoint
from decoding.translator import Translator
from evaluation import corpus_bleu, corpus_chrf
from model import Transformer
from training import distributed
from training.config import Configs
from training.logger import TrainLogger
from training.loss import label_smoothed_cross_entropy
from training.schedule import inverse_sqrt_warmup, noam

log = logging.getLogger(__name__)

class TrainingError(UserError):
    """Training cannot go on (e.g. the loss keeps diverging); one line: problem and fix."""


@dataclass
class TrainState:
    """Everything about progress that a resumed run needs besides weights and optimizer."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch, from 0
    batches_done: int = 0  # batches of the current epoch already consumed on this rank
    best_bleu: float = -1.0
    best_step: int = 0
    best_valid: dict[str, float] = field(default_factory=dict)
    bad_evals: int = 0  # validations since BLEU last improved (early stopping)
    nonfinite_streak: int = 0
    nonfinite_total: int = 0
    train_seconds: float = 0.0


def fit(cfg: DictConfig, run_dir: str | Path) -> float:
    """Train as `cfg` says, writing everything under `run_dir`; returns the best valid BLEU."""
    configs = Configs.from_hydra(cfg)  # the one place DictConfig becomes dataclasses
    ctx = distributed.setup(configs.trainer.device)
    try:
        return Trainer(configs, Path(run_dir), ctx).run()
    finally:
        distributed.teardown(ctx)


class Trainer:
    def __init__(self, c: Configs, run_dir: Path, ctx: distributed.DistContext) -> None:
        self.c, self.ctx, self.device = c, ctx, ctx.device
        # torchrun ranks may have computed different timestamped run dirs: use rank 0's.
        self.run_dir = Path(distributed.broadcast_object(str(run_dir), ctx))
        self.ckpt_dir = self.run_dir / "checkpoints"
        if c.trainer.num_threads > 0:
            torch.set_num_threads(c.trainer.num_threads)
        log.info("device: %s (%s), world size %d", self.device, _device_name(self.device), ctx.world_size)
        _seed_everything(c.trainer.seed)
        self._prepare_data()
        self._build_model()
        self.state = TrainState()
        self.logger = TrainLogger(self.run_dir / "tb", c.logger, enabled=ctx.is_main)
        self._maybe_resume()
        self._validated_step = self.state.step if self.state.step > 0 else -1
        if self.state.step == 0:  # a resumed run restored its RNG state from the checkpoint
            _seed_everything(c.trainer.seed + 1000 * ctx.rank)  # per-rank dropout streams

    # --------------------------------------------------------------------------- setup

    def _prepare_data(self) -> None:
        dc = self.c.data
        train_raw = filter_train_pairs(load_split(dc, dc.train_split), dc)
        if self.ctx.is_main:  # rank 0 trains SentencePiece (or reuses spm.model on resume)
            self.tokenizer = train_or_load_tokenizer(train_raw, self.c.tokenizer, self.run_dir)
        distributed.barrier(self.ctx)
        if not self.ctx.is_main:
            self.tokenizer = train_or_load_tokenizer(train_raw, self.c.tokenizer, self.run_dir)
        self.train_data = encode_split(train_raw, self.tokenizer, dc, train=True)
        self.valid_raw = load_split(dc, dc.valid_split)
        self.valid_data = encode_split(self.valid_raw, self.tokenizer, dc, train=False)
        # Load the test splits now, so that a missing one fails before training, not after.
        self.test_raw = {split: load_split(dc, split) for split in dc.test_splits}
        t = self.c.trainer
        self.sampler = TokenBatchSampler(
            *token_lengths(self.train_data), t.max_tokens, seed=t.seed, shuffle=True, rank=self.ctx.rank, world_size=self.ctx.world_size,
        )
        self.valid_sampler = TokenBatchSampler(
            *token_lengths(self.valid_data), t.max_tokens, shuffle=False, rank=self.ctx.rank, world_size=self.ctx.world_size,
        )
        stats = self.sampler.padding_stats()
        log.info("train: %d pairs, %d batches/epoch/rank, padding waste %.1f%%",
                 len(self.train_data), len(self.sampler), 100 * stats.get("waste", 0.0))

    def _build_model(self) -> None:
        special = self.tokenizer.special
        model_cfg = replace(
            self.c.model, src_vocab_size=self.tokenizer.src_vocab_size,
            tgt_vocab_size=self.tokenizer.tgt_vocab_size, pad_id=special.pad,
        )
        self.model = Transformer(model_cfg).to(self.device)
        log.info("model: %s, %.2fM parameters", model_cfg, self.model.num_parameters() / 1e6)
        train_model: torch.nn.Module = self.model
        if self.ctx.enabled:
            ids = None if self.device.type == "cpu" else [self.device.index]
            train_model = DistributedDataParallel(self.model, device_ids=ids)
        self.ddp_model = train_model
        self.train_model = torch.compile(train_model) if self.c.trainer.compile else train_model
        o = self.c.optim
        opt_cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
        self.optimizer = opt_cls(self.model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps,
                                 weight_decay=o.weight_decay)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.c.trainer.precision == "fp16")

    def _autocast(self):
        precision = self.c.trainer.precision
        if precision == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def lr_at(self, step: int) -> float:
        o = self.c.optim
        if o.schedule == "noam":
            return noam(step, self.model.cfg.d_model, o.warmup_steps, o.noam_factor)
        return inverse_sqrt_warmup(step, o.lr, o.warmup_steps)

    # -------------------------------------------------------------------------- resume

    def _maybe_resume(self) -> None:
        last = self.ckpt_dir / "last.pt"
        if not last.is_file():
            return
        ckpt = load_checkpoint(last, map_location=self.device)
        if ckpt["model_config"] != asdict(self.model.cfg):
            raise CheckpointError(
                f"{last} was trained with a different model config; resume with the same "
                "config or start a new run dir (hydra.run.dir=...)"
            )
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.state = TrainState(**ckpt["train_state"])
        _set_rng_state(ckpt["rng"])
        log.info("resumed from %s at step %d (epoch %d, batch %d)", last, self.state.step,
                 self.state.epoch, self.state.batches_done)

    # ---------------------------------------------------------------------------- loop

    def run(self) -> float:
        t, s = self.c.trainer, self.state
        start, last_log = time.perf_counter(), time.perf_counter()
        window = {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "all_tokens": 0.0, "updates": 0}
        updates = self._updates()
        progress = tqdm(total=t.max_steps or None, initial=s.step, unit="upd", dynamic_ncols=True,
                        disable=not (self.ctx.is_main and sys.stderr.isatty()))
        while not self._should_stop():
            batches = next(updates, None)
            if batches is None:
                break
            stats = self._train_update(batches)
            s.step += 1
            progress.update(1)
            for key in window:
                window[key] += stats[key] if key != "updates" else 1
            if s.step % t.log_every == 0:
                now = time.perf_counter()
                progress.set_postfix(self._log_train(window, stats["grad_norm"], now - last_log))
                window = dict.fromkeys(window, 0.0)
                last_log = now
            if s.step % t.eval_every == 0:
                s.train_seconds += time.perf_counter() - start
                start = time.perf_counter()
                self._validate_and_save()
        progress.close()
        s.train_seconds += time.perf_counter() - start
        if self._validated_step != s.step:
            self._validate_and_save()  # the final state is always validated and saved
        results = self._test()
        self.logger.hparams(self.c.raw, s.best_bleu)
        self.logger.close()
        return results["valid"]["bleu"]

    def _should_stop(self) -> bool:
        t, s = self.c.trainer, self.state
        if t.max_steps and s.step >= t.max_steps:
            return True
        if t.max_epochs and s.epoch >= t.max_epochs:
            return True
        if t.patience and s.bad_evals >= t.patience:
            log.info("early stop: valid BLEU did not improve for %d validations", s.bad_evals)
            return True
        return False

    def _updates(self) -> Iterator[list[Batch]]:
        """Groups of `update_freq` batches, resuming mid-epoch where the state says."""
        s, k = self.state, self.c.trainer.update_freq
        while True:
            group: list[Batch] = []
            for batch in self._epoch_batches(s.epoch, s.batches_done):
                group.append(batch)
                if len(group) == k:
                    s.batches_done += k
                    yield group
                    group = []
            if group:  # the epoch's tail: a smaller update rather than dropped pairs
                s.batches_done += len(group)
                yield group
            s.epoch, s.batches_done = s.epoch + 1, 0
            if self.c.trainer.max_epochs and s.epoch >= self.c.trainer.max_epochs:
                return

    def _epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        special = self.tokenizer.special
        for i, indices in enumerate(self.sampler):
            if i < start:
                continue  # already trained on before a resume: skip without reading the data
            rows = self.train_data[indices]
            yield collate(rows["src_ids"], rows["tgt_ids"], special, indices)

    def _train_update(self, batches: list[Batch]) -> dict[str, float]:
        """One optimizer update over `batches` (gradient accumulation), normalised by the
        number of target tokens of the whole update on all ranks, so it equals one big batch."""
        self.train_model.train()
        pad, eps = self.tokenizer.special.pad, self.c.optim.label_smoothing
        local_tokens = sum(b.n_tgt_tokens for b in batches)
        (n_tokens,) = distributed.all_reduce_sum([float(local_tokens)], self.ctx)
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device, non_blocking=True)
            last = i == len(batches) - 1
            sync = nullcontext() if last or not self.ctx.enabled else self.ddp_model.no_sync()
            with sync:
                with self._autocast():
                    logits = self.train_model(batch.src_ids, batch.tgt_in)  # (B, T, V)
                out = label_smoothed_cross_entropy(logits, batch.tgt_out, pad, eps)
                # DDP averages gradients over ranks; scale by world_size so the result is a sum
                # over all ranks' tokens divided by n_tokens.
                self.scaler.scale(out.loss * (self.ctx.world_size / n_tokens)).backward()
            loss_sum += out.loss.detach()
            nll_sum += out.nll
        grad_norm = self._step()
        stats = distributed.all_reduce_sum(
            [loss_sum.item(), nll_sum.item(), float(sum(b.n_src_tokens for b in batches))], self.ctx
        )
        return {"loss": stats[0], "nll": stats[1], "tokens": n_tokens,
                "all_tokens": n_tokens + stats[2], "grad_norm": grad_norm}

    def _step(self) -> float:
        """Clip, skip the update if the gradient is not finite, else step with the scheduled lr."""
        s, o = self.state, self.c.optim
        self.scaler.unscale_(self.optimizer)
        max_norm = o.clip_norm if o.clip_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        lr = self.lr_at(s.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if math.isfinite(grad_norm):
            self.scaler.step(self.optimizer)
            s.nonfinite_streak = 0
        else:
            s.nonfinite_streak += 1
            s.nonfinite_total += 1
            log.warning("step %d: non-finite gradient, update skipped (%d in a row)",
                        s.step + 1, s.nonfinite_streak)
            if s.nonfinite_streak >= self.c.trainer.max_nonfinite:
                raise TrainingError(
                    f"the loss was NaN/inf for {s.nonfinite_streak} updates in a row (step "
                    f"{s.step + 1}); lower optim.lr, raise optim.warmup_steps, or use "
                    "trainer.precision=bf16/fp32 instead of fp16"
                )
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _log_train(self, window: dict[str, float], grad_norm: float, seconds: float) -> dict:
        s = self.state
        loss = window["loss"] / max(window["tokens"], 1)
        nll = window["nll"] / max(window["tokens"], 1)
        tok_s = window["all_tokens"] / max(seconds, 1e-9)
        lr = self.optimizer.param_groups[0]["lr"]
        log.info("step %d | epoch %d | loss %.3f | ppl %.2f | lr %.2e | gnorm %.2f | %.0f tok/s",
                 s.step, s.epoch + 1, loss, math.exp(min(nll, 50)), lr, grad_norm, tok_s)
        self.logger.scalars("train", {"loss": loss, "ppl": math.exp(min(nll, 50)), "lr": lr,
                                      "grad_norm": grad_norm, "tokens_per_sec": tok_s}, s.step)
        return {"loss": f"{loss:.3f}", "lr": f"{lr:.1e}", "tok/s": f"{tok_s:.0f}"}

    # ---------------------------------------------------------------------- validation

    def translator(self) -> Translator:
        return Translator(self.model, self.tokenizer, self.c.decoding, self.device)

    @torch.no_grad()
    def _valid_loss(self) -> tuple[float, float]:
        self.model.eval()
        pad = self.tokenizer.special.pad
        sums = [0.0, 0.0, 0.0]
        for indices in self.valid_sampler:
            rows = self.valid_data[indices]
            batch = collate(rows["src_ids"], rows["tgt_ids"], self.tokenizer.special, indices)
            batch = batch.to(self.device)
            with self._autocast():
                logits = self.model(batch.src_ids, batch.tgt_in)
            out = label_smoothed_cross_entropy(logits, batch.tgt_out, pad, self.c.optim.label_smoothing)
            sums = [sums[0] + out.loss.item(), sums[1] + out.nll.item(), sums[2] + out.n_tokens]
        loss, nll, n = distributed.all_reduce_sum(sums, self.ctx)
        return loss / max(n, 1), nll / max(n, 1)

    def _translate(self, raw: Any, limit: int = 0) -> tuple[list[str], list[str], list[str]]:
        columns = raw[:]  # one Arrow read (column access on a Dataset is lazy, row by row)
        src, ref = columns["src"], columns["tgt"]
        if limit:
            src, ref = src[:limit], ref[:limit]
        self.model.eval()
        with self._autocast():
            hyps = self.translator().translate(src)
        return src, ref, hyps

    def validate(self) -> dict[str, float]:
        loss, nll = self._valid_loss()
        metrics = {"loss": loss, "ppl": math.exp(min(nll, 50)), "bleu": 0.0, "chrf": 0.0}
        if self.ctx.is_main:
            src, ref, hyps = self._translate(self.valid_raw, self.c.trainer.valid_max_sentences)
            bleu, chrf = corpus_bleu(hyps, ref), corpus_chrf(hyps, ref)
            metrics.update(bleu=bleu.score, chrf=chrf.score)
            log.info("valid step %d | loss %.3f | ppl %.2f | BLEU %.2f | chrF %.2f | %s",
                     self.state.step, loss, metrics["ppl"], bleu.score, chrf.score, bleu.signature)
            self.logger.scalars("valid", metrics, self.state.step)
            self.logger.samples(src, ref, hyps, self.state.step)
            if src:
                self.logger.attention(self.translator(), src[0], self.state.step)
        metrics["bleu"], metrics["chrf"] = distributed.broadcast_object(
            (metrics["bleu"], metrics["chrf"]), self.ctx)
        return metrics

    def _validate_and_save(self) -> None:
        s = self.state
        metrics = self.validate()
        self._validated_step = s.step
        improved = metrics["bleu"] > s.best_bleu
        if improved:
            s.best_bleu, s.best_step, s.best_valid, s.bad_evals = metrics["bleu"], s.step, metrics, 0
        else:
            s.bad_evals += 1
        if self.ctx.is_main:
            self._save(improved)
        distributed.barrier(self.ctx)

    # ----------------------------------------------------------------------- checkpoints

    def _save(self, is_best: bool) -> None:
        base = model_payload(self.model, self.tokenizer)
        full = {**base, "optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                "train_state": asdict(self.state), "rng": _rng_state(), "config": self.c.raw}
        save_checkpoint(self.ckpt_dir / "last.pt", full)
        if is_best:
            save_checkpoint(self.ckpt_dir / "best.pt", {**base, "train_state": asdict(self.state),
                                                        "config": self.c.raw})
        keep = self.c.trainer.keep_last
        if keep > 0:
            save_checkpoint(self.ckpt_dir / f"step_{self.state.step}.pt",
                            {**base, "train_state": asdict(self.state)})
            steps = sorted(self.ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
            for old in steps[:-keep]:
                old.unlink(missing_ok=True)

    # ------------------------------------------------------------------------------ test

    def _test(self) -> dict[str, Any]:
        s = self.state
        best = self.ckpt_dir / "best.pt"
        if best.is_file():
            self.model.load_state_dict(load_checkpoint(best, map_location=self.device)["model"])
        results: dict[str, Any] = {
            "valid": {k: s.best_valid.get(k, 0.0) for k in ("bleu", "chrf", "loss", "ppl")},
            "test": {}, "steps": s.step, "best_step": s.best_step, "epochs": s.epoch,
            "train_seconds": round(s.train_seconds, 1), "nonfinite_updates": s.nonfinite_total,
            "decoding": asdict(self.c.decoding), "parameters": self.model.num_parameters(),
        }
        if self.ctx.is_main:
            for split, raw in self.test_raw.items():
                _, ref, hyps = self._translate(raw)
                bleu, chrf = corpus_bleu(hyps, ref), corpus_chrf(hyps, ref)
                results["test"][split] = {"bleu": bleu.score, "chrf": chrf.score,
                                          "signature": bleu.signature, "chrf_signature": chrf.signature}
                log.info("test %s (best.pt, step %d) | BLEU %.2f | chrF %.2f | %s",
                         split, s.best_step, bleu.score, chrf.score, bleu.signature)
                (self.run_dir / f"hyp.{split}.{self.c.data.tgt_lang}").write_text(
                    "\n".join(hyps) + "\n", encoding="utf-8")
            path = self.run_dir / "results.json"
            path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            log.info("wrote %s", path)
        return results


# -------------------------------------------------------------------------------- helpers


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(_py_state())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _py_state() -> tuple:
    version, internal, gauss = random.getstate()
    return version, list(internal), gauss


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
