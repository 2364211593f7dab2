"""`common.memory.keep_freed_memory`: glibc's malloc takes both settings (checked in a child
process, since they are process-wide), and translate.py still translates after them."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_glibc_takes_both_settings_and_tensors_still_work() -> None:
    code = (
        "from common.memory import keep_freed_memory; import torch; ok = keep_freed_memory(); "
        "x = [torch.ones(1 << 20) for _ in range(8)]; del x; "  # 4 MB blocks, freed
        "print(ok, float(torch.ones(1 << 21).sum()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", str(float(1 << 21))]


def test_other_platforms_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from common import memory

    monkeypatch.setattr(memory.platform, "system", lambda: "Darwin")
    assert memory.keep_freed_memory() is False
