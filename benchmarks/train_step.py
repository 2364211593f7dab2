"""The training step as train.py runs it (`training.loop.train_step`), per preset and variant:
tokens/s, MFU, host syncs, kernel time and busy, peak memory, on random batches whose longest
sentence rotates over `--max-lens` (docs/benchmarks.md, "On a GPU").

    python -m benchmarks.train_step --device cuda --presets base,big --batch-tokens 16384 \\
        --variants bf16,bf16+compile --json step.json
"""

import argparse
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
from benchmarks.benchmark import (
    SPECIAL,
    bf16_peaks,
    mfu,
    now,
    train_batch,
    train_configs,
    train_flops,
)


def learner(preset: str, variant: str, args: argparse.Namespace) -> Learner:
    """What train.py builds for `model=<preset>` on `args.device`, without data."""
    precision, compiled = harness.variant(variant)
    overrides = [f"model={preset}", f"trainer.precision={precision}",
                 f"trainer.max_tokens={args.batch_tokens}", f"trainer.compile={compiled}",
                 f"trainer.device={args.device}", "logger=none"]  # fmt: skip
    cfg, device = train_configs(overrides), torch.device(args.device)
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
    """Over `updates` profiled updates: the device's kernel time per update (the union of its
    kernel intervals), kernels per update, the five costliest, and the profiled time itself."""
    cuda = run.ctx.device.type == "cuda"
    kinds = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])  # fmt: skip
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    with torch.profiler.profile(activities=kinds) as prof:
        start = now(run.ctx.device)
        for i in range(updates):
            train_step(run, [batches[i % len(batches)]], window)
        wall = now(run.ctx.device) - start
    events = [e for e in prof.events() if e.device_type == kind]
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if cuda or e.cpu_parent is None)  # fmt: skip
    covered, end, per_name = 0.0, float("-inf"), Counter()
    for a, b in spans:  # the union of the intervals, microseconds
        covered, end = covered + max(0.0, b - max(a, end)), max(end, b)
    for e in events:
        per_name[e.name] += e.time_range.elapsed_us()
    top = [(name, round(us / updates / 1e3, 3)) for name, us in per_name.most_common(5)]
    return {"kernel_ms_per_update": covered / 1e3 / updates, "kernels_per_update": len(spans) / updates,
            "profiled_ms_per_update": 1e3 * wall / updates, "top_ms_per_update": top}  # fmt: skip


def measure(preset: str, variant: str, args: argparse.Namespace, peaks: dict) -> dict[str, Any]:
    """One preset x variant: the first update (compiles), timed cycles (an update on each
    batch), syncs, busy (kernel time over the unprofiled step time), memory."""
    device = torch.device(args.device)
    if device.type == "cuda":
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    run = learner(preset, variant, args)
    batches = [train_batch(args.batch_tokens, n, args.vocab, args.seed + i) for i, n in enumerate(args.max_lens)]  # fmt: skip
    batches = [b.pin_memory() for b in batches] if device.type == "cuda" else batches
    window, n = _Window(device), len(batches)
    cycle = lambda parts: [train_step(run, [b], window) for b in parts]  # noqa: E731
    first = harness.interleaved({"first": lambda: cycle(batches[:1])}, 1, lambda: now(device))
    cycle(batches[1:] * 2)  # every shape seen (a compiled step's recompiles) twice
    cycles = harness.interleaved({"c": lambda: cycle(batches)}, args.cycles, lambda: now(device))["c"]  # fmt: skip
    spread, tokens = (
        harness.Spread.of(cycles),
        sum(b.n_src_tokens + b.n_tgt_tokens for b in batches),
    )
    flops = sum(train_flops(run.trainee.model.cfg, b) for b in batches)
    entry = {"preset": preset, "variant": variant, "params": run.trainee.model.num_parameters(),
             "tokens_per_update": tokens / n, "first_update_s": first["first"][0],
             "ms_per_update": 1e3 * spread.median / n,
             "ms_per_update_range": [1e3 * spread.low / n, 1e3 * spread.high / n],
             "tokens_per_s": tokens / spread.median, "flops_per_update": flops / n,
             "syncs_per_update": syncs_per_update(run, batches[0], window),
             **kernel_time(run, batches, window, args.profile_updates),
             "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}  # fmt: skip
    entry["mfu"], entry["mfu_datasheet"] = mfu(flops, spread.median, peaks)
    entry["busy"] = entry["kernel_ms_per_update"] / entry["ms_per_update"]
    return entry


def print_table(entries: list[dict[str, Any]], peak: dict) -> None:
    measured, sheet = (f"{p / 1e12:.0f}" if p else "n/a" for p in (peak["measured"], peak["datasheet"]))  # fmt: skip
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
    peak, name = bf16_peaks(device), harness.device_name(device) if device.type == "cuda" else "cpu"
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


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
