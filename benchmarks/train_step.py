"""The training step as train.py runs it (`training.loop.train_step`), per preset and variant:
tokens/s, MFU, host syncs, kernel time and busy, peak memory, on random batches whose longest
sentence rotates over `--max-lens` (docs/benchmarks.md, "On a GPU").

    python -m benchmarks.train_step --device cuda --presets base,big --batch-tokens 16384 \\
        --variants bf16,bf16+compile --json step.json
"""

import argparse
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch.autograd import DeviceType

from attnmt.common.runtime import DATASHEET_BF16_FLOPS, datasheet_gpu
from attnmt.data.batching import Batch, collate
from attnmt.data.tokenizer import SpecialIds
from attnmt.model import ModelConfig
from attnmt.training import build, distributed
from attnmt.training.loop import _Window, train_step
from attnmt.training.run import Learner
from attnmt.training.state import seed_everything
from benchmarks import harness

SPECIAL = SpecialIds()  # pad 0, unk 1, bos 2, eos 3: what our tokenizer uses


def train_batch(batch_tokens: int, max_len: int, vocab: int, seed: int) -> Batch:
    """A padded random batch with `B * max(S, T) <= batch_tokens` (S, T count eos / bos)."""
    n, gen = max(1, batch_tokens // (max_len + 1)), torch.Generator().manual_seed(seed)

    def lines() -> list[list[int]]:
        lengths = torch.randint(max(1, max_len // 2), max_len + 1, (n,), generator=gen)
        return [torch.randint(4, vocab, (int(k),), generator=gen).tolist() for k in lengths]

    return collate(lines(), lines(), SPECIAL)


def train_flops(cfg: ModelConfig, batch: Batch) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward), non-pad tokens."""
    D, F, V = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size
    Le, Ld = cfg.n_encoder_layers, cfg.n_decoder_layers
    S = batch.src_ids.ne(SPECIAL.pad).sum(1).double()  # (B,) real source tokens per sentence
    T = batch.tgt_out.ne(SPECIAL.pad).sum(1).double()  # (B,) real target tokens per sentence
    s, t = S.sum().item(), T.sum().item()
    weight_macs = (
        Le * s * (4 * D * D + 2 * D * F)  # encoder: q, k, v, out + FFN on source tokens
        + Ld * t * (4 * D * D + 2 * D * D + 2 * D * F)  # decoder self + cross q/out + FFN
        + Ld * s * 2 * D * D  # cross-attention k, v of the encoder output
        + t * D * V  # output projection
    )
    pairs = Le * (S * S).sum().item() + Ld * (T * T).sum().item() + Ld * (T * S).sum().item()
    return 6.0 * (weight_macs + 2 * D * pairs)  # attention: q k^T and weights @ v


def now(device: torch.device) -> float:
    """The host clock once `device` has done its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def bf16_peaks(device: torch.device, n: int = 8192) -> dict[str, Any]:
    """What MFU divides by: the bf16 FLOP/s of an n x n x n `torch.mm` here (best of 5 after 2
    warm-ups) and the datasheet's dense bf16 peak (None for a GPU it does not know; a CPU)."""
    if device.type != "cuda":
        return {"measured": None, "datasheet": None, "gpu": None}
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    times = harness.interleaved({"mm": lambda: torch.mm(a, a)}, 7, lambda: now(device))["mm"]
    sheet = datasheet_gpu(torch.cuda.get_device_name(device))
    return {"measured": 2 * n**3 / min(times[2:]), "datasheet": DATASHEET_BF16_FLOPS.get(sheet),
            "gpu": sheet}  # fmt: skip


def mfu(flops: float, seconds: float, peaks: dict) -> tuple[float | None, float | None]:
    """Model FLOPs utilisation against the measured and the datasheet peak (None: no peak)."""
    return tuple(flops / seconds / p if p else None for p in (peaks["measured"], peaks["datasheet"]))  # type: ignore[return-value]  # fmt: skip


def learner(preset: str, variant: str, args: argparse.Namespace) -> Learner:
    """What train.py builds for `model=<preset>` on `args.device`, without data."""
    precision, compiled = variant.split("+")[0], variant.endswith("+compile")
    overrides = [f"model={preset}", f"trainer.precision={precision}",
                 f"trainer.max_tokens={args.batch_tokens}", f"trainer.compile={compiled}",
                 f"trainer.device={args.device}", "logger=none"]  # fmt: skip
    cfg, device = harness.train_configs(overrides), torch.device(args.device)
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
    peak, name = (
        bf16_peaks(device),
        harness.cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device),
    )
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
