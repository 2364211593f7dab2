"""What keeps an accelerator waiting on the training step, each cause as one measured number,
on whatever device the config names (`scripts/gpu_check.sh` runs it on a GPU):

    python -m training.step_check data.dir=../shared/data/multi30k            # the default run
    python -m training.step_check model=base trainer.max_tokens=4096 --compile-epoch
    python -m training.step_check ... --json out.json

Arguments are `train.py`'s config overrides, plus the flags below. It builds the data, model
and optimizer as `train.py` does (nothing is written but the data cache), then reports:

- syncs/update: host reads of device values in an update (`HostReads`: `.item()`, `.tolist()`,
  `bool(t)`, ..., and ops whose output shape depends on data), over 3 updates of real batches
  with gradient accumulation 2, not on a log step. A GPU waits at each.
- shapes, padding waste: distinct (B, S, T) of one epoch's batches and the padding share, with
  `trainer.bucket_growth` as set and with 0 (exact lengths): each new shape is a compile.
- ops/update: aten ops dispatched in one update, and those that compute (kernels: all but
  views; the launches of an eager GPU step, but for the CPU's own paths: its dropout mask and
  the loss in row blocks, `model/kernels.py`), and the share of the step's CPU time that the
  profiler puts outside matrix products.
- host gap: the loop's own time between two updates (waiting for the prefetched batch,
  bookkeeping), median over the timed updates: what a GPU idles for between steps.
- step time and MFU: model FLOPs of one update (`torch.utils.flop_counter`, what the kernels
  compute, padding included) per second, over this device's measured dense matmul peak (fp32
  and bf16, a large `torch.mm`); on a GPU also over the datasheet's bf16 dense peak.
- with --compile-epoch: `trainer.compile=true` over one epoch, the graphs compiled (the first
  and each recompile) and the seconds spent compiling (the first update, and the rest over the
  steady step time).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from attnmt.common import runtime
from attnmt.common.runtime import DATASHEET_BF16_FLOPS, datasheet_gpu
from attnmt.data.batching import Batch, TokenBatchSampler, prefetch, token_lengths
from attnmt.training import build, distributed
from attnmt.training.config import Configs
from attnmt.training.loop import _Window, train_step
from attnmt.training.run import Learner
from attnmt.training.state import seed_everything

CONF = Path(__file__).resolve().parents[1] / "conf"


T = torch.Tensor
# Python-level reads of a tensor's value or copies to the host: on CUDA each one waits for the GPU.
PY_READS = {
    T.item, T.tolist, T.__bool__, T.__float__, T.__int__, T.__index__, T.numpy, T.cpu,
}  # fmt: skip
# Operators that read device memory on the host inside C++ (CUDA syncs), besides those tagged
# as having a data-dependent output or output shape.
SYNC_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
}
SYNC_TAGS = {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output}
INDEX_OPS = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default}
MATMULS = ("mm", "bmm", "addmm", "baddbmm", "linear", "matmul", "_scaled_dot_product")


class _PyReads(TorchFunctionMode):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in PY_READS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


class _SyncOps(TorchDispatchMode):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNC_OPS or SYNC_TAGS & set(func.tags) or _bool_mask_index(func, args):
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def _bool_mask_index(func, args) -> bool:
    if func not in INDEX_OPS or len(args) < 2:
        return False
    return any(isinstance(i, T) and i.dtype == torch.bool for i in (args[1] or []) if i is not None)


class HostReads:
    """Records every read of a tensor's value on the host in its block, Python-level
    (`PY_READS`) or inside an operator (`SYNC_OPS`, `SYNC_TAGS`, boolean-mask indexing):
    `with HostReads() as reads: ...; reads.calls`."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._modes = (_PyReads(self.calls), _SyncOps(self.calls))

    def __enter__(self) -> HostReads:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class _OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched, and apart those that compute (`kernels`: not views)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.kernels: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__)
        self.ops[name] += 1
        if not func.is_view:
            self.kernels[name] += 1
        return func(*args, **(kwargs or {}))


def config(overrides: list[str]) -> Configs:
    """`train.yaml` with `overrides`, as `train.py` composes it."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return Configs.from_hydra(compose("train", overrides=overrides))


def shapes_and_waste(lengths: tuple, max_tokens: int, growth: float) -> dict[str, float]:
    stats = TokenBatchSampler(*lengths, max_tokens, seed=1, bucket_growth=growth).padding_stats()
    return {"batches": stats["batches"], "shapes": stats["shapes"], "waste": stats["waste"]}


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """Measured FLOP/s of an n x n x n `torch.mm`: the best of `repeats` (a peak; the median
    would count a busy machine's stalls)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for _ in range(repeats + 2):
        start = _now(device)
        torch.mm(a, b)
        times.append(_now(device) - start)
    return 2 * n**3 / min(times[2:])


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class StepCheck:
    """The data, model and optimizer of a config, and updates on its real batches."""

    def __init__(self, cfg: Configs, run_dir: Path) -> None:
        self.cfg = cfg
        self.ctx = distributed.setup(cfg.trainer.device, tf32=cfg.trainer.tf32)
        if cfg.trainer.precision == "auto":
            cfg.trainer.precision = runtime.resolve_precision(self.ctx.device, "auto")
        seed_everything(cfg.trainer.seed)
        self.data = build.load_data(cfg, run_dir)
        self.trainee = build.build_trainee(cfg, self.data.tokenizer, self.ctx.device)
        self.learner = Learner(cfg, self.ctx, self.trainee, self.trainee.model)
        self.window = _Window(self.ctx.device)
        self.loader = build.train_batches(self.data, cfg, self.ctx)

    def batches(self, n: int) -> Iterator[list[Batch]]:
        """`n` updates' batches (`trainer.update_freq` each), cycling over the epoch."""
        k, epoch = self.cfg.trainer.update_freq, 0
        group: list[Batch] = []
        while True:
            for batch in self.loader.epoch(epoch):
                group.append(batch)
                if len(group) == k:
                    yield group
                    group, n = [], n - 1
                    if n == 0:
                        return
            epoch += 1

    def update(self, batches: list[Batch], learner: Learner | None = None) -> None:
        train_step(learner or self.learner, batches, self.window)
        self.trainee.state.step += 1

    def sync(self) -> None:
        _now(self.ctx.device)


def check_syncs(check: StepCheck) -> dict[str, Any]:
    groups = list(check.batches(4))
    check.update(groups[0])  # the optimizer creates its state
    with HostReads() as reads:
        for group in groups[1:]:
            check.update(group)
    return {"syncs_per_update": len(reads.calls) / 3, "sync_calls": sorted(set(reads.calls))}


def check_ops(check: StepCheck) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    (group,) = check.batches(1)
    check.update(group)
    with _OpCount() as count:
        check.update(group)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        check.update(group)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key.split("::")[-1].startswith(MATMULS))
    return {
        "ops_per_update": sum(count.ops.values()),
        "kernels_per_update": sum(count.kernels.values()),
        "top_kernels": dict(count.kernels.most_common(8)),
        "share_outside_matmuls": 1 - matmul / total if total else 0.0,
    }


def check_speed(check: StepCheck, updates: int) -> dict[str, Any]:
    """Steady updates on prefetched batches: step time, host gap, FLOPs and MFU."""
    device, precision = check.ctx.device, check.cfg.trainer.precision
    groups = list(check.batches(2))
    for group in groups:
        check.update(group)
    tokens, steps, gaps = 0, [], []
    # Batches are read and padded as `train` does: on the prefetch thread, or inline with 0.
    epochs = itertools.chain.from_iterable(check.loader.epoch(e) for e in itertools.count(1))
    stream = prefetch(epochs, check.cfg.trainer.prefetch)
    k = check.cfg.trainer.update_freq
    check.sync()
    done = time.perf_counter()
    for _ in range(updates):
        group = [next(stream) for _ in range(k)]
        start = time.perf_counter()
        gaps.append(start - done)
        check.update(group)
        check.sync()
        done = time.perf_counter()
        steps.append(done - start)
        tokens += sum(b.n_src_tokens + b.n_tgt_tokens for b in group)
    with FlopCounterMode(display=False) as counter:
        check.update(groups[-1])
    flops = counter.get_total_flops()
    step_s = statistics.median(steps)
    achieved = flops / step_s
    out: dict[str, Any] = {
        "step_ms": 1e3 * step_s,
        "host_gap_ms": 1e3 * statistics.median(gaps),
        "tokens_per_s": tokens / sum(steps),
        "flops_per_update": flops,
        "achieved_tflops": achieved / 1e12,
        "precision": precision,
    }
    native_bf16 = runtime.resolve_precision(device, "auto") == "bf16"
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        n = (
            8192
            if device.type == "cuda"
            else 2048
            if dtype == torch.float32 or native_bf16
            else 512
        )
        peak = matmul_peak(device, dtype, n)  # emulated bf16 on a CPU without it: a small n
        out[f"peak_{name}_tflops"] = peak / 1e12
        out[f"mfu_vs_{name}_peak"] = achieved / peak
    if device.type == "cuda":
        sheet = DATASHEET_BF16_FLOPS.get(datasheet_gpu(torch.cuda.get_device_name(device)))
        out["mfu_vs_datasheet_bf16"] = achieved / sheet if sheet else None
    return out


def check_compile(check: StepCheck) -> dict[str, Any]:
    """`trainer.compile=true` over one epoch: graphs compiled and compile seconds."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = build.wrap_model(check.trainee.model, check.ctx, compile=True)
    learner = Learner(check.cfg, check.ctx, check.trainee, model)
    n = len(check.loader) // check.cfg.trainer.update_freq
    times, graphs = [], []
    for group in check.batches(n):
        start = _now(check.ctx.device)
        check.update(group, learner)
        times.append(_now(check.ctx.device) - start)
        graphs.append(counters["stats"]["unique_graphs"])
    steady = statistics.median(times)
    first = times[0]
    compiled = zip(times[1:], graphs[1:], graphs[:-1], strict=True)
    later = sum(t - steady for t, g, g0 in compiled if g > g0)
    return {
        "compiled_updates": n,
        "graphs_compiled": graphs[-1],
        "recompiles": graphs[-1] - graphs[0],
        "first_update_s": first,
        "recompile_s": later,
        "steady_step_ms": 1e3 * steady,
    }


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="train.py config overrides (key=value)")
    parser.add_argument("--updates", type=int, default=10, help="updates timed")
    parser.add_argument("--compile-epoch", action="store_true", help="one compiled epoch")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    cfg = config(args.overrides)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        check = StepCheck(cfg, Path(tmp))
        lengths = token_lengths(check.data.train)
        trainer = cfg.trainer
        growth = trainer.bucket_growth or 1.1  # the configured ladder, else the GPU experiments'
        report: dict[str, Any] = {
            "device": runtime_name(check.ctx.device),
            "model": f"d_model={cfg.model.d_model} layers={cfg.model.n_encoder_layers}+"
            f"{cfg.model.n_decoder_layers} vocab={check.data.tokenizer.tgt_vocab_size}",
            "max_tokens": trainer.max_tokens,
            "precision": trainer.precision,
            "shapes_exact": shapes_and_waste(lengths, trainer.max_tokens, 0.0),
            f"shapes_bucket_{growth:g}": shapes_and_waste(lengths, trainer.max_tokens, growth),
        }
        accumulate = check.cfg.trainer.update_freq
        check.cfg.trainer.update_freq = 2
        report.update(check_syncs(check))
        check.cfg.trainer.update_freq = accumulate
        report.update(check_ops(check))
        report.update(check_speed(check, args.updates))
        if args.compile_epoch:
            report["compile"] = check_compile(check)
    for key, value in report.items():
        print(f"{key:>24}: {_fmt(value)}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return report


def runtime_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    return str(value)


def main(argv: list[str] | None = None) -> int:
    run(sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
