"""`train.py` with faults injected from environment variables, for the multi-process tests.

    FAULT_SLOW_PREP=S     rank 0 sleeps S seconds before preparing the data
    FAULT_CRASH_RANK=R    rank R raises RuntimeError before update FAULT_CRASH_STEP (default 3)

Everything else is the real `train.py`, run as torchrun runs it (`__main__`).
"""

import os
import runpy
import sys
import time
from pathlib import Path

from attnmt.training import build, loop

ROOT = Path(__file__).resolve().parents[2]

RANK = int(os.environ.get("RANK", "0"))

if "FAULT_SLOW_PREP" in os.environ and RANK == 0:
    real_load_data = build.load_data

    def slow_load_data(*args, **kwargs):
        time.sleep(float(os.environ["FAULT_SLOW_PREP"]))
        return real_load_data(*args, **kwargs)

    build.load_data = slow_load_data

if os.environ.get("FAULT_CRASH_RANK") == str(RANK):
    real_train_step = loop.train_step
    crash_step = int(os.environ.get("FAULT_CRASH_STEP", "3"))

    def crashing_train_step(learner, *args, **kwargs):
        if learner.trainee.state.step + 1 == crash_step:
            raise RuntimeError(f"injected crash on rank {RANK} at step {crash_step}")
        return real_train_step(learner, *args, **kwargs)

    loop.train_step = crashing_train_step

sys.argv[0] = str(ROOT / "train.py")
runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
