"""The SLURM job script users copy (`scripts/slurm/train.sbatch`), submitted with `sbatch` to a
one-node SLURM cluster on this machine (`scripts/slurm/local_cluster.sh`), with `torchrun`
inside, on the toy corpus.

- The time limit: a one-minute limit with `--signal=B:USR1@15` makes SLURM signal the script
  while it trains; the script stops the training (which saves `last.pt` at that update), the job
  is requeued under its own id, and its next start resumes from that step, as many times as the
  training needs; the result equals an uninterrupted run's.
- Preemption by a job in a higher-priority partition (PreemptMode=REQUEUE): SLURM sends SIGTERM
  to the job's steps, the training saves, the script requeues the job, which resumes there.
- `scancel --signal=TERM`: the training saves and the job ends; submitted again with the same
  run dir, it resumes there.

SLURM holds a requeued job for about two minutes (Reason=BeginTime); the test lets it start
2 s after the requeue with `scontrol update JobId=... StartTime=now`, as an administrator can.
It needs root (it starts munged, slurmctld and slurmd; local_cluster.sh installs them with
apt-get if missing) and skips with the script's reason elsewhere. Marked slow: a few minutes. One fast test keeps
the copy of the script in docs/training.md equal to the file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnmt.checkpoint import load_checkpoint
from tests.train_helpers import ROOT, TOY_ARGS

DOCS = ROOT / "docs" / "training.md"
CLUSTER = ROOT / "scripts" / "slurm" / "local_cluster.sh"
SBATCH = ROOT / "scripts" / "slurm" / "train.sbatch"
# One thread per process (bit-exact comparisons need the same reduction order); no validation
# before the end, so every checkpoint before it comes from a stop.
ARGS = (*TOY_ARGS, "trainer.num_threads=1", "trainer.eval_every=1000000", "trainer.log_every=500")
# The time limit and the signal's lead. SLURM checks time limits every 30 s, so USR1 comes 15 to
# 45 s after the start: after torchrun and train.py are up (about 6 s here).
TIME_LIMIT, LEAD = "1", 15
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE"}
# The step count: about as many updates as this machine makes in 45 s (measured first), so the
# first start is still training when USR1 comes (at 45 s at the latest).
TRAIN_SECONDS = 45


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A started one-node cluster; yields the environment its clients need."""
    if sys.platform != "linux":
        pytest.skip("the local SLURM cluster needs Linux")
    state = tmp_path_factory.mktemp("slurm")
    start = subprocess.run(
        [str(CLUSTER), "start", str(state)], capture_output=True, text=True, timeout=600
    )
    if start.returncode == 77:
        pytest.skip(start.stderr.strip())
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        # torchrun from the environment that runs the tests: sbatch passes PATH to the job.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        yield env
    finally:
        subprocess.run([str(CLUSTER), "stop", str(state)], timeout=120)


def _scontrol(env: dict, *args: str) -> str:
    proc = subprocess.run(["scontrol", *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _job(env: dict, job: str) -> dict[str, str]:
    """`scontrol show job` as a dict (JobState, Reason, Restarts, ...)."""
    return dict(re.findall(r"(\w+)=(\S*)", _scontrol(env, "show", "job", "-o", job)))


def _submit(env: dict, tmp: Path, run: Path, *options: str, steps: int) -> str:
    """`sbatch train.sbatch` as a user would, from the repository root; returns the job id."""
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--gpus-per-node=0",
            f"--output={tmp}/slurm-%j.out",
            *options,
            str(SBATCH),
            *ARGS,
            f"data.cache_dir={tmp / 'cache'}",
            f"trainer.max_steps={steps}",
        ],
        cwd=ROOT,
        env={**env, "RUN": str(run), "NPROC": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _wait_done(env: dict, job: str, out: Path, timeout: float = 420) -> dict[str, str]:
    """Wait until the job has ended. A requeued job waiting for its BeginTime (SLURM holds it
    for about two minutes) starts 2 s after its requeue instead: one started in the second of
    its requeue fails ("Job credential revoked"). Returns its last `scontrol show job`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = _job(env, job)
        if info["JobState"] == "PENDING" and info["Reason"] == "BeginTime":
            requeued = time.mktime(time.strptime(info["SubmitTime"], "%Y-%m-%dT%H:%M:%S"))
            if time.time() >= requeued + 2:
                _scontrol(env, "update", f"JobId={job}", "StartTime=now")
        elif info["JobState"] in ENDED:
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {job} did not end in {timeout} s:\n{out.read_text()[-3000:]}")


def _wait_for_training(run: Path, out: Path, line: str = "| loss") -> None:
    log = run / "train.log"
    deadline = time.time() + 180
    while not (log.exists() and line in log.read_text()):
        assert time.time() < deadline, out.read_text()[-3000:] if out.exists() else "no output"
        time.sleep(0.5)


def _steps_per_second(tmp: Path) -> float:
    """Toy updates per second on this machine now (the log's timestamps, steps 500 to 1500)."""
    run = tmp / "calibrate"
    cmd = [sys.executable, str(ROOT / "train.py"), *ARGS, f"data.cache_dir={tmp / 'cache'}"]
    proc = subprocess.run(
        [*cmd, "trainer.max_steps=1500", f"hydra.run.dir={run}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stamps = re.findall(r"\[[\d-]+ (\d+):(\d+):([\d,]+)\]\S* - step (\d+) ", proc.stdout)
    (h0, m0, s0, a), (h1, m1, s1, b) = stamps[0], stamps[-1]
    seconds = [
        int(h) * 3600 + int(m) * 60 + float(s.replace(",", "."))
        for h, m, s in ((h0, m0, s0), (h1, m1, s1))
    ]
    return (int(b) - int(a)) / max(seconds[1] - seconds[0], 1e-3)


def _torchrun(run: Path, tmp: Path, steps: int) -> subprocess.Popen:
    """The same training without SLURM, never interrupted."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            str(ROOT / "train.py"),
            *ARGS,
            f"data.cache_dir={tmp / 'cache'}",
            f"trainer.max_steps={steps}",
            f"hydra.run.dir={run}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _results(run: Path) -> dict:
    results = json.loads((run / "results.json").read_text())
    results.pop("train_seconds")
    return results


@pytest.mark.slow
def test_time_limit_requeues_and_resumes_to_the_uninterrupted_result(slurm, tmp_path):
    steps = max(3000, int(_steps_per_second(tmp_path) * TRAIN_SECONDS))
    reference = _torchrun(tmp_path / "straight", tmp_path, steps)
    run = tmp_path / "run"
    job = _submit(
        slurm, tmp_path, run, f"--time={TIME_LIMIT}", f"--signal=B:USR1@{LEAD}", steps=steps
    )
    out = tmp_path / f"slurm-{job}.out"
    info = _wait_done(slurm, job, out)
    text, log = out.read_text(), (run / "train.log").read_text()
    print(_scontrol(slurm, "show", "job", job))  # the record of the requeues
    assert info["JobState"] == "COMPLETED", text[-3000:]
    restarts = int(info["Restarts"])
    assert restarts >= 1, f"{steps} steps ended before the time limit's signal:\n{text[-3000:]}"

    # Each start (same job id, same run dir) resumed at the step where the one before stopped.
    assert [f"job {job} (restart {n})" in text for n in range(restarts + 1)] == [True] * (
        restarts + 1
    )
    assert text.count(f"job {job}: USR1, stopping the training to requeue") >= restarts
    stops = [int(s) for s in re.findall(r"stopped by SIGTERM at step (\d+);", text)]
    resumes = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+) ", log)]
    assert len(stops) == restarts and resumes == stops, (stops, resumes)
    # ... at an update, not at a validation (the only one is at the end).
    assert re.findall(r"valid step (\d+) ", log) == [str(steps)]

    assert reference.wait(timeout=600) == 0, reference.stdout.read()[-3000:]
    straight = tmp_path / "straight"
    assert _results(run) == _results(straight)
    a = load_checkpoint(run / "checkpoints" / "last.pt")
    b = load_checkpoint(straight / "checkpoints" / "last.pt")
    assert a["train_state"]["step"] == b["train_state"]["step"] == steps
    for name, value in a["model"].items():
        torch.testing.assert_close(b["model"][name], value, atol=0, rtol=0, msg=name)
    print(f"{steps} steps, {restarts} restart(s), stopped at {stops}, resumed at {resumes}")


@pytest.mark.slow
def test_scancel_term_saves_and_a_resubmission_resumes(slurm, tmp_path):
    """`scancel --signal=TERM` (to the job's steps: torchrun) stops the training at an update
    with `last.pt`; the job ends without a requeue, and the same script submitted again with
    the same run dir resumes there and finishes."""
    run = tmp_path / "run"
    job = _submit(slurm, tmp_path, run, "--time=5", steps=10**7)
    out = tmp_path / f"slurm-{job}.out"
    log = run / "train.log"
    _wait_for_training(run, out)
    subprocess.run(["scancel", "--signal=TERM", job], env=slurm, check=True, timeout=60)
    info = _wait_done(slurm, job, out)
    text = out.read_text()
    stops = re.findall(r"stopped by SIGTERM at step (\d+);", text)
    assert len(stops) == 1, text[-3000:]
    stopped = int(stops[0])
    assert load_checkpoint(run / "checkpoints" / "last.pt")["train_state"]["step"] == stopped
    assert info["Restarts"] == "0" and not (run / "results.json").exists()
    assert info["JobState"] == "FAILED"  # torchrun exits 1 after a SIGTERM (documented)
    assert "USR1" not in text

    again = _submit(slurm, tmp_path, run, "--time=5", steps=stopped + 100)
    info = _wait_done(slurm, again, tmp_path / f"slurm-{again}.out")
    assert info["JobState"] == "COMPLETED", (tmp_path / f"slurm-{again}.out").read_text()[-3000:]
    assert f"resumed from {run / 'checkpoints' / 'last.pt'} at step {stopped} " in log.read_text()
    assert json.loads((run / "results.json").read_text())["steps"] == stopped + 100


@pytest.mark.slow
def test_preemption_by_a_higher_priority_job_requeues_and_resumes(slurm, tmp_path):
    """A job in the "urgent" partition takes the node: SLURM sends SIGTERM to the training's
    steps (torchrun), which saves at an update; the script requeues the job (SLURM would only
    at the end of the grace time, killing it), the urgent job runs, and the requeued one
    resumes at that step and finishes."""
    run, steps = tmp_path / "run", 3000
    job = _submit(slurm, tmp_path, run, "--time=10", steps=steps)
    out = tmp_path / f"slurm-{job}.out"
    _wait_for_training(run, out)
    urgent = subprocess.run(
        ["sbatch", "--parsable", "--partition=urgent", "--exclusive", "--output=/dev/null"]
        + ["--wrap=sleep 1"],
        env=slurm,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert urgent.returncode == 0, urgent.stderr
    info = _wait_done(slurm, job, out)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", text[-3000:]
    assert _job(slurm, urgent.stdout.strip())["JobState"] == "COMPLETED"
    assert info["Restarts"] == "1" and f"job {job}: preempted, requeueing" in text, text[-3000:]
    stops = re.findall(r"stopped by SIGTERM at step (\d+);", text)
    assert len(stops) == 1, text[-3000:]
    log = (run / "train.log").read_text()
    assert f"resumed from {run / 'checkpoints' / 'last.pt'} at step {stops[0]} " in log
    assert json.loads((run / "results.json").read_text())["steps"] == steps


def test_the_docs_show_the_job_script_as_it_is():
    """docs/training.md shows train.sbatch whole; the copy there must not drift from it."""
    docs = DOCS.read_text()
    block = re.search(r"The script \(the file itself.*?\n```bash\n(.*?)```", docs, re.S)
    assert block, "docs/training.md: no copy of scripts/slurm/train.sbatch"
    assert block.group(1) == SBATCH.read_text()
