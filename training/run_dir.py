"""The run dir: where it is under torchrun, and one live run per run dir (a lock).

Under torchrun every rank must agree on the run dir without talking to the others, and an
elastic restart must find it again to resume. Hydra's default, a timestamp, gives neither, so
a torchrun launch without `hydra.run.dir` uses `outputs/torchrun/<rendezvous id>`: the same for
all ranks and all restarts of one launch.

The lock is `flock` on `<run dir>/.lock`, which the kernel releases when its holder exits in
any way (SIGKILL included): a stale lock of a dead run is simply taken over.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from attnmt.common.errors import UserError

LOCK_NAME = ".lock"


class RunDirBusy(UserError):
    """Another live run holds this run dir."""


class RunDirLock:
    """Exclusive, non-blocking lock of a run dir for the life of this process (or `release`).

    Raises:
        RunDirBusy: another live process holds it; the message names its PID.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(self._fd)
            os.close(self._fd)
            self._fd = None
            raise RunDirBusy(
                f"run dir {self.path.parent} is in use by a live run (PID {holder}); wait for it "
                "to finish, stop it, or choose another hydra.run.dir"
            ) from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_run_dir_free(argv: list[str]) -> None:
    """Raise `RunDirBusy` if a live run holds the `hydra.run.dir=` of these `train.py`
    arguments (a check that takes nothing; rank 0 only; not for Hydra multiruns)."""
    given = [arg.split("=", 1)[1] for arg in argv if arg.startswith("hydra.run.dir=")]
    if not given or os.environ.get("RANK", "0") != "0" or {"-m", "--multirun"} & set(argv):
        return
    if (Path(given[-1]) / LOCK_NAME).exists():
        try:
            RunDirLock(given[-1]).release()
        except PermissionError as e:
            raise UserError(
                f"cannot use run dir {given[-1]} ({e.strerror}); choose another hydra.run.dir"
            ) from None


def _read_pid(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 32).decode(errors="replace").strip() or "unknown"


def torchrun_run_dir() -> str:
    """The default run dir of a torchrun launch: `outputs/torchrun/<id>`.

    `<id>` is the rendezvous id (`--rdzv-id`; a fresh UUID per launch with `--standalone`),
    else, on one node, the launcher's PID and start time (the parent of every worker: the same
    across its restarts, different for the next launch even where PIDs repeat, as in
    containers).

    Raises:
        UserError: a multi-node launch with neither `--rdzv-id` nor `hydra.run.dir`.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id in ("", "none"):
        if os.environ.get("WORLD_SIZE") != os.environ.get("LOCAL_WORLD_SIZE"):
            raise UserError(
                "training on several nodes needs one run dir that every node shares: pass "
                "hydra.run.dir=/shared/path (the same on every node)"
            )
        parent = os.getppid()
        try:  # field 22 of /proc/PID/stat: start time in clock ticks since boot
            started = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except (OSError, IndexError):
            started = "0"
        run_id = f"agent{parent}-{started}"
    return f"outputs/torchrun/{run_id}"


def torchrun_overrides(argv: list[str]) -> list[str]:
    """Extra Hydra overrides for `train.py` under torchrun: one run dir for all ranks and
    restarts, and no files (`.hydra/`, `train.log`) or INFO logging from ranks other than 0."""
    if "LOCAL_RANK" not in os.environ:
        return []
    extra = []
    if not any(arg.startswith("hydra.run.dir=") for arg in argv):
        extra.append(f"hydra.run.dir={torchrun_run_dir()}")
    if os.environ.get("RANK", "0") != "0":
        extra += ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    return extra
