"""The training step as train.py runs it (`training.loop.train_step`: fused Adam, the trainer's
label-smoothed loss, gradient clipping, the default config's weight average (EMA), no host
reads), timed per model preset and variant, with what keeps the device from being busy:

    python -m benchmarks.train_step --device cuda --presets base,big --batch-tokens 16384 \\
        --variants bf16,bf16+compile --json step.json

Per preset x variant (eager, or `trainer.compile=true`: each layer compiled):
- tokens/s: the non-pad source + target tokens of the timed updates over their time;
- MFU: model FLOPs per update (`benchmark.train_flops`: 6 x (weight MACs + attention MACs) of
  the non-pad tokens) / step time / the bf16 peak of an 8192^3 `torch.mm` measured here, and
  over the datasheet's dense bf16 peak;
- syncs/update: host waits for the device in one update (CUDA's sync debug mode; on a CPU the
  host reads of `tests.host_reads` in an eager update);
- kernel ms/update: the union of the device's kernel intervals (`torch.profiler`) per update,
  and busy: that over the (unprofiled) step time; kernels per update; the top kernels go to the
  JSON;
- peak memory (`torch.cuda.max_memory_allocated`; a CPU has none to report).
Batches are random ids (lengths uniform in [max_len/2, max_len], max_len rotating over
`--max-lens`, a new shape each update), pinned on the host and copied as training copies them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings
from collections import Counter
from types import SimpleNamespace
from typing import Any

import torch
from torch.autograd import DeviceType

from attnmt.training import build, distributed
from attnmt.training.loop import _Window, train_step
from attnmt.training.run import Learner
from attnmt.training.state import seed_everything
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


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def print_table(entries: list[dict[str, Any]], peak: dict) -> None:
    measured = "n/a" if not peak["measured"] else f"{peak['measured'] / 1e12:.0f}"
    sheet = "n/a" if not peak["datasheet"] else f"{peak['datasheet'] / 1e12:.0f}"
    print(f"\nMFU = 6 x (weight MACs + attention MACs) of the non-pad tokens per update / step "
          f"time / bf16 peak: measured {measured} TFLOP/s (8192^3 torch.mm), datasheet {sheet}")  # fmt: skip
    print(f"{'preset':<7}{'variant':<14}{'params':>8}{'tok/upd':>9}{'ms/upd':>9}{'tok/s':>11}"
          f"{'MFU':>7}{'sheet':>7}{'syncs':>6}{'kern ms':>8}{'busy':>7}{'kern':>6}{'peak GiB':>9}"
          f"{'1st s':>7}")  # fmt: skip
    for e in entries:
        memory = "n/a" if e["peak_memory_gib"] is None else f"{e['peak_memory_gib']:.1f}"
        syncs = "n/a" if e["syncs_per_update"] is None else str(e["syncs_per_update"])
        print(
            f"{e['preset']:<7}{e['variant']:<14}{e['params'] / 1e6:>7.1f}M"
            f"{e['tokens_per_update']:>9,.0f}{e['ms_per_update']:>9.2f}{e['tokens_per_s']:>11,.0f}"
            f"{_pct(e['mfu']):>7}{_pct(e['mfu_datasheet']):>7}{syncs:>6}"
            f"{e['kernel_ms_per_update']:>8.2f}{_pct(e['busy']):>7}"
            f"{e['kernels_per_update']:>6.0f}{memory:>9}{e['first_update_s']:>7.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add = parser.add_argument
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add("--presets", default="base,big", help="conf/model presets, comma-separated")
    add("--variants", default="bf16,bf16+compile", help="fp32|bf16[+compile], comma-separated")
    add("--batch-tokens", type=int, default=16384, help="tokens per batch, padding counted")
    add("--max-lens", default="28,32,36,40", help="each batch's longest sentence, rotating")
    add("--vocab", type=int, default=32000, help="shared vocabulary (default: 32000)")
    add("--cycles", type=int, default=5, help="timed passes over the batches (median)")
    add("--profile-updates", type=int, default=4, help="updates under the profiler")
    add("--seed", type=int, default=1)
    add("--json", help="write the entries and the peaks here")
    args = parser.parse_args(argv)
    args.max_lens = [int(n) for n in args.max_lens.split(",")]
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    peak = bf16_peaks(device) if gpu else {"measured": None, "datasheet": None, "gpu": None}
    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    print(f"device {name}, torch {torch.__version__}, vocab {args.vocab}, "
          f"{args.batch_tokens} batch tokens, max lens {args.max_lens}")  # fmt: skip
    entries = []
    for preset in args.presets.split(","):
        for variant in args.variants.split(","):
            entries.append(measure(preset, variant, args, peak))
            e = entries[-1]
            print(f"{preset} {variant}: {e['ms_per_update']:.2f} ms/update, "
                  f"MFU {_pct(e['mfu'])}, top {e['top_ms_per_update'][:3]}", flush=True)  # fmt: skip
    print_table(entries, peak)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": name, "torch": torch.__version__, "peak": peak,
                       "args": vars(args), "entries": entries}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
