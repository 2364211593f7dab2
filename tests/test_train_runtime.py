"""What a GPU run and a cluster need, shown on the CPU in one process: host reads per update,
the prefetching loader, fp16 loss scaling, precision changes on resume, device checks, the
run-dir lock, preemption of a single process and the time budget (`trainer.max_minutes`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from itertools import islice

import pytest
import torch

from attnmt.checkpoint import load_checkpoint, save_checkpoint
from attnmt.common import runtime
from attnmt.data.batching import collate, prefetch
from attnmt.training import build, loop
from attnmt.training.config import ConfigError, Configs
from attnmt.training.loop import _updates, _Window, fit, train_step
from attnmt.training.run import Learner, Run
from attnmt.training.run_dir import RunDirBusy, RunDirLock
from attnmt.training.state import Progress
from tests.host_reads import HostReads
from tests.train_helpers import ROOT, params, run_train, toy, toy_cfg, train_cmd


def _two_batches(run):
    rows = run.data.train[list(range(16))]
    special = run.data.tokenizer.special
    return [
        collate(rows["src_ids"][:8], rows["tgt_ids"][:8], special),
        collate(rows["src_ids"][8:], rows["tgt_ids"][8:], special),
    ]


def test_the_counters_see_each_kind_of_host_read():
    """The modes below must be able to fail: each kind of read they look for is seen."""
    x = torch.tensor([1.0, float("nan"), 3.0])
    with HostReads() as reads:
        x.sum().item()
        x.tolist()
        x.cpu()
        bool(x[0] > 0)
        x[x > 1]  # boolean-mask indexing
        torch.nonzero(x)
        x.unique()
    calls = reads.calls
    assert {"item", "tolist", "cpu", "__bool__"} <= set(calls)
    assert any("nonzero" in c for c in calls) and any("unique" in c for c in calls)
    assert any("_local_scalar_dense" in c for c in calls)
    assert any("index" in c for c in calls)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_update_reads_nothing_back_to_the_host(tmp_path, precision):
    """Gradient accumulation over 2 micro-batches, label smoothing, clipping, fused Adam, not on
    a log or eval step: zero host reads per update, even when the update is skipped as
    non-finite. Before: 36 here (2 token counts, 2 loss sums, the norm, one Adam step counter
    per parameter tensor), then 1 (the gradient norm and the stop flag, to skip a non-finite
    update on the host)."""
    run = toy(
        tmp_path,
        "trainer.update_freq=2",
        f"trainer.precision={precision}",
        "optim.label_smoothing=0.1",
        "optim.clip_norm=0.5",
        "trainer.ema_decay=0.99",
    )
    assert run.cfg.trainer.log_every > 4 and run.cfg.trainer.eval_every > 4
    batches = _two_batches(run)
    window = _Window(run.ctx.device)
    learner = Learner(run.cfg, run.ctx, run.trainee, run.trainee.model)
    train_step(learner, batches, window)  # the optimizer creates its state
    with HostReads() as reads:
        for _ in range(3):
            train_step(learner, batches, window)
        with torch.no_grad():
            run.trainee.model.encoder.layers[0].feed_forward.linear1.weight[0, 0] = float("nan")
        train_step(learner, batches, window)  # skipped on the device
    assert reads.calls == []
    assert float(window.skipped) == 1 and window.updates == 5


def test_prefetch_gives_the_same_batches_in_the_same_order(tmp_path):
    run = toy(tmp_path, "trainer.max_tokens=96")
    loader = build.train_batches(run.data, run.cfg, run.ctx)
    direct = [b.indices for b in loader.epoch(1)]
    ahead = [b.indices for b in prefetch(loader.epoch(1), depth=2)]
    assert direct == ahead and len(direct) > 3
    assert [b.indices for b in prefetch(loader.epoch(1, start=2), depth=3)] == direct[2:]


def test_prefetch_raises_the_producers_error_where_it_happened():
    def batches():
        yield 1
        yield 2
        raise ValueError("bad row")

    got = []
    with pytest.raises(ValueError, match="bad row"):
        for item in prefetch(batches(), depth=4):
            got.append(item)
    assert got == [1, 2]


def test_resume_position_counts_batches_handed_out_not_prefetched(tmp_path):
    """Take 3 updates from a prefetching loader, then start a second one from the state it
    recorded: together they give exactly the batches of one uninterrupted pass."""
    run = toy(tmp_path, "trainer.update_freq=2", "trainer.max_tokens=96")
    loader = build.train_batches(run.data, run.cfg, run.ctx)
    trainer = replace(run.cfg.trainer, update_freq=2, max_epochs=0, prefetch=2)

    def take(state: Progress, n: int) -> list[list[list[int]]]:
        updates = _updates(loader, state, trainer, False)
        return [[b.indices for b in group] for group in islice(updates, n)]

    straight = take(Progress(), 20)  # more than one epoch
    first_state = Progress()
    first = take(first_state, 3)
    saved = Progress(epoch=first_state.epoch, batches_done=first_state.batches_done)
    assert saved.batches_done == 6
    assert first + take(saved, 17) == straight


def test_fp16_overflow_lowers_the_loss_scale_without_counting_as_divergence(tmp_path):
    run = toy(tmp_path, "trainer.precision=fp16", "trainer.max_nonfinite=1")
    run.trainee.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)  # overflows for sure
    batches = _two_batches(run)[:1]
    before = params(run.trainee.model)
    window = _Window(run.ctx.device)
    grad_norm = run.update(batches, window)  # skipped, not a divergence: max_nonfinite=1
    assert grad_norm != grad_norm or grad_norm == float("inf")
    assert float(window.overflows) == 1 and float(window.skipped) == float(window.streak) == 0
    assert run.trainee.scaler.get_scale() == 2.0**59
    for name, value in params(run.trainee.model).items():
        torch.testing.assert_close(value, before[name], atol=0, rtol=0)
    for _ in range(60):  # the scale halves until the gradients fit, then training goes on
        grad_norm = run.update(batches)
    assert grad_norm == grad_norm and grad_norm < float("inf")


def test_resume_with_another_precision(tmp_path):
    """A bf16 run (no loss scale saved) resumed with fp16 starts a fresh loss scale."""
    fit(
        toy_cfg(tmp_path, "trainer.precision=bf16", "trainer.max_steps=4", "trainer.eval_every=4"),
        tmp_path / "run",
    )
    fit(
        toy_cfg(tmp_path, "trainer.precision=fp16", "trainer.max_steps=6", "trainer.eval_every=2"),
        tmp_path / "run",
    )
    assert load_checkpoint(tmp_path / "run/checkpoints/last.pt")["train_state"]["step"] == 6


def test_local_rank_beyond_the_visible_gpus_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(runtime.DeviceError, match="LOCAL_RANK=3 but only 2 CUDA"):
        runtime.resolve_device("auto", "trainer.device", local_rank=3)


def test_gpu_machine_with_cpu_only_torch_refuses_auto(tmp_path):
    """An NVIDIA driver (nvidia-smi on PATH) but a CPU torch: `auto` stops with one line;
    `trainer.device=cpu` trains on the CPU as asked."""
    if torch.cuda.is_available():
        pytest.skip("this machine's torch has CUDA")
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho fake\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    auto = run_train(tmp_path / "a", "trainer.device=auto", env=env, timeout=120)
    assert auto.returncode == 2 and "Traceback" not in auto.stderr
    errors = [line for line in auto.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and "CPU-only build" in errors[0] and "trainer.device=cpu" in errors[0]
    cpu = run_train(
        tmp_path / "c",
        "trainer.device=cpu",
        "trainer.max_steps=2",
        "trainer.eval_every=2",
        env=env,
        timeout=120,
    )
    assert cpu.returncode == 0, cpu.stderr[-2000:]


def test_run_dir_lock_names_the_holder_and_is_released_on_exit(tmp_path):
    lock = RunDirLock(tmp_path)
    with pytest.raises(RunDirBusy, match=f"PID {os.getpid()}"):
        RunDirLock(tmp_path)
    lock.release()
    RunDirLock(tmp_path).release()  # free again


def test_second_run_on_a_live_run_dir_is_refused_and_a_dead_ones_lock_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        train_cmd(run_dir, "trainer.max_steps=100000", "trainer.eval_every=3"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while not (run_dir / "checkpoints" / "last.pt").exists():
            assert time.time() < deadline and first.poll() is None
            time.sleep(0.2)
        config = (run_dir / ".hydra" / "config.yaml").read_text()
        second = run_train(run_dir, "trainer.max_steps=5", "model.d_model=64", timeout=120)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        errors = [ln for ln in second.stderr.splitlines() if ln.startswith("train.py: error:")]
        assert len(errors) == 1 and f"in use by a live run (PID {first.pid})" in errors[0]
        assert (run_dir / ".hydra" / "config.yaml").read_text() == config  # nothing touched
    finally:
        first.kill()
        first.wait()
    step = load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]["step"]
    third = run_train(run_dir, f"trainer.max_steps={step + 3}", "trainer.eval_every=3", timeout=120)
    assert third.returncode == 0, third.stderr[-2000:]  # the dead run's lock is taken over


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_preempted_single_process_saves_its_step_and_resumes_there(tmp_path, sig):
    run_dir = tmp_path / "run"
    args = ("trainer.eval_every=1000", "trainer.log_every=1")
    proc = subprocess.Popen(
        train_cmd(run_dir, "trainer.max_steps=100000", *args),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = run_dir / "train.log"
    deadline = time.time() + 120
    while not (log.exists() and "| loss" in log.read_text()):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    step = load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]["step"]
    assert f"stopped by {sig.name} at step {step};" in out
    done = run_train(run_dir, f"trainer.max_steps={step + 2}", *args, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"at step {step} " in log.read_text()


def test_a_run_stopped_before_validating_an_eval_step_validates_it_on_resume(tmp_path, caplog):
    """Preemption saves last.pt after update k but before its validation; the resumed run
    validates step k first, so best.pt and early stopping see every validation."""
    fit(toy_cfg(tmp_path, "trainer.max_steps=6", "trainer.eval_every=3"), tmp_path / "run")
    ckpt_dir = tmp_path / "run" / "checkpoints"
    ckpt = load_checkpoint(ckpt_dir / "last.pt")
    ckpt["train_state"]["validated_step"] = 3  # as a preemption right after step 6 leaves it
    save_checkpoint(ckpt_dir / "last.pt", ckpt)
    (ckpt_dir / "step_6.pt").unlink()
    with caplog.at_level("INFO", logger="attnmt.training.run"):
        fit(toy_cfg(tmp_path, "trainer.max_steps=7", "trainer.eval_every=3"), tmp_path / "run")
    validated = [r.getMessage().split("|")[0] for r in caplog.records if "valid step" in r.message]
    assert validated == ["valid step 6 ", "valid step 7 "]
    assert (ckpt_dir / "step_6.pt").exists()
    assert load_checkpoint(ckpt_dir / "last.pt")["train_state"]["validated_step"] == 7


def test_a_time_budget_stops_at_a_log_step_then_validates_saves_and_tests(tmp_path, caplog):
    """`trainer.max_minutes`: the run leaves the loop at a log step long before max_steps and
    ends as at max_steps: validated, saved (last.pt = that step) and tested (results.json)."""
    budget = 0.005  # minutes: 0.3 s
    cfg = toy_cfg(
        tmp_path,
        f"trainer.max_minutes={budget}",
        "trainer.max_steps=3000",  # ~10 s without the budget
        "trainer.log_every=3",
        "trainer.eval_every=1000",
    )
    with caplog.at_level("INFO", logger="attnmt.training"):
        outcome = fit(cfg, tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    steps = results["steps"]
    assert outcome.preempted is None and outcome.results["steps"] == steps
    assert 0 < steps < 1000 and steps % 3 == 0
    assert f"time budget: {budget:g} minutes reached at step {steps} (wall " in caplog.text
    assert f"valid step {steps} " in caplog.text
    assert {"bleu", "chrf", "signature"} <= set(results["test"]["test"])
    assert results["stopped_by"] == "max_minutes"
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["train_state"]
    assert state["step"] == state["validated_step"] == steps
    assert state["wall_seconds"] >= 60 * budget  # counted before the save of the final state
    assert results["wall_seconds"] >= round(state["wall_seconds"], 1)


def test_the_time_budget_counts_validations_and_ends_at_the_first_log_step_past_it(
    tmp_path, monkeypatch
):
    """Validations (here 0.2 s each) count against the budget; `train_seconds` leaves them
    out. The budget is checked at each log step, and the first at or past it is the last."""
    checks, real_out_of_time = [], loop._out_of_time
    validations, real_validate = [], Run.validate

    def out_of_time(trainer, wall_seconds):
        checks.append((wall_seconds, real_out_of_time(trainer, wall_seconds)))
        return checks[-1][1]

    def slow_validate(run):
        validations.append(run.trainee.state.step)
        time.sleep(0.2)
        return real_validate(run)

    saves, real_save = [], Run.save

    def timed_save(run, *args, **kwargs):
        began = time.perf_counter()
        real_save(run, *args, **kwargs)
        saves.append(time.perf_counter() - began)

    monkeypatch.setattr(loop, "_out_of_time", out_of_time)
    monkeypatch.setattr(Run, "validate", slow_validate)
    monkeypatch.setattr(Run, "save", timed_save)
    cfg = toy_cfg(
        tmp_path,
        "trainer.max_minutes=0.01",  # 0.6 s: three or four slowed validations
        "trainer.max_steps=100",
        "trainer.log_every=2",
        "trainer.eval_every=4",
    )
    fit(cfg, tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    steps = results["steps"]
    assert checks[0] == (0.0, False)  # before the first update: nothing spent in a new run
    checks = checks[1:]  # one a log step
    assert [over for _, over in checks] == [False] * (len(checks) - 1) + [True]
    assert len(checks) == steps // 2 and checks[-1][0] >= 0.6 > checks[-2][0]
    assert validations == list(range(4, steps + 1, 4)) + ([steps] if steps % 4 else [])
    slept = 0.2 * len(validations)  # in wall_seconds, not in train_seconds (0.1: rounding)
    assert results["train_seconds"] + slept <= results["wall_seconds"] + 0.1
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["train_state"]
    # last.pt counts the validation that wrote it (0.2 s here): it trails results.json's figure,
    # taken after that validation and save, by the save alone, however long it took on this
    # machine (results.json rounds to 0.1 s)
    assert -0.05 <= results["wall_seconds"] - saved["wall_seconds"] < saves[-1] + 0.1


def test_a_resumed_run_goes_on_counting_its_wall_time(tmp_path, caplog):
    """`wall_seconds` is saved in last.pt and grows across a resume; a checkpoint without it
    (older) resumes from 0; a run whose budget was spent before it resumed updates no more: it
    validates (if its last update was not) and tests."""
    run_dir, last = tmp_path / "run", tmp_path / "run" / "checkpoints" / "last.pt"
    common = ("trainer.log_every=2", "trainer.eval_every=4")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=4"), run_dir)
    first = load_checkpoint(last)["train_state"]["wall_seconds"]
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=8"), run_dir)
    ckpt = load_checkpoint(last)
    second = ckpt["train_state"]["wall_seconds"]
    assert 0 < first < second

    del ckpt["train_state"]["wall_seconds"]  # as written before the key existed
    save_checkpoint(last, ckpt)
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=10"), run_dir)
    ckpt = load_checkpoint(last)
    assert ckpt["train_state"]["step"] == 10 and ckpt["train_state"]["wall_seconds"] > 0

    ckpt["train_state"]["wall_seconds"] = 3600.0  # an hour spent by the runs before
    save_checkpoint(last, ckpt)
    over = ("trainer.max_minutes=60", "trainer.max_steps=40")
    with caplog.at_level("INFO", logger="attnmt.training.loop"):
        fit(toy_cfg(tmp_path, *common, *over), run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == 10 and results["wall_seconds"] >= 3600  # not 40: not from zero
    assert results["stopped_by"] == "max_minutes"
    assert "time budget: 60 minutes already spent (wall 3600.0 s)" in caplog.text


def test_max_minutes_is_a_stop_criterion_of_its_own_and_never_negative(tmp_path):
    alone = ("trainer.max_steps=0", "trainer.max_epochs=0")
    configs = Configs.from_hydra(toy_cfg(tmp_path, *alone, "trainer.max_minutes=1.5"))
    assert configs.trainer.max_minutes == 1.5
    with pytest.raises(ConfigError, match="max_minutes are all 0"):
        Configs.from_hydra(toy_cfg(tmp_path, *alone))
    with pytest.raises(ConfigError, match=r"trainer.max_minutes=-1 must be >= 0"):
        Configs.from_hydra(toy_cfg(tmp_path, "trainer.max_minutes=-1"))


def test_compiled_training_traces_each_graph_once_and_a_second_epoch_compiles_nothing(tmp_path):
    """`trainer.compile=true` as `train` wraps the model (here with the eager backend: the same
    tracing, guards and recompiles as Inductor, without code generation): one epoch of bucketed
    batches recompiles each layer kind's graph no more often than it has shapes, the forward has
    no graph break, and once its shapes are seen a second epoch (other batches) compiles
    nothing."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    run = toy(tmp_path, "trainer.max_tokens=128", "trainer.bucket_growth=1.1")
    loader = build.train_batches(run.data, run.cfg, run.ctx)
    shapes = loader.sampler.padding_stats()["shapes"]
    model = build.wrap_model(run.trainee.model, run.ctx, compile=True, backend="eager")
    learner = Learner(run.cfg, run.ctx, run.trainee, model)
    window = _Window(run.ctx.device)
    epoch = list(loader.epoch(0))
    assert len(epoch) >= 4 and shapes >= 3
    for batch in epoch:
        train_step(learner, [batch], window)
    graphs = counters["stats"]["unique_graphs"]
    assert 2 <= graphs <= 2 * shapes, dict(counters["stats"])  # encoder and decoder layers
    assert dict(counters["graph_break"]) == {}
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in loader.epoch(1):
            train_step(learner, [batch], window)
    assert counters["stats"]["unique_graphs"] == graphs
    explained = torch._dynamo.explain(run.trainee.model)(epoch[0].src_ids, epoch[0].tgt_in)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
