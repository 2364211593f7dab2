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
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
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


def _cluster(state: Path, nodes: int) -> Iterator[dict[str, str]]:
    """A started cluster of `nodes` nodes on this machine; yields the environment its clients
    need, and stops it."""
    if sys.platform != "linux":
        pytest.skip("the local SLURM cluster needs Linux")
    start = subprocess.run(
        [str(CLUSTER), "start", str(state)],
        env={**os.environ, "NODES": str(nodes)},
        capture_output=True,
        text=True,
        timeout=600,
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


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A started one-node cluster."""
    yield from _cluster(tmp_path_factory.mktemp("slurm"), 1)


@pytest.fixture
def slurm_two_nodes(tmp_path_factory):
    """A started cluster of two nodes (two slurmd on this machine), for one test."""
    yield from _cluster(tmp_path_factory.mktemp("slurm2"), 2)


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
    results.pop("wall_seconds")
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
    # A start whose USR1 comes before train.py is up (a loaded machine: SLURM checks the limit
    # every 30 s) ends without a save or a resume line; the next one resumes where the last
    # save was. So every stop is resumed from, in order, and no start is lost.
    assert 1 <= len(stops) <= restarts and resumes == stops, (restarts, stops, resumes)
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


@pytest.mark.slow
def test_two_nodes_train_as_one_job_stop_on_scancel_and_resume(slurm_two_nodes, tmp_path):
    """`sbatch --nodes=2`: one torchrun on each node (two slurmd on this machine), meeting at
    the first node's address; one run of world size 2. `scancel --signal=TERM` reaches both
    nodes' workers, which stop at one update with `last.pt`; the same job submitted again
    resumes there on two nodes and finishes."""
    env, run = slurm_two_nodes, tmp_path / "run"
    job = _submit(env, tmp_path, run, "--nodes=2", "--time=5", steps=10**7)
    out = tmp_path / f"slurm-{job}.out"
    _wait_for_training(run, out)
    subprocess.run(["scancel", "--signal=TERM", job], env=env, check=True, timeout=60)
    info = _wait_done(env, job, out)
    text = out.read_text()
    print(text[:400])
    assert info["NumNodes"] == "2" and info["NodeList"] == "node[1-2]", info
    assert f"job {job}: 2 nodes (node[1-2]), rendezvous at 127.0.0.1:" in text
    state = Path(env["SLURM_CONF"]).parent
    for node in ("node1", "node2"):  # each node's slurmd started the job's step: a torchrun
        assert f"launch task StepId={job}.0 " in (state / f"slurmd.{node}.log").read_text()
    log = (run / "train.log").read_text()
    assert "world size 2" in log  # NPROC=1: the two nodes' processes are one run
    stops = re.findall(r"stopped by SIGTERM at step (\d+);", text)
    assert len(stops) == 1, text[-3000:]  # rank 0's line; every rank stops at that update
    stopped = int(stops[0])
    assert load_checkpoint(run / "checkpoints" / "last.pt")["train_state"]["step"] == stopped

    again = _submit(env, tmp_path, run, "--nodes=2", "--time=5", steps=stopped + 60)
    info = _wait_done(env, again, tmp_path / f"slurm-{again}.out")
    assert info["JobState"] == "COMPLETED", (tmp_path / f"slurm-{again}.out").read_text()[-3000:]
    log = (run / "train.log").read_text()
    assert f"resumed from {run / 'checkpoints' / 'last.pt'} at step {stopped} " in log
    assert log.count("world size 2") == 2
    assert json.loads((run / "results.json").read_text())["steps"] == stopped + 60


def test_the_docs_show_the_job_script_as_it_is():
    """docs/training.md shows train.sbatch whole; the copy there must not drift from it."""
    docs = DOCS.read_text()
    block = re.search(r"The script \(the file itself.*?\n```bash\n(.*?)```", docs, re.S)
    assert block, "docs/training.md: no copy of scripts/slurm/train.sbatch"
    assert block.group(1) == SBATCH.read_text()


# ----------------------------------------------------------------------------- the launch logic
# train.sbatch run by bash with the environment SLURM gives a batch script, and with `srun`,
# `scontrol`, `scancel` and `torchrun` replaced by stubs that record their command lines (one
# JSON list a line in CALLS). `srun` runs its command; `torchrun` waits for SIGTERM (then exits
# 1, as torchrun does) unless STUB_EXIT says to exit at once with that status; `scontrol show
# job` shows STUB_PREEMPT_TIME; `scancel --signal=TERM` sends SIGTERM to the torchrun stub.
STUB = """#!{python}
import json, os, signal, sys, time
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
calls, pidfile = os.environ["CALLS"], os.environ["CALLS"] + ".torchrun.pid"
with open(calls, "a") as f:
    f.write(json.dumps([name, *args]) + "\\n")
if name == "srun":
    open(pidfile, "w").write(str(os.getpid()))  # the pid of the torchrun it becomes
    command = [a for a in args if not a.startswith("-")]
    os.execvp(command[0], args[args.index(command[0]):])
if name == "torchrun":
    if os.environ.get("STUB_EXIT"):
        sys.exit(int(os.environ["STUB_EXIT"]))
    open(pidfile, "w").write(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    while True:
        time.sleep(0.05)
if name == "scancel" and "--signal=TERM" in args:
    while not os.path.exists(pidfile):
        time.sleep(0.05)
    os.kill(int(open(pidfile).read()), signal.SIGTERM)
if name == "scontrol" and args[:2] == ["show", "hostnames"]:
    print("\\n".join(os.environ["STUB_HOSTS"].split()))
if name == "scontrol" and args[:2] == ["show", "node"]:
    print(f"NodeName={{args[2]}} Arch=x86_64\\n   NodeAddr={{os.environ['STUB_ADDR']}} NodeHostName={{args[2]}}")
if name == "scontrol" and args[:2] == ["show", "job"]:
    print(f"JobId={{os.environ['SLURM_JOB_ID']}} JobState=RUNNING\\n   PreemptTime={{os.environ.get('STUB_PREEMPT_TIME', 'None')}}")
"""


def _stub_env(tmp: Path, nodes: int, job: str = "4242", **extra: str) -> dict[str, str]:
    """What SLURM sets for a batch script on `nodes` nodes (node1..nodeN, 8 GPUs each, first
    node reached at 10.1.2.3), with the stubs first on PATH."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("srun", "scontrol", "scancel", "torchrun"):
        (bin_dir / name).write_text(STUB.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    hosts = [f"node{i + 1}" for i in range(nodes)]
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "CALLS": str(tmp / "calls.jsonl"),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NAME": "attnmt",
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_JOB_NODELIST": "node1" if nodes == 1 else f"node[1-{nodes}]",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_CPUS_ON_NODE": "96",
        "STUB_HOSTS": " ".join(hosts),
        "STUB_ADDR": "10.1.2.3",
        "RUN": str(tmp / "run"),
        **extra,
    }


def _calls(env: dict) -> list[list[str]]:
    path = Path(env["CALLS"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _script(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(SBATCH), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _launch(env: dict, *args: str) -> tuple[list[str], list[str], str]:
    """Run the script to its end (torchrun exits 0 at once): the srun and torchrun command
    lines, and what the script printed."""
    proc = _script({**env, "STUB_EXIT": "0"}, *args)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    calls = _calls(env)
    (srun,) = [c for c in calls if c[0] == "srun"]
    (torchrun,) = [c for c in calls if c[0] == "torchrun"]
    return srun, torchrun, out


def test_one_node_launches_one_standalone_torchrun_with_a_process_per_gpu(tmp_path):
    srun, torchrun, _ = _launch(_stub_env(tmp_path, 1), "experiment=wmt14_en_de")
    assert srun[1:4] == ["--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=96"]
    assert torchrun[1:] == [
        "--nnodes=1",
        "--nproc_per_node=8",
        "--shutdown-timeout=180",  # the --signal line's lead: torchrun's default is 30 s
        "--standalone",
        "train.py",
        "experiment=wmt14_en_de",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]


def test_two_nodes_launch_one_torchrun_per_node_meeting_on_the_first_node(tmp_path):
    env = _stub_env(tmp_path, 2, job="4242")
    srun, torchrun, out = _launch(env, "experiment=wmt14_en_de", "trainer.max_tokens=1563")
    # One task per node: srun starts a torchrun on each of the 2 nodes, with all their CPUs.
    assert srun[1:4] == ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=96"]
    port = 29500 + 4242 % 2000
    assert torchrun[1:] == [
        "--nnodes=2",
        "--nproc_per_node=8",
        "--shutdown-timeout=180",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=10.1.2.3:{port}",  # node1's NodeAddr
        "--rdzv_id=4242",
        "train.py",
        "experiment=wmt14_en_de",
        "trainer.max_tokens=1563",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    assert ["scontrol", "show", "hostnames", "node[1-2]"] in _calls(env)
    assert ["scontrol", "show", "node", "node1"] in _calls(env)
    assert f"2 nodes (node[1-2]), rendezvous at 10.1.2.3:{port}" in out
    # RDZV_PORT and NPROC from the environment; a node without a NodeAddr: its host name.
    Path(env["CALLS"]).unlink()
    env.update(RDZV_PORT="31000", NPROC="4", STUB_ADDR="", LEAD="600")
    _, torchrun, _ = _launch(env)
    assert "--rdzv_endpoint=node1:31000" in torchrun and "--nproc_per_node=4" in torchrun
    assert "--shutdown-timeout=600" in torchrun
    assert torchrun[-2:] == ["experiment=wmt14_en_de", f"hydra.run.dir={tmp_path / 'run'}"]


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_time_limits_signal_stops_the_steps_and_requeues(tmp_path, nodes):
    """USR1 (the time limit is near): SIGTERM to the job's steps on every node through
    `scancel`, then `scontrol requeue`; the script exits 0."""
    env = _stub_env(tmp_path, nodes)
    proc = _script(env)
    pidfile = Path(env["CALLS"] + ".torchrun.pid")
    deadline = time.time() + 30
    while not pidfile.exists():
        assert time.time() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    ran = [c for c in _calls(env) if c[0] in ("scancel", "scontrol") and c[1] != "show"]
    assert ran == [["scancel", "--signal=TERM", "4242"], ["scontrol", "requeue", "4242"]]
    assert "job 4242: USR1, stopping the training to requeue" in out


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize(
    "preempted, finished, requeued",
    [(True, False, True), (False, False, False), (True, True, False)],
)
def test_a_preempted_job_requeues_itself_unless_it_finished(
    tmp_path, nodes, preempted, finished, requeued
):
    """torchrun ended (its workers saved on SLURM's SIGTERM): the script requeues the job when
    `scontrol show job` shows a PreemptTime and results.json is missing, and passes on
    torchrun's exit status."""
    env = _stub_env(tmp_path, nodes, STUB_EXIT="1")
    if preempted:
        env["STUB_PREEMPT_TIME"] = "2026-01-01T00:00:00"
    if finished:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "results.json").write_text("{}")
    proc = _script(env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert (["scontrol", "requeue", "4242"] in _calls(env)) == requeued
    assert ("job 4242: preempted, requeueing" in out) == requeued


# `train.py` whose stop (the save at a stop request) first waits `seconds`, as a save of a
# large model to slow shared storage can; run from another directory, on this tree's code
# (PYTHONPATH).
SLOW_STOP = """import time
from attnmt.training import run
stop = run.Run.stop
def slow_stop(self, reason):
    time.sleep({seconds})
    stop(self, reason)
run.Run.stop = slow_stop
from attnmt.cli.train import cli
cli()
"""


@pytest.mark.slow
def test_a_stop_slower_than_torchruns_default_shutdown_timeout_completes(tmp_path):
    """USR1 with a stop that takes 40 s (torchrun's own default would SIGKILL its workers
    30 s after its SIGTERM): the real torchrun waits the job script's lead, the worker saves
    `last.pt` at the update it stopped after, and the job requeues."""
    env = _stub_env(tmp_path, 1, NPROC="1", LEAD="90")
    (tmp_path / "bin" / "torchrun").unlink()  # the real one, beside this Python
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
    env["PATH"] += os.environ["PATH"]
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(SLOW_STOP.format(seconds=40))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    args = (*ARGS, "trainer.log_every=1", "trainer.max_steps=1000000")
    output = tmp_path / "slurm.out"  # a file, not a pipe: nothing waits on a reader
    with output.open("w") as out_file:
        cmd = ["bash", str(SBATCH), *args, f"data.cache_dir={tmp_path / 'cache'}"]
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=out_file, stderr=subprocess.STDOUT)
    log = tmp_path / "run" / "train.log"
    deadline = time.time() + 180
    while not (log.exists() and "first update done" in log.read_text()):
        assert time.time() < deadline and proc.poll() is None, output.read_text()[-3000:]
        time.sleep(0.5)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    proc.wait(timeout=240)
    out = output.read_text()
    print(f"USR1 to the end of the job: {time.monotonic() - signalled:.1f} s")
    assert proc.returncode == 0, out[-3000:]
    assert ["scontrol", "requeue", "4242"] in _calls(env), out
    text = log.read_text()
    stopped = re.search(r"stopped by SIGTERM after step (\d+); checkpoints/last.pt saved", text)
    assert stopped, text[-2000:]
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert last["train_state"]["step"] == int(stopped.group(1))
