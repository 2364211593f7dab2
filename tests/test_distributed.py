"""Scale-out through the real command line: `train.py` under `torchrun` on gloo (CPU).

Each test launches real processes (torchrun agent + 2 workers) on the toy corpus and checks what
a user sees: exit codes, one run dir, one error line, exact resume after kills, preemption,
elastic restarts, and two launchers acting as two nodes. They take 10-40 s each on 2 cores, so
they are marked slow (CI runs them).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnmt.checkpoint import load_checkpoint
from tests.train_helpers import ROOT, TOY_ARGS, torchrun_cmd

FAULTS = str(ROOT / "tests" / "scripts" / "train_with_faults.py")
pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path = ROOT, env: dict | None = None, timeout: float = 240):
    return subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _tail(proc: subprocess.CompletedProcess) -> str:
    """What a failed run printed: the end of stdout (rank 0's log) and of stderr."""
    return f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _start(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A launcher in its own process group (so a test can kill agent and workers at once)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


def _wait_for_step(ckpt: Path, step: int, proc: subprocess.Popen, timeout: float = 180) -> int:
    """Wait until `ckpt` exists with train_state.step >= `step`; returns that step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"the run ended early with {proc.returncode}"
        if ckpt.exists():
            try:
                found = load_checkpoint(ckpt)["train_state"]["step"]
            except Exception:  # being replaced right now: try again
                found = -1
            if found >= step:
                return found
        time.sleep(0.2)
    raise AssertionError(f"{ckpt} did not reach step {step} in {timeout} s")


def _assert_same_weights(a: Path, b: Path) -> None:
    ca, cb = load_checkpoint(a), load_checkpoint(b)
    assert ca["train_state"]["step"] == cb["train_state"]["step"]
    assert ca["train_state"]["epoch"] == cb["train_state"]["epoch"]
    assert ca["train_state"]["batches_done"] == cb["train_state"]["batches_done"]
    for name, value in ca["model"].items():
        torch.testing.assert_close(cb["model"][name], value, atol=0, rtol=0, msg=name)


def _workers(proc: subprocess.Popen) -> list[int]:
    """PIDs of the launcher's workers (torchrun starts each in a session of its own)."""
    out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def _kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and its workers at once, and wait until all are gone."""
    pids = [proc.pid, *_workers(proc)]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30
    while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids):
        assert time.time() < deadline
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# One thread per process everywhere: torchrun sets OMP_NUM_THREADS=1 only with 2+ processes per
# launcher, and bit-exact comparisons need the same reduction order.
COMMON = ("trainer.eval_every=6", "trainer.log_every=3", "trainer.num_threads=1")


def test_torchrun_end_to_end_one_run_dir(tmp_path):
    """The issue's command: all ranks exit 0; one run dir (torchrun's default, from the
    rendezvous id) with one results.json, train.log, tb/; rank 1 prints no INFO."""
    proc = _run(
        torchrun_cmd(
            2, None, "trainer.max_steps=12", "logger=tensorboard", *COMMON, cache=tmp_path / "cache"
        ),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, _tail(proc)
    run_dirs = list((tmp_path / "outputs").glob("*/*"))
    assert len(run_dirs) == 1 and run_dirs[0].parent.name == "torchrun", run_dirs
    run_dir = run_dirs[0]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == 12 and results["world_size"] == 2
    assert results["tokens_per_update"] == 2 * 512  # 2 processes x max_tokens, no accumulation
    assert (run_dir / "hyp.test.en").read_text().count("\n") == 12
    events = list(tmp_path.rglob("events.out.tfevents.*"))  # scalars + hparams files
    assert events and {e.parent for e in events} == {run_dir / "tb"}
    assert len({e.name.split(".")[4] for e in events}) == 1  # all written by one process
    assert len(list(tmp_path.rglob("train.log"))) == 1
    assert len(list(tmp_path.rglob("results.json"))) == 1
    assert "best valid BLEU" in proc.stdout and proc.stdout.count("results in") == 1
    assert "[rank 1]" not in proc.stdout + proc.stderr  # rank 1 had nothing to warn about
    assert "world size 2" in (run_dir / "train.log").read_text()


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.device=cuda", "no CUDA GPU"),  # every rank, before the process group forms
        ("data.valid_split=nosuchsplit", "nosuchsplit"),
    ],  # rank 0, while rank 1 waits for it
)
def test_torchrun_user_error_is_one_line_and_ends_all_ranks(tmp_path, override, message):
    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    started = time.time()
    proc = _run(torchrun_cmd(2, tmp_path / "run", override), timeout=90)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert errors[0].startswith("train.py: error:")  # not "[rank 1]": rank 0 reported it
    assert message not in proc.stderr.replace(errors[0], "")  # and nobody else repeated it
    assert time.time() - started < 60


def test_torchrun_crash_on_one_rank_ends_every_rank(tmp_path):
    started = time.time()
    proc = _run(
        torchrun_cmd(2, tmp_path / "run", "trainer.max_steps=100000", script=FAULTS),
        env={"FAULT_CRASH_RANK": "1", "FAULT_CRASH_STEP": "3"},
        timeout=120,
    )
    assert proc.returncode != 0
    assert "injected crash on rank 1" in proc.stderr
    assert time.time() - started < 90  # never a hang


def test_slow_data_preparation_does_not_trip_the_collective_timeout(tmp_path):
    """Rank 0 prepares the data for 25 s while rank 1 waits; collectives time out after 8 s."""
    proc = _run(
        torchrun_cmd(
            2,
            tmp_path / "run",
            "trainer.max_steps=6",
            "trainer.eval_every=6",
            "trainer.dist_timeout=8",
            script=FAULTS,
        ),
        env={"FAULT_SLOW_PREP": "25"},
    )
    assert proc.returncode == 0, _tail(proc)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["steps"] == 6


def test_two_process_kill_and_resume_equals_uninterrupted(tmp_path):
    """SIGKILL to agent and workers after the first checkpoint, then the same command again:
    bit-identical to a run that never stopped (per-rank data position and dropout RNG)."""
    run_dir = tmp_path / "killed"
    proc = _start(
        torchrun_cmd(2, run_dir, "trainer.max_steps=100000", *COMMON), tmp_path / "killed.log"
    )
    _wait_for_step(run_dir / "checkpoints" / "last.pt", 6, proc)
    _kill_all(proc)
    killed_at = load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]["step"]
    total = killed_at + 6
    resumed = _run(torchrun_cmd(2, run_dir, f"trainer.max_steps={total}", *COMMON))
    assert resumed.returncode == 0, _tail(resumed)
    assert f"at step {killed_at}" in (run_dir / "train.log").read_text()
    straight = _run(torchrun_cmd(2, tmp_path / "straight", f"trainer.max_steps={total}", *COMMON))
    assert straight.returncode == 0, _tail(straight)
    _assert_same_weights(
        tmp_path / "straight" / "checkpoints" / "last.pt", run_dir / "checkpoints" / "last.pt"
    )


def test_workers_stop_when_the_launcher_dies(tmp_path):
    """torchrun starts each worker in a session of its own, so a SIGKILLed launcher (OOM
    killer, lost node) would leave its workers training on; they notice and exit."""
    run_dir = tmp_path / "run"
    proc = _start(
        torchrun_cmd(2, run_dir, "trainer.max_steps=100000", *COMMON), tmp_path / "run.log"
    )
    _wait_for_step(run_dir / "checkpoints" / "last.pt", 6, proc)
    workers = _workers(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 60
    while any(_state(pid) != "Z" for pid in workers):
        assert time.time() < deadline, "orphaned workers kept running"
        time.sleep(0.2)


def test_sigterm_preemption_saves_exact_position_and_resumes(tmp_path):
    """SIGTERM to torchrun (what SLURM and Kubernetes send): the workers finish the update,
    save last.pt at that step (not at a validation) and exit 0; the rerun resumes there and
    ends equal to an uninterrupted run."""
    run_dir = tmp_path / "run"
    args = ("trainer.eval_every=1000", "trainer.log_every=1")
    proc = _start(
        torchrun_cmd(2, run_dir, "trainer.max_steps=100000", *args), tmp_path / "first.log"
    )
    train_log = run_dir / "train.log"
    deadline = time.time() + 120
    while not (train_log.exists() and "| loss" in train_log.read_text()):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)  # the agent forwards it to the workers
    proc.wait(timeout=60)
    out = (tmp_path / "first.log").read_text()
    stopped = load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]["step"]
    assert "stopped by SIGTERM at step" in out, out[-3000:]
    assert f"stopped by SIGTERM at step {stopped};" in out
    assert "ChildFailedError" not in out  # the workers exited 0; torchrun itself re-raises
    assert proc.returncode != 0 and "SignalException" in out  # the signal it got (documented)
    assert not (run_dir / "checkpoints" / "best.pt").exists()  # saved without a validation
    assert not (run_dir / "results.json").exists()

    total = stopped + 4
    resumed = _run(torchrun_cmd(2, run_dir, f"trainer.max_steps={total}", *args))
    assert resumed.returncode == 0, _tail(resumed)
    assert f"at step {stopped} " in train_log.read_text()
    straight = _run(torchrun_cmd(2, tmp_path / "straight", f"trainer.max_steps={total}", *args))
    assert straight.returncode == 0, _tail(straight)
    _assert_same_weights(
        tmp_path / "straight" / "checkpoints" / "last.pt", run_dir / "checkpoints" / "last.pt"
    )


# train.py where only rank 1 can find the time budget spent (rank 0's check always says no) and
# each rank writes the step at which it tests to $STEPS_DIR/rank<R>.
ONE_RANK_OUT_OF_TIME = f"""
import os, runpy, sys
from pathlib import Path
from attnmt.training import loop
from attnmt.training.run import Run

RANK = os.environ["RANK"]
if RANK == "0":
    loop._out_of_time = lambda trainer, wall_seconds: False
real_test = Run.test

def test(self, *args):
    Path(os.environ["STEPS_DIR"], "rank" + RANK).write_text(str(self.trainee.state.step))
    return real_test(self, *args)

Run.test = test
sys.argv[0] = {str(ROOT / "train.py")!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_time_budget_spent_on_one_rank_stops_every_rank_after_the_same_update(tmp_path):
    """`trainer.max_minutes` under torchrun: the ranks agree on it in the window's collective,
    so one rank's spent budget (here rank 1's alone) ends every rank's loop after the same
    update, and all validate, save and test that step together (no hang, exit 0)."""
    wrapper = tmp_path / "one_rank_out_of_time.py"
    wrapper.write_text(ONE_RANK_OUT_OF_TIME)
    run_dir = tmp_path / "run"
    budget = ("trainer.max_minutes=0.002", "trainer.max_steps=3000", "trainer.dist_timeout=20")
    proc = _run(
        torchrun_cmd(2, run_dir, *budget, *COMMON, script=str(wrapper)),
        env={"STEPS_DIR": str(tmp_path)},
        timeout=180,
    )
    assert proc.returncode == 0, _tail(proc)
    steps = [int((tmp_path / f"rank{rank}").read_text()) for rank in (0, 1)]
    assert steps[0] == steps[1] and 0 < steps[0] < 3000 and steps[0] % 3 == 0, steps
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == steps[0] and results["test"]["test"]["bleu"] >= 0
    assert results["stopped_by"] == "max_minutes"  # rank 0 too, from the agreed reading
    assert f"time budget: 0.002 minutes reached at step {steps[0]} " in proc.stdout
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["train_state"]["step"] == steps[0]


def test_elastic_restart_after_a_killed_worker_completes(tmp_path):
    run_dir = tmp_path / "run"
    cmd = torchrun_cmd(
        2,
        None,
        "trainer.max_steps=24",
        *COMMON,
        cache=tmp_path / "cache",
        launcher=("--standalone", "--max-restarts=1"),
    )
    with open(tmp_path / "elastic.log", "w") as out:  # cwd tmp_path: the default run dir
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.time() + 120
    while not list(tmp_path.glob("outputs/torchrun/*/checkpoints/last.pt")):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    run_dir = next(tmp_path.glob("outputs/torchrun/*"))
    _wait_for_step(run_dir / "checkpoints" / "last.pt", 6, proc)
    os.kill(_workers(proc)[-1], signal.SIGKILL)
    assert proc.wait(timeout=240) == 0, (tmp_path / "elastic.log").read_text()[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "resumed from" in log
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 24
    assert len(list(tmp_path.glob("outputs/torchrun/*"))) == 1  # the restart found its run dir


def _two_nodes(run_dirs: tuple[Path, Path], tmp_path: Path, *overrides: str):
    """Two torchrun launchers of one process each, as two nodes, rendezvous on 127.0.0.1."""
    port = _free_port()
    launcher = (
        "--nnodes=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=test{port}",
    )
    procs = [
        _start(torchrun_cmd(1, run_dir, *overrides, launcher=launcher), tmp_path / f"node{i}.log")
        for i, run_dir in enumerate(run_dirs)
    ]
    codes = [p.wait(timeout=300) for p in procs]
    logs = [(tmp_path / f"node{i}.log").read_text() for i in range(2)]
    return codes, logs


def test_two_launchers_as_two_nodes_equal_one_launcher(tmp_path):
    shared = tmp_path / "multi"
    codes, logs = _two_nodes((shared, shared), tmp_path, "trainer.max_steps=12", *COMMON)
    assert codes == [0, 0], "\n".join(log[-2000:] for log in logs)
    single = _run(torchrun_cmd(2, tmp_path / "single", "trainer.max_steps=12", *COMMON))
    assert single.returncode == 0, _tail(single)
    _assert_same_weights(
        tmp_path / "single" / "checkpoints" / "last.pt", shared / "checkpoints" / "last.pt"
    )


def test_two_nodes_without_a_shared_run_dir_fail_clearly(tmp_path):
    codes, logs = _two_nodes((tmp_path / "a", tmp_path / "b"), tmp_path, "trainer.max_steps=6")
    assert all(code != 0 for code in codes)
    text = "\n".join(logs)
    assert "cannot see rank 0's run dir" in text and "hydra.run.dir" in text, text[-3000:]


LEAK_PROBE = """
import gc, os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(4, 4))
model(torch.ones(2, 4)).sum().backward()
del model
gc.collect()
dist.destroy_process_group()
gc.collect()
threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print("gloo threads after destroy:", sum(name.startswith(("pt_gloo", "gloo")) for name in threads))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_ddp_leaks_its_process_group(tmp_path):
    """Why train.py ends torchrun workers with os._exit (train.py::_end_worker): after DDP,
    `destroy_process_group` leaves the gloo threads running (torch 2.13). When this fails,
    torch has fixed it and the workaround can go."""
    probe = tmp_path / "probe.py"
    probe.write_text(LEAK_PROBE)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = _run([*cmd, str(probe)])
    assert proc.returncode == 0, _tail(proc)
    counts = [int(line.rsplit(" ", 1)[1]) for line in proc.stdout.splitlines() if "gloo" in line]
    assert len(counts) == 2 and min(counts) > 0, proc.stdout


def _two_homes(tmp_path: Path, name: str, *overrides: str, shared_cache: bool = True):
    """Two launchers of one process each as two nodes, each with a HOME of its own, so the
    default data cache (~/.cache/attnmt) is node-local; `shared_cache`: `data.cache_dir` on
    storage both see instead. Returns (exit code, output, HOME) per launcher, rank 0's first
    (the c10d rendezvous picks which launcher that is; only rank 0 logs INFO lines)."""
    port, run_dir = _free_port(), tmp_path / name
    launcher = (
        "--nnodes=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={name}{port}",
    )
    cmd = torchrun_cmd(1, run_dir, *overrides, cache=tmp_path / "shared_cache", launcher=launcher)
    if not shared_cache:
        cmd = [a for a in cmd if not a.startswith("data.cache_dir=")]
    nodes = []
    for i in range(2):
        home, log = tmp_path / f"{name}_home{i}", tmp_path / f"{name}{i}.log"
        home.mkdir()
        nodes.append((_start(cmd, log, {"HOME": str(home), "ATTNMT_CACHE": ""}), log, home))
    done = [(proc.wait(timeout=300), log.read_text(), home) for proc, log, home in nodes]
    return sorted(done, key=lambda node: "world size 2" not in node[1])


ENCODING = "encoding: 100%"  # the progress line of a split being encoded (not of a cache read)


def test_two_nodes_with_the_data_cache_on_shared_storage_encode_the_corpus_once(tmp_path):
    """The multi-node setup of docs/training.md: `data.cache_dir` on shared storage. Rank 0
    encodes the corpus, the other node's rank reads its caches and encodes nothing, and no
    node writes into its own HOME. With the default node-local cache, each node encodes the
    corpus again (the trap the docs warn about)."""
    overrides = ("trainer.max_steps=2", "trainer.eval_every=2", *COMMON[2:])
    nodes = _two_homes(tmp_path, "shared", *overrides)
    assert [code for code, _, _ in nodes] == [0, 0], "\n".join(out[-2000:] for _, out, _ in nodes)
    (_, rank0, home0), (_, rank1, home1) = nodes
    print(
        "rank 0:", *[x for x in rank0.splitlines() if "encoding" in x or "caching" in x], sep="\n"
    )
    print("rank 1:", *[x for x in rank1.splitlines() if "encoding" in x], sep="\n")
    encoded = list((tmp_path / "shared_cache" / "encoded").glob("*.arrow"))
    assert rank0.count(ENCODING) == len(encoded) >= 2  # each split once (train, valid)
    assert ENCODING not in rank1, rank1[-3000:]
    assert "world size 2" in rank0 and "world size 2" not in rank1  # rank 1 logs warnings only
    assert not (home0 / ".cache").exists() and not (home1 / ".cache").exists()

    nodes = _two_homes(tmp_path, "local", *overrides, shared_cache=False)
    assert [code for code, _, _ in nodes] == [0, 0], "\n".join(out[-2000:] for _, out, _ in nodes)
    for _, out, home in nodes:  # each node encoded everything into its own HOME
        assert out.count(ENCODING) == len(encoded), out[-3000:]
        assert len(list((home / ".cache" / "attnmt" / "encoded").glob("*.arrow"))) == len(encoded)


def test_data_prepared_once_on_shared_storage_is_encoded_by_no_rank(tmp_path):
    """The docs' recipe: `scripts/prepare_data.py` once with `data.cache_dir` on shared
    storage, then the training on two nodes with the same settings: no rank encodes."""
    prepare = [sys.executable, str(ROOT / "scripts" / "prepare_data.py"), *TOY_ARGS]
    prepared = _run([*prepare, f"data.cache_dir={tmp_path / 'shared_cache'}"])
    assert prepared.returncode == 0, _tail(prepared)
    assert ENCODING in prepared.stdout + prepared.stderr
    nodes = _two_homes(tmp_path, "run", "trainer.max_steps=2", "trainer.eval_every=2")
    assert [code for code, _, _ in nodes] == [0, 0], "\n".join(out[-2000:] for _, out, _ in nodes)
    for _, out, home in nodes:
        assert "encoding" not in out and not (home / ".cache").exists(), out[-3000:]
