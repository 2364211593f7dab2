"""The training loop: `fit(cfg, run_dir)` trains, validates, checkpoints, resumes, and scores
the best checkpoint on the test splits. Building things lives in `build.py`, validation and
the run's parts with validation, saving and the test in `run.py` (`Run`), checkpoint state in
`state.py`.

Data flow: corpus -> SentencePiece ids -> token-budget batches (built on a background thread)
-> Transformer -> label-smoothed loss -> Adam step (lr from `schedule.py`); every `eval_every`
updates: valid loss + BLEU/chrF -> TensorBoard -> checkpoints/{last,best,step_N}.pt.

Host syncs: an update reads one thing back from the device, the gradient norm (to skip a
non-finite update); loss sums stay on the device until `log_every`.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from common import runtime
from common.errors import UserError
from common.memory import keep_freed_memory
from data.batching import Batch, BatchIterator, prefetch
from model.kernels import label_smoothed_cross_entropy
from training import build, distributed
from training.config import Configs, TrainerConfig
from training.run import Learner, Run
from training.run_dir import RunDirLock
from training.state import Trainee, TrainState
from training.stop import StopRequests

log = logging.getLogger(__name__)

MIN_LOSS_SCALE = 1e-4  # fp16: below this loss scale the gradients overflow for real (fairseq's)


class TrainingError(UserError):
    """Training cannot go on (e.g. the loss keeps diverging); one line: problem and fix."""


@dataclass
class Outcome:
    results: dict[str, Any]  # what results.json holds (only "steps" when preempted)
    preempted: str | None = None  # the signal that stopped the run early, if any


def fit(cfg: DictConfig, run_dir: str | Path, keep_memory: bool = False) -> Outcome:
    """Train as `cfg` says, writing everything under `run_dir` (rank 0 only).

    `keep_memory`: on the CPU, set glibc's malloc to keep freed memory for reuse
    (`common.memory`), which `train.py` does. It applies to the whole process for the rest of
    its life, so a notebook or test that calls `fit()` leaves it off unless it asks."""
    configs = Configs.from_hydra(cfg)  # the one place DictConfig becomes dataclasses
    run_dir = Path(run_dir)
    trainer = configs.trainer
    if trainer.num_threads > 0:
        torch.set_num_threads(trainer.num_threads)
    lock = RunDirLock(run_dir) if distributed.is_main_process() else None
    try:
        ctx = distributed.setup(trainer.device, trainer.dist_timeout, trainer.tf32)
        if keep_memory and ctx.device.type == "cpu" and keep_freed_memory():
            log.info("malloc keeps freed memory (common.memory): no page faults per step")
        if trainer.precision == "auto":
            trainer.precision = runtime.resolve_precision(ctx.device, "auto")
            log.info("trainer.precision=auto: %s on %s", trainer.precision, ctx.device.type)
        distributed.check_shared_run_dir(run_dir, ctx)
        outcome = train(configs, run_dir, ctx)
    except BaseException:
        raise  # no teardown: a peer may be gone, and the process is about to exit anyway
    else:
        distributed.teardown(ctx)
    finally:
        if lock is not None:
            lock.release()
    return outcome


def train(cfg: Configs, run_dir: Path, ctx: distributed.DistContext) -> Outcome:
    """Update until `max_steps`/`max_epochs`/patience or a stop request, validating every
    `eval_every` updates; then test the best checkpoint."""
    run = Run.start(cfg, run_dir, ctx)
    trainer, state = cfg.trainer, run.trainee.state
    at_eval_step = state.step > 0 and state.step % trainer.eval_every == 0
    if at_eval_step and state.validated_step != state.step:
        run.validate_and_save()  # the last run stopped between this update and its validation
    pin_memory = ctx.device.type == "cuda"
    updates = _updates(build.train_batches(run.data, cfg, ctx), state, trainer, pin_memory)
    window = _Window(ctx.device)
    progress = tqdm(
        total=trainer.max_steps or None,
        initial=state.step,
        unit="upd",
        dynamic_ncols=True,
        disable=not (ctx.is_main and sys.stderr.isatty()),
    )
    started, first_step = time.perf_counter(), state.step + 1
    with StopRequests() as stop:
        while not _should_stop(state, trainer) and (batches := next(updates, None)) is not None:
            grad_norm, stop_now = train_step(run, batches, window, stop.requested)
            state.step += 1
            progress.update(1)
            if state.step == first_step:
                log.info("first update done (step %d)", state.step)
            if state.step % trainer.log_every == 0:
                progress.set_postfix(_log_train(run, window, grad_norm))
            if stop_now or state.step % trainer.eval_every == 0:
                state.train_seconds += time.perf_counter() - started
                if stop_now:  # every rank stops after this same update, before validating it
                    reason = stop.reason or "a stop request on another rank"
                    run.stop(reason)
                    return Outcome({"steps": state.step}, preempted=reason)
                run.validate_and_save()
                started = time.perf_counter()
    progress.close()
    state.train_seconds += time.perf_counter() - started
    if state.validated_step != state.step:
        run.validate_and_save()  # the final state is always validated and saved
    return Outcome(run.test())


def train_step(
    learner: Learner, batches: list[Batch], window: _Window, stop_requested: Callable[[], bool]
) -> tuple[float, bool]:
    """One optimizer update over `batches` (gradient accumulation): forward, loss, backward,
    clip, step, schedule. Equal to one big batch: gradients are normalised by the target
    tokens of the whole update on all ranks. Returns the gradient norm and whether any rank
    was asked to stop (asked at the end of this update), from the update's one host read."""
    model, trainee, ctx = learner.train_model, learner.trainee, learner.ctx
    optimizer, scaler, state = trainee.optimizer, trainee.scaler, trainee.state
    trainer, optim = learner.cfg.trainer, learner.cfg.optim
    model.train()
    per_token = 1.0 / (trainer.max_tokens * trainer.update_freq)  # a constant: fp16-safe scale
    local_tokens = 0
    for i, batch in enumerate(batches):
        batch = batch.to(ctx.device, non_blocking=True)
        defer_sync = ctx.enabled and i < len(batches) - 1  # DDP all-reduces on the last backward
        with model.no_sync() if defer_sync else nullcontext():
            with runtime.autocast(ctx.device, trainer.precision):
                logits = model(batch.src_ids, batch.tgt_in)  # (B, T, V)
            out = label_smoothed_cross_entropy(
                logits, batch.tgt_out, batch.pad_id, optim.label_smoothing
            )
            scaler.scale(out.loss * per_token).backward()
        window.add(out.loss.detach(), out.nll, batch)
        local_tokens += batch.n_tgt_tokens
    # DDP averaged the gradients over ranks: scale sum(grads) / (W * per_token^-1) to
    # sum(grads) / all tokens. The token count is reduced after the backward, on the device.
    scaler.unscale_(optimizer)
    n_tokens = distributed.all_reduce_(_full(local_tokens, ctx.device), ctx)
    grads = [p.grad for p in trainee.model.parameters() if p.grad is not None]
    torch._foreach_mul_(grads, ctx.world_size / per_token / n_tokens)
    max_norm = optim.clip_norm if optim.clip_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(trainee.model.parameters(), max_norm)
    for group in optimizer.param_groups:
        group["lr"] = build.learning_rate(state.step + 1, optim, trainee.model.cfg.d_model)
    flags = torch.stack([grad_norm.float(), _full(stop_requested(), ctx.device)])
    grad_norm_value, stop_value = distributed.all_reduce_(flags, ctx, op="max").tolist()
    if math.isfinite(grad_norm_value):
        optimizer.step()
        if trainee.ema is not None:
            trainee.ema.update(state.step + 1)
        state.nonfinite_streak = 0
    else:
        _skip_update(trainee, trainer.max_nonfinite)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm_value, stop_value > 0


def _skip_update(trainee: Trainee, max_nonfinite: int) -> None:
    """A non-finite gradient: the update is skipped. Under fp16 that is the loss scale's
    overflow, which `scaler.update()` answers by halving the scale; otherwise count it."""
    state, step = trainee.state, trainee.state.step + 1
    if trainee.scaler.is_enabled():
        if trainee.scaler.get_scale() < MIN_LOSS_SCALE:
            raise TrainingError(
                f"fp16 gradients overflow even at loss scale {trainee.scaler.get_scale():.1e} "
                f"(step {step}); use trainer.precision=bf16 or fp32, or lower optim.lr"
            )
        log.info("step %d: fp16 overflow, update skipped, loss scale lowered", step)
        return
    state.nonfinite_streak += 1
    state.nonfinite_total += 1
    log.warning(
        "step %d: non-finite gradient, update skipped (%d in a row)", step, state.nonfinite_streak
    )
    if state.nonfinite_streak >= max_nonfinite:
        raise TrainingError(
            f"the loss was NaN/inf for {state.nonfinite_streak} updates in a row (step {step}); "
            "lower optim.lr, raise optim.warmup_steps, or use trainer.precision=bf16/fp32 "
            "instead of fp16"
        )


def _full(value: float, device: torch.device) -> torch.Tensor:
    """A 0-d float tensor made on the device (a fill, not a host-to-device copy)."""
    return torch.full((), float(value), device=device)


def _updates(
    batches: BatchIterator, state: TrainState, trainer: TrainerConfig, pin_memory: bool
) -> Iterator[list[Batch]]:
    """Groups of `trainer.update_freq` batches (`trainer.prefetch` of them made ahead, on a
    background thread) until `trainer.max_epochs`, from where `state` says (mid-epoch on a
    resume).

    `state.batches_done` counts the batches handed out, not those prefetched, so a checkpoint
    records the exact data position."""
    max_epochs, depth = trainer.max_epochs, trainer.prefetch
    while not (max_epochs and state.epoch >= max_epochs):
        group: list[Batch] = []
        for batch in prefetch(batches.epoch(state.epoch, state.batches_done), depth, pin_memory):
            group.append(batch)
            if len(group) == trainer.update_freq:
                state.batches_done += len(group)
                yield group
                group = []
        if group:  # the epoch's tail: a smaller update rather than dropped pairs
            state.batches_done += len(group)
            yield group
        state.epoch, state.batches_done = state.epoch + 1, 0


def _should_stop(state: TrainState, trainer: TrainerConfig) -> bool:
    if trainer.max_steps and state.step >= trainer.max_steps:
        return True
    if trainer.max_epochs and state.epoch >= trainer.max_epochs:
        return True
    if trainer.patience and state.bad_evals >= trainer.patience:
        log.info("early stop: valid BLEU did not improve for %d validations", state.bad_evals)
        return True
    return False


@dataclass
class _Window:
    """Training statistics since the last log line; device tensors until read."""

    device: torch.device
    loss: Any = 0.0
    nll: Any = 0.0
    tgt_tokens: int = 0
    all_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, loss: torch.Tensor, nll: torch.Tensor, batch: Batch) -> None:
        self.loss = self.loss + loss
        self.nll = self.nll + nll
        self.tgt_tokens += batch.n_tgt_tokens
        self.all_tokens += batch.n_tgt_tokens + batch.n_src_tokens


def _log_train(run: Run, window: _Window, grad_norm: float) -> dict[str, str]:
    """Reduce the window over ranks (one host read), log it, and start a new window."""
    trainee, ctx = run.trainee, run.ctx
    sums = torch.stack(
        [
            torch.as_tensor(window.loss, device=ctx.device).double(),
            torch.as_tensor(window.nll, device=ctx.device).double(),
        ]
    )
    loss_sum, nll_sum, tgt, all_tokens = distributed.all_reduce_sum(
        [*sums.tolist(), window.tgt_tokens, window.all_tokens], ctx
    )
    seconds = time.perf_counter() - window.started
    loss, nll = loss_sum / max(tgt, 1), nll_sum / max(tgt, 1)
    tok_s = all_tokens / max(seconds, 1e-9)
    lr = trainee.optimizer.param_groups[0]["lr"]
    step = trainee.state.step
    log.info(
        "step %d | epoch %d | loss %.3f | ppl %.2f | lr %.2e | gnorm %.2f | %.0f tok/s",
        step,
        trainee.state.epoch + 1,
        loss,
        math.exp(min(nll, 50)),
        lr,
        grad_norm,
        tok_s,
    )
    run.logger.scalars(
        "train",
        {
            "loss": loss,
            "ppl": math.exp(min(nll, 50)),
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_sec": tok_s,
        },
        step,
    )
    window.__init__(ctx.device)
    return {"loss": f"{loss:.3f}", "lr": f"{lr:.1e}", "tok/s": f"{tok_s:.0f}"}
