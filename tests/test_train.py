"""Training behaviour on the toy corpus: learning, accumulation, resume, kills, DDP, logging."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnmt.checkpoint import load_checkpoint
from attnmt.common import runtime
from attnmt.common.memory import on_glibc
from attnmt.data.batching import collate
from attnmt.training import build, distributed
from attnmt.training.loop import _Window, fit, train_step
from attnmt.training.run import Learner
from tests.train_helpers import ROOT, params, run_train, toy, toy_cfg, train_cmd

# Equivalence tests compare parameters after one plain SGD step with lr 1 and no clipping, so
# the update IS the gradient. (Adam would turn the mathematically zero gradient of the key
# bias, ~1e-10 of float noise, into a full +-lr step and make any comparison meaningless.)
SGD_STEP = ("model.dropout=0.0", "optim.lr=1.0", "optim.warmup_steps=1", "optim.clip_norm=0")


def test_memorises_toy_set_to_high_bleu(tmp_path):
    """Loss falls and the 12 valid pairs (seen in training) are reproduced almost exactly."""
    best = fit(
        toy_cfg(
            tmp_path,
            "trainer.max_steps=120",
            "trainer.eval_every=120",
            "model.d_model=64",
            "model.d_ff=128",
            "model.n_heads=4",
            "model.dropout=0.0",
            "optim.lr=5e-3",
            "optim.warmup_steps=30",
            "optim.label_smoothing=0.0",
            "trainer.max_tokens=1024",
            "tokenizer.vocab_size=120",
        ),
        tmp_path / "run",
    )
    best = best.results["valid"]["bleu"]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert best > 80.0, results
    assert results["valid"]["loss"] < 0.5
    assert {"bleu", "chrf", "loss"} <= set(results["valid"])
    assert set(results["test"]["test"]) >= {"bleu", "chrf", "signature"}
    assert results["steps"] == 120 and results["train_seconds"] > 0
    assert results["stopped_by"] == "max_steps"


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    run = toy(tmp_path, *SGD_STEP).use_sgd()
    model = run.trainee.model
    start = params(model)
    rows = run.data.train[list(range(8))]
    special = run.data.tokenizer.special
    halves = [
        collate(rows["src_ids"][:3], rows["tgt_ids"][:3], special),
        collate(rows["src_ids"][3:], rows["tgt_ids"][3:], special),
    ]
    run.update(halves)
    accumulated = params(model)

    model.load_state_dict(start)
    run.trainee.state.step = 0
    run.update([collate(rows["src_ids"], rows["tgt_ids"], special)])
    for name, value in params(model).items():
        torch.testing.assert_close(accumulated[name], value, atol=2e-6, rtol=1e-5, msg=name)
    assert any(not torch.equal(start[k], accumulated[k]) for k in start)  # it did update


def test_resume_equals_uninterrupted(tmp_path):
    common = ("model.dropout=0.1", "trainer.eval_every=6", "logger=none")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=12"), tmp_path / "straight")
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=6"), tmp_path / "resumed")
    assert (
        load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["train_state"]["step"]
        == 6
    )
    fit(toy_cfg(tmp_path, *common, "trainer.max_steps=12"), tmp_path / "resumed")
    straight = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")
    assert resumed["train_state"]["step"] == straight["train_state"]["step"] == 12
    for name, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, atol=0, rtol=0, msg=name)
    assert resumed["train_state"]["epoch"] == straight["train_state"]["epoch"]


def test_killed_run_resumes_from_last_complete_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    cmd = train_cmd(
        run_dir, "trainer.max_steps=100000", "trainer.eval_every=3", "trainer.keep_last=2"
    )
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = run_dir / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while time.time() < deadline:
        if last.exists() and load_checkpoint(last)["train_state"]["step"] >= 9:
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # mid-run, possibly mid-write
    proc.wait()
    for path in (run_dir / "checkpoints").glob("*.pt"):
        load_checkpoint(path)  # every visible checkpoint is complete
    killed_at = load_checkpoint(last)["train_state"]["step"]
    assert killed_at >= 9
    done = run_train(
        run_dir, f"trainer.max_steps={killed_at + 3}", "trainer.eval_every=3", timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resumed from {last} at step {killed_at}" in (run_dir / "train.log").read_text()
    assert load_checkpoint(last)["train_state"]["step"] == killed_at + 3


def _ddp_worker(rank: int, world: int, tmp: str, port: int) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    tmp_path = Path(tmp)
    run = toy(tmp_path, *SGD_STEP, run="ddp").use_sgd()  # same spm.model (rank 0 trains it first)
    ctx = distributed.setup("cpu")
    try:
        model = torch.nn.parallel.DistributedDataParallel(run.trainee.model)
        sampler = build.train_batches(run.data, run.cfg, ctx).sampler
        sampler.set_epoch(0)
        indices = next(iter(sampler))
        rows = run.data.train[indices]
        batch = collate(rows["src_ids"], rows["tgt_ids"], run.data.tokenizer.special, indices)
        learner = Learner(run.cfg, ctx, run.trainee, model)
        train_step(learner, [batch], _Window(ctx.device))
        torch.save(
            {"indices": indices, "params": params(run.trainee.model)}, tmp_path / f"rank{rank}.pt"
        )
    finally:
        distributed.teardown(ctx)


def test_ddp_two_processes_equal_one_process_on_combined_batch(tmp_path):
    import torch.multiprocessing as mp

    toy(tmp_path, run="ddp")  # trains spm.model once, before the ranks start
    port = 29500 + os.getpid() % 1000
    mp.spawn(_ddp_worker, args=(2, str(tmp_path), port), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for name in r0["params"]:  # DDP keeps replicas identical
        torch.testing.assert_close(r0["params"][name], r1["params"][name], atol=0, rtol=0)
    assert not set(r0["indices"]) & set(r1["indices"])  # each rank had its own shard

    single = toy(tmp_path, *SGD_STEP, run="ddp").use_sgd()  # same spm.model, same init
    start = params(single.trainee.model)
    indices = r0["indices"] + r1["indices"]
    rows = single.data.train[indices]
    single.update([collate(rows["src_ids"], rows["tgt_ids"], single.data.tokenizer.special)])
    for name, value in params(single.trainee.model).items():
        torch.testing.assert_close(r0["params"][name], value, atol=2e-6, rtol=1e-5, msg=name)
    assert any(not torch.equal(start[k], r0["params"][k]) for k in start)  # it did update


def test_tensorboard_has_spec_tags_and_run_dir_layout(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    proc = run_train(
        run_dir,
        "logger=tensorboard",
        "trainer.max_steps=10",
        "trainer.eval_every=5",
        "trainer.log_every=5",
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    for tag in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_sec",
        "valid/loss",
        "valid/bleu",
        "valid/chrf",
    ):
        assert tag in tags["scalars"], tag
    assert "valid/cross_attention" in tags["images"]
    assert any("valid/samples" in t for t in tags["tensors"])  # text is stored as tensors
    for name in (
        "checkpoints/last.pt",
        "checkpoints/best.pt",
        "spm.model",
        "train.log",
        ".hydra/config.yaml",
        "results.json",
    ):
        assert (run_dir / name).exists(), name
    assert "best valid BLEU" in proc.stdout
    if on_glibc():  # common.memory
        assert "malloc keeps freed memory" in (run_dir / "train.log").read_text()


def test_fit_sets_the_allocator_only_when_asked(tmp_path, monkeypatch):
    """`common.memory` is process-wide, so `fit()` leaves it alone unless `keep_memory=True`
    (what `train.py` passes: the test above reads its train.log)."""
    calls = []
    monkeypatch.setattr(
        "attnmt.training.loop.keep_freed_memory", lambda: calls.append("kept") or True
    )
    fit(toy_cfg(tmp_path, "trainer.max_steps=1", "trainer.device=cpu"), tmp_path / "a")
    assert calls == []
    fit(
        toy_cfg(tmp_path, "trainer.max_steps=1", "trainer.device=cpu"),
        tmp_path / "b",
        keep_memory=True,
    )
    assert calls == ["kept"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.device=cuda"], "no CUDA GPU"),
        (["data.dir=/nonexistent/corpus"], "/nonexistent/corpus"),
        (["data.valid_split=nosuchsplit"], "nosuchsplit"),
        (["trainer.max_minutes=-1"], "trainer.max_minutes=-1 must be >= 0"),
    ],
)
def test_user_errors_are_one_line_without_traceback(tmp_path, overrides, message):
    if "cuda" in overrides[0] and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_train(tmp_path / "run", *overrides, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-1000:]


@pytest.mark.slow
def test_multirun_sweep(tmp_path):
    base = train_cmd(tmp_path / "unused")
    base.remove(f"hydra.run.dir={tmp_path / 'unused'}")
    cmd = [
        base[0],
        base[1],
        "-m",
        *base[2:],
        "optim.lr=1e-3,2e-3",
        "trainer.max_steps=4",
        "trainer.eval_every=4",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "sweep" / "0" / "results.json").exists()
    assert (tmp_path / "sweep" / "1" / "results.json").exists()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cpu(tmp_path, precision):
    fit(
        toy_cfg(
            tmp_path,
            f"trainer.precision={precision}",
            "trainer.max_steps=6",
            "trainer.eval_every=6",
        ),
        tmp_path / "run",
    )
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert ckpt["train_state"]["step"] == 6
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())


def test_nonfinite_update_is_skipped_on_the_device_and_counted(tmp_path):
    """A NaN weight makes the loss NaN: the fused Adam step leaves the weights, moments and
    step counters as they were, and the window counts the skip and the streak."""
    run = toy(tmp_path, "trainer.max_nonfinite=2")
    rows = run.data.train[list(range(4))]
    batch = collate(rows["src_ids"], rows["tgt_ids"], run.data.tokenizer.special)
    model, optimizer = run.trainee.model, run.trainee.optimizer
    run.update([batch])  # a good update first: Adam has moments and step counters
    with torch.no_grad():
        model.encoder.layers[0].feed_forward.linear1.weight[0, 0] = float("nan")
    before = params(model)
    moments = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    window = _Window(run.ctx.device)
    assert run.update([batch], window) != run.update([batch], window)  # NaN twice
    for name, value in params(model).items():
        torch.testing.assert_close(value, before[name], equal_nan=True, atol=0, rtol=0)
    for p, saved in optimizer.state.items():
        for key, value in saved.items():
            torch.testing.assert_close(value, moments[id(p)][key], atol=0, rtol=0)
    assert [float(window.skipped), float(window.streak), float(window.max_streak)] == [2, 2, 2]
    assert float(window.applied_tokens) == 0 and float(window.loss) == 0  # nothing logged as NaN


def test_early_stopping_on_bleu_patience(tmp_path):
    # lr 0: BLEU can never improve after the first validation, so patience 1 stops at the second.
    fit(
        toy_cfg(
            tmp_path,
            "optim.lr=0.0",
            "trainer.patience=1",
            "trainer.eval_every=2",
            "trainer.max_steps=50",
        ),
        tmp_path / "run",
    )
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["steps"] == 4 and results["best_step"] == 2
    assert results["stopped_by"] == "patience"


def test_results_json_names_the_epoch_limit_that_stopped_the_run(tmp_path):
    """`stopped_by` in results.json: max_epochs here (max_steps, patience and max_minutes in
    their own tests)."""
    fit(toy_cfg(tmp_path, "trainer.max_epochs=1", "trainer.max_steps=0"), tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["epochs"] == 1 and results["stopped_by"] == "max_epochs"


def test_documented_debug_command_runs(tmp_path):
    """conf/debug/fast.yaml's own example, as written there (plus a private run dir/cache)."""
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "debug=fast",
            "data.dir=tests/fixtures/toy",
            f"hydra.run.dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "test test: BLEU" in proc.stdout


def test_precision_auto_through_the_command_line(tmp_path):
    """`train.py trainer.precision=auto` trains in what this CPU does natively and says so."""
    proc = run_train(tmp_path / "run", "trainer.precision=auto", "trainer.max_steps=4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = "bf16" if runtime.native_bf16(torch.device("cpu")) else "fp32"
    assert f"trainer.precision=auto: {expected} on cpu" in proc.stdout + proc.stderr


@pytest.mark.parametrize("native", [False, True])
def test_bf16_asked_on_a_cpu_without_it_warns_once(tmp_path, monkeypatch, caplog, native):
    """`trainer.precision=bf16` where bf16 matmuls are emulated (tens of times slower than fp32
    on a CPU without AVX512-BF16 or AMX) trains, but says so and names the fix; not where it is
    native."""
    monkeypatch.setattr(runtime, "native_bf16", lambda device: native)
    with caplog.at_level("WARNING", logger="attnmt.training.loop"):
        fit(toy_cfg(tmp_path, "trainer.precision=bf16", "trainer.max_steps=1"), tmp_path / "run")
    warned = [r.getMessage() for r in caplog.records if "without native bf16" in r.getMessage()]
    assert len(warned) == (0 if native else 1), warned
    assert all("trainer.precision=auto" in w for w in warned)


def test_the_tokens_of_an_update_are_stated(tmp_path, caplog):
    """results.json and the log state the update's token budget (processes x max tokens x
    accumulation); the log also gives the real tokens of the first update, within it."""
    cfg = toy_cfg(tmp_path, "trainer.max_steps=2", "trainer.eval_every=2", "trainer.update_freq=3")
    with caplog.at_level("INFO", logger="attnmt.training.loop"):
        fit(cfg, tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["tokens_per_update"] == 1 * 512 * 3  # debug=fast: max_tokens 512
    lines = [r.getMessage() for r in caplog.records]
    budget = "tokens per update: 1 processes x 512 max tokens x 3 accumulation = 1536"
    assert any(line.startswith(budget) for line in lines), lines
    first = next(line for line in lines if line.startswith("first update done (step 1): "))
    src, tgt = (int(word) for word in first.split(": ")[1].split() if word.isdigit())
    assert 0 < src <= 1536 and 0 < tgt <= 1536, first
