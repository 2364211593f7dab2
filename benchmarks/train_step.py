"""The training step as train.py runs it (`training.loop.train_step`), per preset and variant:

    python -m benchmarks.train_step --device cuda --presets base,big --batch-tokens 16384 \\
        --variants bf16,bf16+compile --json step.json

tokens/s; MFU (`benchmark.train_flops` over the step time and the bf16 peak measured here and
the datasheet's); host syncs per update (CUDA's sync debug mode; on a CPU `tests.host_reads`);
kernel time per update (`torch.profiler`, the union of kernel intervals) and busy (that over
the step time); peak memory. Random batches, max_len rotating over `--max-lens`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch.autograd import DeviceType

from attnmt.training import build, distributed
from attnmt.training.loop import _Window, train_step
from attnmt.training.run import Learner
from attnmt.training.state import seed_everything
from benchmarks import harness
from benchmarks.benchmark import SPECIAL, bf16_peaks, now, train_batch, train_configs, train_flops


def learner(preset: str, variant: str, args: argparse.Namespace) -> Learner:
    """What train.py builds for `model=<preset>` on `args.device`, without data."""
    precision, compiled = variant.split("+")[0], variant.endswith("+compile")
    overrides = [f"model={preset}", f"trainer.precision={precision}",
                 f"trainer.max_tokens={args.batch_tokens}", f"trainer.compile={compiled}",
                 f"trainer.device={args.device}", "logger=none"]  # fmt: skip
    cfg = train_configs(overrides)
    device = torch.device(args.device)
    vocab = SimpleNamespace(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, special=SPECIAL)
    seed_everything(args.seed)
    trainee = build.build_trainee(cfg, vocab, device)  # type: ignore[arg-type]
    ctx = distributed.DistContext(rank=0, world_size=1, device=device)
    return Learner(cfg, ctx, trainee, build.wrap_model(trainee.model, ctx, compiled))


def syncs_per_update(run: Learner, batch: Any, window: _Window) -> int | None:
    """Host waits in one update: CUDA's sync debug mode on a GPU; the eager host reads on a CPU
    (None for a compiled CPU step: the dispatch modes would trace into the graphs)."""
    if run.ctx.device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                train_step(run, [batch], window)
                torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)
    if run.cfg.trainer.compile:
        return None
    from tests.host_reads import HostReads  # the tests' counter of host reads

    with HostReads() as reads:
        train_step(run, [batch], window)
    return len(reads.calls)


def kernel_time(run: Learner, batches: list, window: _Window, updates: int) -> dict[str, Any]:
    """The device's kernel time per update (the union of its kernel intervals over `updates`
    profiled updates), kernels per update, the five costliest kernels, and the profiled updates'
    own time (the profiler slows the host: `busy` divides by the unprofiled step time)."""
    device = run.ctx.device
    kinds = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        kinds.append(torch.profiler.ProfilerActivity.CUDA)
    kind = DeviceType.CUDA if device.type == "cuda" else DeviceType.CPU
    with torch.profiler.profile(activities=kinds) as prof:
        start = now(device)
        for i in range(updates):
            train_step(run, [batches[i % len(batches)]], window)
        wall = now(device) - start
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == kind and (kind == DeviceType.CUDA or e.cpu_parent is None)
    )
    covered, end = 0.0, float("-inf")
    for a, b in spans:  # the union of the intervals, microseconds
        covered += max(0.0, b - max(a, end))
        end = max(end, b)
    per_name: Counter = Counter()
    for e in prof.events():
        if e.device_type == kind:
            per_name[e.name] += e.time_range.elapsed_us()
    top = [(name, round(us / updates / 1e3, 3)) for name, us in per_name.most_common(5)]
    return {"kernel_ms_per_update": covered / 1e3 / updates,
            "kernels_per_update": len(spans) / updates,
            "profiled_ms_per_update": 1e3 * wall / updates, "top_ms_per_update": top}  # fmt: skip


def measure(preset: str, variant: str, args: argparse.Namespace, peak: dict) -> dict[str, Any]:
    """One preset x variant: the first update (compiles), timed cycles, syncs, busy, memory."""
    device = torch.device(args.device)
    if device.type == "cuda":
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    run = learner(preset, variant, args)
    model_cfg = run.trainee.model.cfg
    batches = [
        train_batch(args.batch_tokens, n, args.vocab, args.seed + i)
        for i, n in enumerate(args.max_lens)
    ]
    if device.type == "cuda":
        batches = [b.pin_memory() for b in batches]
    window = _Window(device)
    start = now(device)
    train_step(run, [batches[0]], window)
    first = now(device) - start
    for b in batches[1:] * 2:  # every shape seen (a compiled step's recompiles) twice
        train_step(run, [b], window)
    cycles = []
    for _ in range(args.cycles):  # one cycle: an update on each batch
        start = now(device)
        for b in batches:
            train_step(run, [b], window)
        cycles.append(now(device) - start)
    cycle = statistics.median(cycles)
    tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
    flops = sum(train_flops(model_cfg, b) for b in batches)
    entry = {
        "preset": preset, "variant": variant, "params": run.trainee.model.num_parameters(),
        "tokens_per_update": tokens / len(batches), "first_update_s": first,
        "ms_per_update": 1e3 * cycle / len(batches),
        "ms_per_update_range": [1e3 * min(cycles) / len(batches), 1e3 * max(cycles) / len(batches)],
        "tokens_per_s": tokens / cycle, "flops_per_update": flops / len(batches),
        "mfu": flops / cycle / peak["measured"] if peak["measured"] else None,
        "mfu_datasheet": flops / cycle / peak["datasheet"] if peak["datasheet"] else None,
        "syncs_per_update": syncs_per_update(run, batches[0], window),
        **kernel_time(run, batches, window, args.profile_updates),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30
        if device.type == "cuda" else None,
    }  # fmt: skip
    entry["busy"] = entry["kernel_ms_per_update"] / entry["ms_per_update"]
    del run
    return entry


def print_table(entries: list[dict[str, Any]], peak: dict) -> None:
    measured = "n/a" if not peak["measured"] else f"{peak['measured'] / 1e12:.0f}"
    sheet = "n/a" if not peak["datasheet"] else f"{peak['datasheet'] / 1e12:.0f}"
    print(f"\nMFU = 6 x (weight MACs + attention MACs) of the non-pad tokens per update / step "
          f"time / bf16 peak: measured {measured} TFLOP/s (8192^3 torch.mm), datasheet {sheet}")  # fmt: skip
    head = ["preset", "variant", "params", "tok/upd", "ms/upd", "tok/s", "MFU", "sheet", "syncs"]
    head += ["kern ms", "busy", "kern", "peak GiB", "1st s"]
    pct, na = harness.percent, lambda x, f: "n/a" if x is None else format(x, f)  # noqa: E731
    rows = [[e["preset"], e["variant"], f"{e['params'] / 1e6:.1f}M", f"{e['tokens_per_update']:,.0f}",
             f"{e['ms_per_update']:.2f}", f"{e['tokens_per_s']:,.0f}", pct(e["mfu"]),
             pct(e["mfu_datasheet"]), na(e["syncs_per_update"], "d"),
             f"{e['kernel_ms_per_update']:.2f}", pct(e["busy"]), f"{e['kernels_per_update']:.0f}",
             na(e["peak_memory_gib"], ".1f"), f"{e['first_update_s']:.1f}"] for e in entries]  # fmt: skip
    print("\n".join(harness.table(head, rows)))


def add_flags(add: Callable) -> None:
    add("--presets", default="base,big", help="conf/model presets, comma-separated")
    add("--variants", default="bf16,bf16+compile", help="fp32|bf16[+compile], comma-separated")
    add("--batch-tokens", type=int, default=16384, help="tokens per batch, padding counted")
    add("--max-lens", default="28,32,36,40", help="each batch's longest sentence, rotating")
    add("--vocab", type=int, default=32000, help="shared vocabulary (default: 32000)")
    add("--cycles", type=int, default=5, help="timed passes over the batches (median)")
    add("--profile-updates", type=int, default=4, help="updates under the profiler")


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.max_lens, args.seed = [int(n) for n in args.max_lens.split(",")], args.seed or 1
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    peak = bf16_peaks(device) if gpu else {"measured": None, "datasheet": None, "gpu": None}
    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    print(f"device {name}, torch {torch.__version__}, vocab {args.vocab}, "
          f"{args.batch_tokens} batch tokens, max lens {args.max_lens}")  # fmt: skip
    entries = []
    for preset in args.presets.split(","):
        for variant in args.variants.split(","):
            entries.append(e := measure(preset, variant, args, peak))
            print(f"{preset} {variant}: {e['ms_per_update']:.2f} ms/update, "
                  f"MFU {harness.percent(e['mfu'])}, top {e['top_ms_per_update'][:3]}", flush=True)  # fmt: skip
    print_table(entries, peak)
    return {"device": name, "torch": torch.__version__, "peak": peak, "args": vars(args), "entries": entries}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return harness.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
