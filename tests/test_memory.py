"""`common.memory.keep_freed_memory`: after it, a search-like allocation pattern stops
page-faulting (checked in child processes, since the setting is process-wide), and tensors
still work; other platforms are left alone."""

from __future__ import annotations

import math
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each step of a beam search batch allocates (rows, vocabulary) logits and log-probabilities,
# with fewer rows as sentences finish: 10 MB blocks at 320 rows x 8,000, of ever other sizes.
FAULTS_OF_STEPS = """
import resource, sys, torch
from common.memory import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
def batch():
    for rows in range(320, 0, -16):
        logits = torch.ones(rows, 8000)
        lprobs = torch.log_softmax(logits, -1)
        del logits
        scores = lprobs + 1.0
    return float(scores[0, 0])
for _ in range(10):  # the heap grows to its high-water mark
    batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    value = batch()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, value)
"""


def minor_faults(setting: str) -> tuple[str, int, str]:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_OF_STEPS, setting],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split()  # fmt: skip
    return out[0], int(out[1]), out[2]


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_freed_blocks_are_reused_instead_of_page_faulting() -> None:
    took, kept_faults, value = minor_faults("keep")
    _, default_faults, _ = minor_faults("default")
    assert took == "True"
    assert float(value) == pytest.approx(1 - math.log(8000))  # tensors still compute
    # glibc's defaults hand such blocks back to the OS and fault them in again (19,700-52,800
    # faults over 12 runs here, 2026-11-23); kept, the heap stays at its high-water mark (0 in
    # 22 of 26 runs, 750-875 where it was still growing)
    assert default_faults > 5000, default_faults
    assert kept_faults < default_faults / 5, (kept_faults, default_faults)


def test_other_platforms_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from common import memory

    monkeypatch.setattr(memory.platform, "system", lambda: "Darwin")
    assert memory.keep_freed_memory() is False
