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


# A Python with one GPU, for gpu_check.sh's own logic on a machine without one: the torch
# checks answer as there; the steps' commands log their arguments and write the files their
# key readers read (FAKE_BAD=1: files that cannot be read); the rest is the real Python.
FAKE_PYTHON = r"""#!/usr/bin/env bash
if [[ "$1" == -c && "$2" == *is_available* ]]; then exit 0; fi
if [[ "$1" == -c && "$2" == *device_count* ]]; then echo 1; exit 0; fi
if [[ "$1" == -c && "$2" == *get_device_name* ]]; then echo "Fake GPU | torch 0"; exit 0; fi
if [[ "$1" == -m || "$1" == train.py ]]; then
    echo "$*" >> "$FAKE_LOG"
    for arg in "$@"; do
        case "$arg" in hydra.run.dir=*) out="${arg#hydra.run.dir=}"; mkdir -p "$out"
            if [[ "${FAKE_BAD:-0}" == 1 ]]; then echo "{" > "$out/results.json"; else
            echo '{"steps": 7, "best_step": 7, "valid": {"bleu": 1.5},
                   "test": {"test2016": {"bleu": 2.5}}}' > "$out/results.json"; fi ;;
        esac
    done
    exit 0
fi
exec "$REAL_PYTHON" "$@"
"""


def _fake_run(tmp_path, *args: str, bad: bool = False) -> tuple[subprocess.CompletedProcess, list]:
    fake, log, data = tmp_path / "python", tmp_path / "commands.log", tmp_path / "data"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    data.mkdir()
    (data / "train.en").write_text("a\n")
    env = {**os.environ, "PYTHON": str(fake), "REAL_PYTHON": sys.executable, "FAKE_LOG": str(log),
           "FAKE_BAD": "1" if bad else "0", "DATA_DIR": str(data)}  # fmt: skip
    proc = subprocess.run([BASH, str(SCRIPT), "--out", str(tmp_path / "out"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    return proc, log.read_text().splitlines() if log.exists() else []


def test_only_runs_the_steps_asked_for_with_the_overrides_given(tmp_path):
    proc, commands = _fake_run(
        tmp_path, "--only", "train", "--minutes", "10", "--set", "trainer.max_tokens=8192"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(commands) == 1 and commands[0].startswith("train.py experiment=multi30k_en_de_gpu")
    assert "trainer.max_minutes=10" in commands[0]
    assert commands[0].endswith("trainer.max_tokens=8192")
    assert "step 7 (best 7), valid BLEU 1.50, test2016 BLEU 2.50" in proc.stdout
    assert "all steps passed" in proc.stdout


def test_a_key_number_that_cannot_be_read_fails_the_step(tmp_path):
    proc, commands = _fake_run(tmp_path, "--only", "train", bad=True)
    assert len(commands) == 1
    assert proc.returncode == 1 and "FAILED reading its key number" in proc.stdout
    assert "at least one step FAILED" in proc.stderr


def test_set_takes_hydras_prefixes_and_says_when_it_applies_to_nothing(tmp_path):
    proc, commands = _fake_run(tmp_path, "--only", "step", "--set", "+trainer.x=1")
    assert "--set applies to the Multi30k run only" in proc.stderr
    assert len(commands) == 1 and commands[0].startswith("-m benchmarks.train_step")
    (tmp_path / "2").mkdir()
    proc, commands = _fake_run(tmp_path / "2", "--only", "train", "--set", "~trainer.x")
    assert proc.returncode == 0 and commands[0].endswith("~trainer.x")


@pytest.mark.parametrize("args", [("--only", "train,gpu"), ("--only",), ("--set", "novalue")])
def test_only_and_set_check_their_values(args):
    proc = _run(*args, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1
