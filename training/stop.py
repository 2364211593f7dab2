"""Stop requests: what makes a run save after the current update and end early.

SIGTERM and SIGUSR1 (what SLURM and Kubernetes send before preemption), and the death of
torchrun's launcher (it starts each worker in a session of its own, so orphaned workers would
train on). The loop reads `requested()` at the end of every update and all ranks agree on it
(`training/loop.py::train_step`), so every rank stops after the same update.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)


class StopRequests:
    """SIGTERM and SIGUSR1 (what SLURM and Kubernetes send before preemption) are recorded
    instead of killing the process, and so is the death of torchrun's launcher (it starts each
    worker in a session of its own, so orphaned workers would train on): the loop then saves
    after the current update, on every rank at the same step, and returns."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous: dict[int, Any] = {}
        self._launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None

    def requested(self) -> bool:
        if self.reason is None and self._launcher is not None and os.getppid() != self._launcher:
            self.reason = f"the exit of the torchrun launcher (PID {self._launcher})"
            log.warning("%s: stopping after the current update", self.reason)
        return self.reason is not None

    def _handle(self, signum: int, frame: object) -> None:
        self.reason = signal.Signals(signum).name
        log.warning("%s received: stopping after the current update", self.reason)

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
