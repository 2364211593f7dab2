"""The training loop: `fit(cfg, run_dir)` trains, validates, checkpoints, resumes, and scores
the best checkpoint on the test splits. Building things lives in `build.py`, validation and
the run's parts with validation, saving and the test in `run.py` (`Run`), checkpoint state in
`state.py`.

Data flow: corpus -> SentencePiece ids -> token-budget batches (built on a background thread)
-> Transformer -> label-smoothed loss -> Adam step (lr from `schedule.py`); every `eval_every`
updates: valid loss + BLEU/chrF -> TensorBoard -> checkpoints/{last,best,step_N}.pt.

Host syncs: none in an update. A non-finite loss or gradient norm skips the update on the
device (`_masked_step`); loss sums, the gradient norm and the skip counters stay on the device
until `read_window` reads them in one transfer every `log_every` updates (and before each
validation), which is also when divergence is acted on (`handle_divergence`) and when the
ranks agree on a stop request or the end of the time budget (`trainer.max_minutes`).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from attnmt.common import runtime
from attnmt.common.errors import UserError
from attnmt.common.memory import keep_freed_memory
from attnmt.data.batching import Batch, BatchIterator, prefetch
from attnmt.training import build, distributed
from attnmt.training.config import Configs, TrainerConfig
from attnmt.training.kernels import label_smoothed_cross_entropy
from attnmt.training.resume_config import ResumePlan
from attnmt.training.run import Learner, Run
from attnmt.training.run_dir import RunDirLock
from attnmt.training.state import Progress, roll_back
from attnmt.training.stop import StopRequests

log = logging.getLogger(__name__)

MIN_LOSS_SCALE = 1e-4  # fp16: below this loss scale the gradients overflow for real (fairseq's)


class TrainingError(UserError):
    """Training cannot go on (e.g. the loss keeps diverging); one line: problem and fix."""


@dataclass
class Outcome:
    results: dict[str, Any]  # what results.json holds (only "steps" when preempted)
    preempted: str | None = None  # the signal that stopped the run early, if any


def fit(
    cfg: DictConfig,
    run_dir: str | Path,
    keep_memory: bool = False,
    resume_plan: ResumePlan | None = None,
) -> Outcome:
    """Train as `cfg` says, writing everything under `run_dir` (rank 0 only).

    `resume_plan`: a resume's changes to the run's config (`training.resume_config`), recorded
    in the run dir once the run has started.

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
        elif trainer.precision == "bf16" and not runtime.native_bf16(ctx.device):
            log.warning(
                "trainer.precision=bf16 on a %s without native bf16 (no AVX512-BF16 or AMX): its "
                "matmuls are emulated, tens of times slower than fp32; use trainer.precision=auto",
                ctx.device.type,
            )
        distributed.check_shared_run_dir(run_dir, ctx)
        off_budget = build.tokens_per_update_warning(configs, ctx.world_size)
        if off_budget and ctx.is_main:  # before the data: a corpus may take hours to encode
            log.warning("%s", off_budget)
        outcome = train(configs, run_dir, ctx, resume_plan)
    except BaseException:
        raise  # no teardown: a peer may be gone, and the process is about to exit anyway
    else:
        distributed.teardown(ctx)
    finally:
        if lock is not None:
            lock.release()
    return outcome


def train(
    cfg: Configs, run_dir: Path, ctx: distributed.DistContext, plan: ResumePlan | None = None
) -> Outcome:
    """Update until `max_steps`/`max_epochs`/`max_minutes`/patience or a stop request,
    validating every `eval_every` updates; then test the best checkpoint."""
    run = Run.start(cfg, run_dir, ctx)
    if plan is not None and ctx.is_main:
        plan.record(run.trainee.state.step)
    trainer, state = cfg.trainer, run.trainee.state
    clock = _WallClock(state)
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
    log.info(
        "tokens per update: %d processes x %d max tokens x %d accumulation = %d, each batch "
        "budgeted as rows x its longest side, padding included",
        ctx.world_size,
        trainer.max_tokens,
        trainer.update_freq,
        build.tokens_per_update(cfg, ctx),
    )
    started, first_step = time.perf_counter(), state.step + 1
    spent = _out_of_time(trainer, state.wall_seconds)  # as last.pt saved it: every rank's value
    if spent:
        log.info("time budget: %g minutes already spent (wall %.1f s); validating and testing",
                 trainer.max_minutes, state.wall_seconds)  # fmt: skip
    with StopRequests() as stop:
        while not (spent or _should_stop(state, trainer)) and (batches := next(updates, None)):
            train_step(run, batches, window)
            state.step += 1
            progress.update(1)
            if state.step == first_step:
                log.info(
                    "first update done (step %d): %d source and %d target tokens on this rank",
                    state.step,
                    sum(b.n_src_tokens for b in batches),
                    sum(b.n_tgt_tokens for b in batches),
                )
            at_eval = state.step % trainer.eval_every == 0
            # A stop request is a host flag: one process acts on it after this update; under
            # torchrun the ranks agree on it when they read the window (every log_every).
            asked = not ctx.enabled and stop.requested()
            if asked or at_eval or state.step % trainer.log_every == 0:
                late = _out_of_time(trainer, clock.tick())
                reading = read_window(run, window, stop.requested(), late)
                progress.set_postfix(reading.postfix)
                stop_now, out_of_time = reading.stop, reading.out_of_time
                if reading.diverged:
                    handle_divergence(run, window)
            else:
                stop_now = out_of_time = False
            if out_of_time and not stop_now:  # every rank leaves after this same update
                spent = True
                log.info(
                    "time budget: %g minutes reached at step %d (wall %.1f s); validating "
                    "and testing",
                    trainer.max_minutes,
                    state.step,
                    state.wall_seconds,
                )
                break  # and ends as at max_steps
            if stop_now or at_eval:
                state.train_seconds += time.perf_counter() - started
                clock.tick()  # what last.pt records, so that a resumed run goes on counting
                if stop_now:  # every rank stops after this same update, before validating it
                    reason = stop.reason or "a stop request on another rank"
                    run.stop(reason)
                    return Outcome({"steps": state.step}, preempted=reason)
                run.validate_and_save()
                started = time.perf_counter()
    progress.close()
    state.train_seconds += time.perf_counter() - started
    if window.updates:
        reading = read_window(run, window, False, False)
        if reading.diverged:
            handle_divergence(run, window)
    clock.tick()
    if state.validated_step != state.step:
        run.validate_and_save()  # the final state is always validated and saved
    clock.tick()  # results.json's wall_seconds: the final validation included
    return Outcome(run.test("max_minutes" if spent else _stopped_by(state, trainer)))


def train_step(learner: Learner, batches: list[Batch], window: _Window) -> None:
    """One optimizer update over `batches` (gradient accumulation): forward, loss, backward,
    clip, step, schedule. Equal to one big batch: gradients are normalised by the target
    tokens of the whole update on all ranks.

    No host-device sync: an update whose loss or gradient norm is not finite is skipped on the
    device (the fused optimizer's `found_inf`: weights, moments and step counters unchanged;
    the weight average too), and counted in `window`, which `read_window` reads with the other
    logged values every `log_every` updates (tests/test_train_runtime.py counts the reads)."""
    model, trainee, ctx = learner.train_model, learner.trainee, learner.ctx
    optimizer, scaler, state = trainee.optimizer, trainee.scaler, trainee.state
    optim = learner.cfg.optim
    trainer = learner.cfg.trainer
    model.train()
    per_token = 1.0 / (trainer.max_tokens * trainer.update_freq)  # a constant: fp16-safe scale
    local_tokens, loss_sum, nll_sum = 0, None, None
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
        loss = out.loss.detach().float()
        loss_sum = loss if loss_sum is None else loss_sum + loss
        nll_sum = out.nll.float() if nll_sum is None else nll_sum + out.nll.float()
        local_tokens += batch.n_tgt_tokens
        window.count_tokens(batch)
    # DDP averaged the gradients over ranks: scale sum(grads) / (W * per_token^-1) to
    # sum(grads) / all tokens. The token count (and whether any rank's loss is not finite) is
    # reduced after the backward, on the device, in one collective.
    scaler.unscale_(optimizer)
    local = torch.stack([_full(local_tokens, ctx.device), (~loss_sum.isfinite()).float()])
    n_tokens, bad_losses = distributed.all_reduce_(local, ctx).unbind()
    grads = [p.grad for p in trainee.model.parameters() if p.grad is not None]
    torch._foreach_mul_(grads, ctx.world_size / per_token / n_tokens)
    max_norm = optim.clip_norm if optim.clip_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(trainee.model.parameters(), max_norm)
    skip = (~grad_norm.isfinite()) | (bad_losses > 0)  # the same on every rank
    lr = build.learning_rate(state.step + 1, optim, trainee.model.cfg.d_model) * state.lr_scale
    for group in optimizer.param_groups:
        group["lr"] = lr
    _masked_step(optimizer, skip)
    if trainee.ema is not None:
        trainee.ema.update(state.step + 1, skip)
    scaler.update()  # fp16: a skipped update is an overflow, which halves the loss scale
    optimizer.zero_grad(set_to_none=True)
    window.add_update(loss_sum, nll_sum, local_tokens, grad_norm, skip, scaler.is_enabled())


def _masked_step(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """`optimizer.step()` unless `skip` (a 0-d bool on the device), decided on the device by a
    fused optimizer (its `found_inf`: the kernel leaves parameters, moments and step counters
    as they were). Other optimizers (not built by `build.build_optimizer`) read `skip` back."""
    if all(group.get("fused") for group in optimizer.param_groups):
        optimizer.found_inf = skip.float()  # read by Adam/AdamW.step, as GradScaler sets it
        try:
            optimizer.step()
        finally:
            optimizer.found_inf = None
    elif not bool(skip):
        optimizer.step()


@dataclass
class Reading:
    """What `read_window` read: the log line's values, whether to stop (a stop request), whether
    the run diverged (`trainer.max_nonfinite` skipped updates in a row) and whether its time
    budget is spent (`trainer.max_minutes`), each agreed by all ranks."""

    postfix: dict[str, str]
    stop: bool
    diverged: bool
    out_of_time: bool


def read_window(run: Run, window: _Window, stop_requested: bool, out_of_time: bool) -> Reading:
    """Read the window's device values in one transfer (after one collective under torchrun,
    which also agrees on `stop_requested` and `out_of_time`: one rank's is every rank's), log
    them, count skipped updates into the state, check the fp16 loss scale, start a new window.

    Raises:
        TrainingError: fp16 gradients overflow even at the smallest loss scale.
    """
    trainee, ctx, trainer = run.trainee, run.ctx, run.cfg.trainer
    state, scaler = trainee.state, trainee.scaler
    device = ctx.device
    summed = torch.stack(  # summed over ranks
        [
            torch.as_tensor(window.loss, device=device).double(),
            torch.as_tensor(window.nll, device=device).double(),
            torch.as_tensor(window.applied_tokens, device=device).double(),
            _full(window.tgt_tokens, device).double(),
            _full(window.all_tokens, device).double(),
            _full(stop_requested, device).double(),
            _full(out_of_time, device).double(),
        ]
    )
    same = torch.stack(  # identical on every rank: derived from all-reduced values
        [
            torch.as_tensor(window.grad_norm, device=device).double(),
            torch.as_tensor(window.skipped, device=device).double(),
            torch.as_tensor(window.overflows, device=device).double(),
            torch.as_tensor(window.max_streak, device=device).double(),
            torch.as_tensor(window.streak, device=device).double(),
            scaler._get_scale_async().double().reshape(()) if scaler.is_enabled()
            else _full(1.0, device).double(),
        ]
    )  # fmt: skip
    values = torch.cat([distributed.all_reduce_(summed, ctx), same]).tolist()  # the one read
    loss_sum, nll_sum, applied, tgt, all_tokens, stops, late = values[:7]
    grad_norm, skipped, overflows, max_streak, streak, scale = values[7:]
    seconds = time.perf_counter() - window.started
    nan = float("nan")  # every update of the window skipped: no loss to show
    loss, nll = (loss_sum / applied, nll_sum / applied) if applied else (nan, nan)
    tok_s = all_tokens / max(seconds, 1e-9)
    lr = trainee.optimizer.param_groups[0]["lr"]
    step, updates = state.step, window.updates
    state.nonfinite_total += int(skipped)
    state.nonfinite_streak = int(streak)
    if skipped:
        log.warning(
            "steps %d-%d: %d of %d updates skipped (loss or gradient norm not finite), "
            "%d in a row at most (trainer.max_nonfinite=%d)",
            step - updates + 1,
            step,
            skipped,
            updates,
            max_streak,
            trainer.max_nonfinite,
        )
    if overflows:
        log.info(
            "steps %d-%d: %d fp16 overflow(s), updates skipped, loss scale now %.1e",
            step - updates + 1,
            step,
            overflows,
            scale,
        )
        if scale < MIN_LOSS_SCALE:
            raise TrainingError(
                f"fp16 gradients overflow even at loss scale {scale:.1e} (step {step}); "
                "use trainer.precision=bf16 or fp32, or lower optim.lr"
            )
    log.info(
        "step %d | epoch %d | loss %.3f | ppl %.2f | lr %.2e | gnorm %.2f | %.0f tok/s",
        step,
        state.epoch + 1,
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
            "skipped_updates": skipped,
        },
        step,
    )
    window.reset()
    return Reading(
        {"loss": f"{loss:.3f}", "lr": f"{lr:.1e}", "tok/s": f"{tok_s:.0f}"},
        stops > 0,
        max_streak >= trainer.max_nonfinite,
        late > 0,
    )


def handle_divergence(run: Run, window: _Window) -> None:
    """`trainer.max_nonfinite` updates in a row were skipped: roll back to the newest good
    checkpoint (`last.pt`, else a `step_<N>.pt` with a finite validation loss: its weights,
    optimizer, loss scale, weight average; progress and data position go on, so the batches
    that diverged are not replayed) with the learning rate times `trainer.rollback_lr_factor`,
    at most `trainer.max_rollbacks` times (`trainer.on_divergence=rollback`), or stop (`stop`,
    or nothing to roll back to).

    Raises:
        TrainingError: the run stops (one line: what happened and what to change).
    """
    trainer, state = run.cfg.trainer, run.trainee.state
    step, streak = state.step, max(state.nonfinite_streak, trainer.max_nonfinite)
    what = f"the loss or gradient norm was NaN/inf for {streak} updates in a row (step {step})"
    fix = "lower optim.lr or raise optim.warmup_steps"
    if trainer.precision == "fp16":
        fix += ", or use trainer.precision=bf16 or fp32 instead of fp16"
    if trainer.on_divergence == "stop":
        raise TrainingError(f"{what}; {fix}")
    if state.rollbacks >= trainer.max_rollbacks:
        raise TrainingError(
            f"{what}, after {state.rollbacks} rollback(s) with a lowered learning rate "
            f"(trainer.max_rollbacks={trainer.max_rollbacks}); {fix}"
        )
    folder = run.run_dir / "checkpoints"
    good = roll_back(run.trainee, folder)
    if good is None:
        raise TrainingError(
            f"{what}, and no checkpoint with a finite validation loss to roll back to; {fix}"
        )
    state.rollbacks += 1
    state.lr_scale *= trainer.rollback_lr_factor
    state.nonfinite_streak = 0
    window.streak = 0.0
    log.warning(
        "%s: rolled back to %s (step %d) with the learning rate x%g (rollback %d of %d)",
        what,
        good[0],
        good[1],
        state.lr_scale,
        state.rollbacks,
        trainer.max_rollbacks,
    )


def _full(value: float, device: torch.device) -> torch.Tensor:
    """A 0-d float tensor made on the device (a fill, not a host-to-device copy)."""
    return torch.full((), float(value), device=device)


def _updates(
    batches: BatchIterator, state: Progress, trainer: TrainerConfig, pin_memory: bool
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


def _out_of_time(trainer: TrainerConfig, wall_seconds: float) -> bool:
    """Whether this rank's count of the run's wall time has reached `trainer.max_minutes`."""
    return trainer.max_minutes > 0 and wall_seconds >= 60.0 * trainer.max_minutes


def _should_stop(state: Progress, trainer: TrainerConfig) -> bool:
    stopped = _stopped_by(state, trainer)
    if stopped == "patience":
        log.info("early stop: valid BLEU did not improve for %d validations", state.bad_evals)
    return stopped is not None


def _stopped_by(state: Progress, trainer: TrainerConfig) -> str | None:
    """The stopping rule `state` has reached (results.json's `stopped_by`), or None."""
    if trainer.max_steps and state.step >= trainer.max_steps:
        return "max_steps"
    if trainer.max_epochs and state.epoch >= trainer.max_epochs:
        return "max_epochs"
    if trainer.patience and state.bad_evals >= trainer.patience:
        return "patience"
    return None


class _WallClock:
    """The run's wall time in the training loop, validations included: what earlier runs of
    this run dir spent (`state.wall_seconds` as `last.pt` saved it) plus this run's time since
    its loop started. `tick()` writes it into `state` (before each save and each check)."""

    def __init__(self, state: Progress) -> None:
        self.state, self.before, self.started = state, state.wall_seconds, time.perf_counter()

    def tick(self) -> float:
        self.state.wall_seconds = self.before + time.perf_counter() - self.started
        return self.state.wall_seconds


@dataclass
class _Window:
    """Training statistics since the last read (`read_window`); device tensors until read.
    `streak` (skipped updates in a row, fp16 overflows not counted) carries over windows."""

    device: torch.device
    loss: Any = 0.0  # loss and nll sums of the updates applied
    nll: Any = 0.0
    applied_tokens: Any = 0.0  # target tokens of the updates applied
    tgt_tokens: int = 0  # every batch's, applied or not (throughput)
    all_tokens: int = 0
    updates: int = 0
    grad_norm: Any = 0.0  # the last update's
    skipped: Any = 0.0  # updates skipped as non-finite (not fp16 overflows)
    overflows: Any = 0.0  # fp16 overflows (skipped too; the loss scale halves)
    streak: Any = 0.0
    max_streak: Any = 0.0
    started: float = field(default_factory=time.perf_counter)

    def count_tokens(self, batch: Batch) -> None:
        self.tgt_tokens += batch.n_tgt_tokens
        self.all_tokens += batch.n_tgt_tokens + batch.n_src_tokens

    def add_update(
        self,
        loss: torch.Tensor,
        nll: torch.Tensor,
        tokens: int,
        grad_norm: torch.Tensor,
        skip: torch.Tensor,
        fp16: bool,
    ) -> None:
        """Fold in one update (device ops only; `fp16`: a skip is the loss scale's overflow)."""
        zero = torch.zeros((), device=loss.device)
        self.loss = self.loss + torch.where(skip, zero, loss)
        self.nll = self.nll + torch.where(skip, zero, nll)
        self.applied_tokens = self.applied_tokens + torch.where(skip, zero, zero + tokens)
        self.grad_norm = grad_norm.detach()
        self.updates += 1
        flag = skip.float()
        if fp16:
            self.overflows = self.overflows + flag
            return
        self.skipped = self.skipped + flag
        self.streak = (self.streak + 1) * flag  # 0 after an applied update
        self.max_streak = torch.maximum(
            torch.as_tensor(self.max_streak, device=flag.device), self.streak
        )

    def reset(self) -> None:
        """A new window; the streak of skipped updates goes on."""
        streak = self.streak
        self.__init__(self.device)
        self.streak = streak
