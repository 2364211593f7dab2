"""Where and in what precision torch computes: one device resolution, one precision rule and
one autocast context for training, translation and the benchmarks.

Every function takes the device first, then the precision: `autocast(device, precision)`,
`resolve_precision(device, precision)`. Precisions are `fp32` (no autocast), `bf16` and `fp16`
(`torch.autocast`: matmuls in half precision, reductions in fp32); training also accepts `auto`
(`resolve_precision`). `option` arguments name the setting as the user wrote it, a flag
(`--device`) or a config key (`trainer.device`), so that errors quote what to change.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

from attnmt.common.errors import UserError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the autocast dtype of a precision


class DeviceError(UserError):
    """Asked for a device, or a precision on it, that this machine or torch build lacks."""


def nvidia_gpu_present() -> bool:
    """An NVIDIA driver is installed (nvidia-smi on PATH or /dev/nvidia0), whatever torch sees."""
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def resolve_device(
    requested: str, option: str, local_rank: int = 0, strict_auto: bool = True
) -> torch.device:
    """`auto` -> CUDA (GPU `local_rank`) when torch sees a GPU, else the CPU; `cuda` without
    one is an error.

    Args:
        requested: `auto`, `cpu` or `cuda`.
        option: the setting's name in error messages (`trainer.device`, `--device`).
        local_rank: the GPU of this process (torchrun's LOCAL_RANK).
        strict_auto: `auto` refuses a machine whose NVIDIA GPU torch cannot use (a CPU-only
            build, an old driver), since training would silently run hundreds of times slower
            on the CPU; False falls back to the CPU instead (translation).

    Raises:
        DeviceError: one line naming the problem and the setting to change.
    """
    if requested not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"{_setting(option, requested)} is not one of auto|cpu|cuda")
    if requested == "cpu":
        return torch.device("cpu")
    cpu = _setting(option, "cpu")
    if not torch.cuda.is_available():
        if requested == "cuda":
            raise DeviceError(
                f"{_setting(option, 'cuda')} but no CUDA GPU is visible to PyTorch "
                f"(torch {torch.__version__}); use {cpu} or auto"
            )
        if strict_auto and nvidia_gpu_present() and torch.version.cuda is None:
            raise DeviceError(
                f"this machine has an NVIDIA GPU but torch {torch.__version__} is a CPU-only "
                "build; install the CUDA build (`pip install --force-reinstall "
                f"torch=={torch.__version__.split('+')[0]}` from PyPI; `make venv` does it "
                f"on a machine with the driver), or run on the CPU with {cpu}"
            )
        if strict_auto and nvidia_gpu_present():
            raise DeviceError(
                f"this machine has an NVIDIA GPU but torch {torch.__version__} (CUDA "
                f"{torch.version.cuda}) cannot use it (driver too old, or CUDA_VISIBLE_DEVICES "
                f"hides it: see nvidia-smi); fix that, or run on the CPU with {cpu}"
            )
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise DeviceError(
            f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA device(s) are "
            "visible; start at most that many processes per node (torchrun --nproc_per_node) "
            "or check CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", local_rank)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` does bf16 arithmetic in hardware: a CUDA GPU that supports it
    (Ampere and later), or a CPU with AVX512-BF16 or AMX (what oneDNN's bf16 matmuls use)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
    return False


def resolve_precision(device: torch.device, precision: str) -> str:
    """`auto` -> bf16 where the device has native bf16 (`native_bf16`), else fp32."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


def autocast_supported(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch autocasts a matmul on `device_type` to `dtype` (it may silently not)."""
    if not torch.amp.is_autocast_available(device_type):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "dtype is not supported. Disabling autocast."
        with torch.autocast(device_type, dtype=dtype):
            x = torch.ones(2, 2, device=device_type)
            return (x @ x).dtype == dtype


def check_autocast(device: torch.device | str, precision: str, option: str) -> None:
    """Raise `DeviceError` unless `precision` autocasts on `device` (fp32 always does)."""
    if precision == "fp32":
        return
    device_type = torch.device(device).type
    if not autocast_supported(device_type, DTYPES[precision]):
        raise DeviceError(
            f"{_setting(option, precision)} is not supported on {device_type} by torch "
            f"{torch.__version__}; use {_setting(option, 'fp32')} (or bf16)"
        )


def autocast(device: torch.device | str, precision: str) -> AbstractContextManager:
    """fp32: nothing; bf16/fp16: `torch.autocast` on `device`'s type (matmuls in half
    precision, reductions in fp32). A fresh context per call: enter each one once."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=DTYPES[precision])


def autocast_of(device_type: str) -> Callable[[], AbstractContextManager]:
    """A factory of the calling thread's autocast context on `device_type` (autocast state is
    per thread), or of a no-op when autocast is off: what a worker thread enters to compute
    as its caller does."""
    if not torch.is_autocast_enabled(device_type):
        return nullcontext
    dtype = torch.get_autocast_dtype(device_type)
    return lambda: torch.autocast(device_type, dtype=dtype)


def _setting(option: str, value: str) -> str:
    """`option` set to `value` as the user writes it: `--device cuda`, `trainer.device=cuda`."""
    return f"{option} {value}" if option.startswith("-") else f"{option}={value}"


# Datasheet bf16 dense tensor-core peaks (no sparsity), FLOP/s; matched on the device name.
DATASHEET_BF16_FLOPS = {"H200": 989e12, "H100 PCIe": 756e12, "H100 SXM": 989e12, "A100": 312e12}


def datasheet_gpu(device_name: str) -> str:
    """The `DATASHEET_BF16_FLOPS` key of a `torch.cuda.get_device_name()`, else "unknown".

    E.g. "NVIDIA H100 80GB HBM3" -> "H100 SXM", "NVIDIA H100 PCIe" -> "H100 PCIe",
    "NVIDIA A100-SXM4-80GB" -> "A100"; H100 NVL and everything else -> "unknown".
    """
    name = device_name.upper()
    if "H200" in name:
        return "H200"
    if "H100" in name and "PCIE" in name:
        return "H100 PCIe"
    if "H100" in name and ("SXM" in name or "HBM3" in name):
        return "H100 SXM"
    if "A100" in name:
        return "A100"
    return "unknown"
