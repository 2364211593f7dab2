"""Process-wide allocator settings for CPU training and inference.

torch's CPU tensors come from glibc `malloc`. By default it serves blocks above a threshold
(128 KB, raised as blocks are freed, up to 32 MB) with `mmap`, and gives freed memory at the
top of its heap back to the OS once more than twice that threshold is free there. A beam
search step allocates and frees blocks of that size: at 320 rows (64 sentences x 5 beams) the
logits and log-probabilities are 10 MB each (8,000-token vocabulary, float32). A training
step's are larger: at 2,048 tokens, 65 MB of logits and as much again for their gradient. So
freed memory went back to the OS and the next step's blocks page-faulted on first touch.

`keep_freed_memory()` makes `malloc` keep freed memory for reuse instead (no `mmap`, no
trimming), as jemalloc or tcmalloc would (PyTorch's CPU performance guide suggests those).
Measured 2026-11-23 on a 2-core AMD EPYC (Zen 3) VM, torch 2.13.0+cpu, each setting in a
process of its own, alternated (`/work/runs/s10/mal2.py`, `trainmal.py`):
- search, the default checkpoint, 512 test2016 sentences, batches of 64, 2 threads, two
  alternations: beam 5 93.3 / 92.1 -> 104.0 / 111.1 sentences/s, with 0.43-0.52 million
  minor page faults per search (about 2 GB of fresh pages) -> 6,100-7,400; greedy (64 rows,
  2 MB blocks) 306.9 / 283.7 -> 297.2 / 292.9, no change; peak resident memory 686-690 MB ->
  685-695 MB. Keeping only the trim threshold (`mmap` still dynamic) was slower: 67-75
  sentences/s at beam 5, 1.5 million faults.
- training, the `tiny` model, fwd + bwd + Adam on 2,048-token batches, 2 threads, three
  alternations: 0.758-0.787 -> 0.711-0.729 s per step (1.06-1.08x), 38,000-43,000 faults
  per step -> 0-553; peak resident memory 890-900 -> 903-932 MB. `train.py
  experiment=multi30k_en_de trainer.max_steps=200`, old and new code alternated, two runs
  each: 5,085 / 5,053 -> 5,569 / 5,278 tokens/s (medians of the logged figures), wall 2:51 /
  2:53 -> 2:39 / 2:48, 8.3 / 7.7 million -> 0.27 / 0.26 million page faults, the same
  losses, peak resident memory 1.07-1.08 -> 1.17-1.19 GB.
`benchmarks/bench_malloc.py` repeats the search comparison through the benchmark's workers.

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
