"""Process-wide allocator settings for CPU training and inference.

torch's CPU tensors come from glibc `malloc`. By default it serves blocks above a threshold
(128 KB, raised as blocks are freed, up to 32 MB) with `mmap`, and gives freed memory at the
top of its heap back to the OS once more than twice that threshold is free there. A beam
search step allocates and frees blocks of that size: at 320 rows (64 sentences x 5 beams) the
logits and log-probabilities are 10 MB each (8,000-token vocabulary, float32). A training
step's are larger: at 2,048 tokens, 65 MB of logits and as much again for their gradient. So
freed memory went back to the OS and the next step's blocks page-faulted on first touch.

`keep_freed_memory()` makes `malloc` keep freed memory for reuse instead (no `mmap`, no trimming),
as jemalloc or tcmalloc would (PyTorch's CPU performance guide suggests those): beam search stops
page-faulting fresh blocks each step and runs faster, greedy search is unchanged, and training
keeps its losses; keeping only the trim threshold (`mmap` still dynamic) was slower. The figures:
docs/translating.md, "How the search works".

The cost: freed memory stays in the process until it exits (its resident memory stays at its
peak), which suits a training or translation process. `translate.py` and `train.py` call it on
the CPU only (`training.loop.fit(..., keep_memory=True)`); a caller of `fit()` opts in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h


def on_glibc() -> bool:
    """Whether this process runs on Linux with glibc, where `keep_freed_memory` applies."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to never `mmap` and never trim; True if it took both settings
    (False elsewhere: another libc, or no libc found)."""
    if not on_glibc():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
