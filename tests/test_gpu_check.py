"""scripts/gpu_check.sh: without a GPU it refuses in one line and exits non-zero (the path every
CPU machine and CI can check); with one, `pytest -m gpu` runs it for real (--quick)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.train_helpers import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}  # the Python running the tests
    return subprocess.run(
        [BASH, str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_script_parses():
    assert subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_without_cuda_refuses_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: gpu_check.sh would run")
    proc = _run(timeout=60)
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check.sh: no CUDA GPU"), proc.stderr


def test_unknown_argument_fails():
    proc = _run("--bogus", timeout=60)
    assert proc.returncode == 2 and "--bogus" in proc.stderr


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_quick_passes():
    proc = _run("--quick", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== summary" in proc.stdout


@pytest.mark.parametrize(
    "args", [("--minutes", "abc"), ("--minutes",), ("--out",), ("--out", "--quick")]
)
def test_a_flag_without_its_value_fails_before_anything_runs(args):
    proc = _run(*args, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "needs a" in proc.stderr and len(proc.stderr.splitlines()) == 1
