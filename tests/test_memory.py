"""`common.memory.keep_freed_memory`: after it, a training-like allocation pattern stops
page-faulting (checked in child processes, since the setting is process-wide), and tensors
still work; other platforms are left alone."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from attnmt.common.memory import on_glibc

ROOT = Path(__file__).resolve().parents[1]

# A training step allocates and frees the same large blocks every step: at 2,048 tokens x 8,000
# vocabulary, 65 MB of logits and as much for their gradient. This one is 41 MB, above the
# largest threshold (32 MB) below which glibc may serve a block from its heap by default.
# Kept, glibc's heap still grows for the first few blocks (the first 4 of this step on glibc
# 2.36; 7 with `torch.ones` alone: a freed block of torch's 64-byte-aligned allocations
# is not always reused at once), then reuses them; the warm-up runs 30.
FAULTS_OF_STEPS = """
import resource, sys, torch
from attnmt.common.memory import keep_freed_memory
torch.set_num_threads(1)
took = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():
    logits = torch.ones(1280, 8000)
    return float(torch.log_softmax(logits[:1], -1)[0, 0])
for _ in range(30):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    value = step()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, value)
"""


def minor_faults(setting: str) -> tuple[str, int, str]:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_OF_STEPS, setting],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split()  # fmt: skip
    return out[0], int(out[1]), out[2]


@pytest.mark.skipif(not on_glibc(), reason="glibc only")
def test_freed_blocks_are_reused_instead_of_page_faulting() -> None:
    took, kept_faults, value = minor_faults("keep")
    _, default_faults, _ = minor_faults("default")
    assert took == "True"
    assert float(value) == pytest.approx(-math.log(8000))  # tensors still compute
    # glibc's defaults `mmap` each such block and unmap it when freed, so every step faults its
    # 10,000 pages in again: 100,010 faults in 10 steps in all 16 runs here (8 of them beside
    # two busy processes; 4 KB pages; with transparent huge pages fewer, but at least one a
    # step). Kept, the heap already holds the block: 0 faults in all 16.
    assert default_faults >= 10, default_faults
    assert kept_faults < default_faults / 10, (kept_faults, default_faults)


def test_other_platforms_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnmt.common import memory

    monkeypatch.setattr(memory.platform, "system", lambda: "Darwin")
    assert memory.keep_freed_memory() is False
