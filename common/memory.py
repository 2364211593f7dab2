"""Process-wide allocator settings for CPU inference.

torch's CPU tensors come from glibc `malloc`, which serves blocks of more than 128 KB
(dynamically up to 32 MB) with `mmap` and hands them back to the OS when they are freed. A
decoding step allocates such blocks and frees them again: the (rows, vocabulary) logits and
log-probabilities (10 MB each at 320 rows x 8,000), the KV caches of every batch. Each fresh
block page-faults on first touch, every step. `keep_freed_memory()` makes `malloc` keep freed
memory for reuse instead (no `mmap`, no trimming), what jemalloc or tcmalloc do and what
PyTorch's CPU performance guide suggests them for. Measured on `translate.py`'s search
(`scripts/bench_decode_ops.py` does not cover it: see the README's decoder benchmarks), 320
test2016 sentences, beam 5, 2 threads, this workplace's VM, 2026-11-23: 84-87 -> 98-104
sentences/s (two runs each; keeping only the trim threshold was slower, 62-66).

The cost: the process's resident memory stays at its peak until it exits, which suits a
translation process. `translate.py` calls it on the CPU; training does not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to never `mmap` and never trim; True if it took both settings
    (False elsewhere: another libc, or no libc found)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
