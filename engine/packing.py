"""Which linear layers the engine runs on oneDNN's pre-packed weights, decided by timing them on
the CPU the engine runs on, for the model's shapes, and remembered.

A group of layers (the output projection, the decoder's, the encoder's; under bf16 autocast
every layer's bf16 copy) is packed only where its packed matmuls took less than `PAYS` of the
unpacked ones' time (`F.linear` on MKL, or autocast casting the weight at each call) at the
rows a search gives them: 64 decoder rows a step (translate.py's batch), 64 sentences of 16
tokens through the encoder. Both are timed interleaved on random weights of the model's
shapes, all groups together in about `BUDGET_S` seconds. The choice is stored in
`$ATTNMT_CACHE/packing.json` (else `~/.cache/attnmt/`), keyed by the CPU model, the instruction
sets the environment caps, torch's version, the thread count and the shapes, so a later
process reads it instead of timing again. Why time instead of a rule: whether a group pays
differs between CPUs and widths (docs/benchmarks.md, "The engine chooses its kernels by
timing them").
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

GROUPS = ("generator", "decoder", "encoder", "bf16")
PAYS = 0.95  # packed must take less than this share of the unpacked time: more than the noise
BUDGET_S = 0.5  # the most a choice takes, all groups together
STEP_ROWS, ENCODER_ROWS = 64, 64 * 16
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


@dataclass(frozen=True)
class Packing:
    """The groups of linear layers that run packed (float32 ones outside autocast; `bf16`:
    every layer's bf16 copy under bf16 autocast)."""

    generator: bool = False
    decoder: bool = False
    encoder: bool = False
    bf16: bool = False

    @classmethod
    def parse(cls, text: str) -> Packing | None:
        """`--pack`'s value: auto (None: time it), off, all, or a comma list of `GROUPS`."""
        if text == "auto":
            return None
        names = {"off": [], "all": list(GROUPS)}.get(text, [x for x in text.split(",") if x])
        if unknown := [x for x in names if x not in GROUPS]:
            raise ValueError(
                f"--pack {text}: unknown {', '.join(unknown)}; use auto, off, all or a comma "
                f"list of {', '.join(GROUPS)}"
            )
        return cls(**dict.fromkeys(names, True))

    def describe(self) -> str:
        return ",".join(name for name, on in asdict(self).items() if on) or "off"


def packing_runs() -> bool:
    """Whether this torch has oneDNN's packed float32 linear."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def bf16_packing_runs() -> bool:
    """Whether oneDNN packs bf16 weights on this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT, and
    not capped below them by `ONEDNN_MAX_CPU_ISA`)."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return supported is not None and bool(supported())


def layer_shapes(d_model: int, d_ff: int, vocab: int) -> dict[str, list[tuple[int, int, int]]]:
    """(rows, in, out) of one layer's linear matmuls per group (a layer stands for all)."""
    D, F_ = d_model, d_ff
    decoder = [(STEP_ROWS, D, 3 * D), (STEP_ROWS, D, D), (STEP_ROWS, D, D), (STEP_ROWS, D, 2 * D)]
    decoder += [(STEP_ROWS, D, D), (STEP_ROWS, D, F_), (STEP_ROWS, F_, D)]
    encoder = [(ENCODER_ROWS, D, 3 * D), (ENCODER_ROWS, D, D)]
    encoder += [(ENCODER_ROWS, D, F_), (ENCODER_ROWS, F_, D)]
    generator = [(STEP_ROWS, D, vocab)]
    return {"generator": generator, "decoder": decoder, "encoder": encoder,
            "bf16": generator + decoder}  # fmt: skip


def choose(d_model: int, d_ff: int, vocab: int, cache: Path | None = None) -> Packing:
    """The groups that paid here for these shapes: read from the cache, else timed (at most
    `BUDGET_S`) and stored. Nothing is packed where this torch cannot pack."""
    if not packing_runs():
        return Packing()
    shapes = layer_shapes(d_model, d_ff, vocab)
    if not bf16_packing_runs():
        shapes.pop("bf16")
    caps = [f"{k}={os.environ[k]}" for k in ISA_CAPS if os.environ.get(k)]  # a capped CPU kind
    key = (
        f"{cpu_model()}|{caps}|torch {torch.__version__}|{torch.get_num_threads()} threads|{shapes}"
    )
    path = cache or cache_file()
    known = _read(path)
    if key in known:
        return Packing(**known[key]["packed"])
    start, timed = time.perf_counter(), {}
    for i, (group, group_shapes) in enumerate(shapes.items()):  # the budget left, shared out
        share = (start + BUDGET_S - time.perf_counter()) / (len(shapes) - i)
        timed[group] = time_group(group_shapes, group == "bf16", share)
    packed = {g: packed_s < PAYS * plain_s for g, (plain_s, packed_s) in timed.items()}
    took = time.perf_counter() - start
    log.info("packed linear layers: %s (timed in %.2f s: %s)", packed, took, timed)
    seconds = {g: list(t) for g, t in timed.items()}  # (unpacked, packed) median of a pass
    known[key] = {"packed": packed, "seconds": seconds, "took_s": took}
    _write(path, known)
    return Packing(**packed)


def time_group(
    shapes: list[tuple[int, int, int]], bf16: bool = False, budget_s: float = BUDGET_S / 4
) -> tuple[float, float]:
    """Median seconds of one pass over `shapes`' matmuls unpacked and packed, alternated, on
    random weights, within `budget_s` with the warm-up pair (at least 2 pairs, at most 50)."""
    deadline = time.perf_counter() + budget_s
    with torch.inference_mode():
        layers = [_layer(rows, n_in, n_out, bf16) for rows, n_in, n_out in shapes]
        plain = lambda: [_plain(x, w, b, bf16) for x, w, b, _ in layers]  # noqa: E731
        packed = lambda: [_packed(x, p, b) for x, _, b, p in layers]  # noqa: E731
        plain(), packed()  # warm-up: oneDNN builds its kernels at the first call
        times: tuple[list[float], list[float]] = ([], [])
        pair = 0.0  # the last pair's seconds: a pair starts only if it should end in time
        while len(times[0]) < 50 and (len(times[0]) < 2 or time.perf_counter() + pair < deadline):
            for run, into in ((plain, times[0]), (packed, times[1])):
                start = time.perf_counter()
                run()
                into.append(time.perf_counter() - start)
            pair = times[0][-1] + times[1][-1]
    return statistics.median(times[0]), statistics.median(times[1])


def _layer(rows: int, n_in: int, n_out: int, bf16: bool) -> tuple[Tensor, ...]:
    """Random operands from a generator of their own: timing never moves the global RNG, so a
    run that times and one that reads the cache draw the same dropout masks."""
    gen = torch.Generator().manual_seed(0)
    x, b = torch.randn(rows, n_in, generator=gen), torch.randn(n_out, generator=gen)
    w = torch.randn(n_out, n_in, generator=gen) / n_in**0.5
    if bf16:
        return x, w, b, torch.ops.mkldnn._reorder_linear_weight(w.bfloat16(), None)
    return x, w, b, torch.ops.mkldnn._reorder_linear_weight(w, None)


def _plain(x: Tensor, w: Tensor, b: Tensor, bf16: bool) -> Tensor:
    if not bf16:
        return F.linear(x, w, b)
    with torch.autocast("cpu", torch.bfloat16):  # casts the weight at each call
        return F.linear(x, w, b)


def _packed(x: Tensor, packed: Tensor, b: Tensor) -> Tensor:
    if packed.dtype == torch.bfloat16:
        x, b = x.bfloat16(), b.bfloat16()
    return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")


def cpu_model() -> str:
    """The CPU's model name (Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cache_file() -> Path:
    root = os.environ.get("ATTNMT_CACHE") or Path.home() / ".cache" / "attnmt"
    return Path(root) / "packing.json"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: time again
        return {}


def _write(path: Path, known: dict) -> None:
    """Atomically (processes starting at once each write a whole file); a cache that cannot
    be written is skipped: the choice is only remembered."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass
