"""Micro-benchmark: training-step throughput of our Transformer beside `torch.nn.Transformer`.

One step = forward + cross-entropy + backward (no optimizer step) on a random batch of
`--batch` sentence pairs, `--len` source and `--len` target tokens each. Throughput counts
source + target tokens. Both models run in the same process with the same sizes, and the
peer gets the same surroundings (shared embedding x sqrt(d), sinusoidal positions with
dropout, tied output projection, padding and causal masks), so the work differs only inside
the two encoder-decoder stacks. Repeats are interleaved (ours, peer, ours, peer, ...) so
machine noise hits both; the median is reported.

`nn.Transformer` uses its one `dropout` on attention weights, after the FFN ReLU and on
sublayer outputs; by default our model gets the same three dropouts so the work matches
(`--preset-dropouts` keeps the preset's `attn_dropout`/`act_dropout` instead). It also always
ends each stack with a LayerNorm (two extra, cheap LayerNorms for post-norm).

Usage:
    python -m benchmarks.bench_model                          # small preset, CPU, 64 x 30
    python -m benchmarks.bench_model --preset base --device cuda --batch 128 --json bench.json
    python -m benchmarks.bench_model --repeats 3 --profile    # + where the time goes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import ModelConfig, SinusoidalPositionalEncoding, Transformer

ROOT = Path(__file__).resolve().parent.parent

PAD = 0

PRESETS = ROOT / "conf" / "model"  # the model presets' one source: conf/model/<name>.yaml


def preset_names() -> list[str]:
    """The presets in conf/model/ (tiny, small, base, big, ...)."""
    return sorted(path.stem for path in PRESETS.glob("*.yaml"))


def load_preset(name: str) -> tuple[dict, str]:
    """ModelConfig fields of conf/model/<name>.yaml, and that path (relative to the repo)."""
    import yaml  # installed with hydra-core

    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"no model preset {path}; choose one of {', '.join(preset_names())}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {k: v for k, v in raw.items() if k in fields}, str(path.relative_to(ROOT))


class PeerModel(nn.Module):
    """`torch.nn.Transformer` inside the same embedding / positions / tied output as ours."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D = cfg.d_model
        self.embed = nn.Embedding(cfg.tgt_vocab_size, D, padding_idx=PAD)  # shared src/tgt
        self.positional = SinusoidalPositionalEncoding(D, cfg.dropout)
        self.transformer = nn.Transformer(
            d_model=D,
            nhead=cfg.n_heads,
            num_encoder_layers=cfg.n_encoder_layers,
            num_decoder_layers=cfg.n_decoder_layers,
            dim_feedforward=cfg.d_ff,
            dropout=cfg.dropout,
            batch_first=True,
            norm_first=cfg.norm_first,
        )
        self.generator = nn.Linear(D, cfg.tgt_vocab_size, bias=False)
        self.generator.weight = self.embed.weight  # tied, as ours
        # Our init, N(0, D^-1/2) with a zero pad row. With nn.Embedding's default N(0, 1), tied
        # to the output, the logits have std ~sqrt(D) and about a quarter of their gradient
        # entries are denormal floats: the output-layer backward matmuls ran ~20x slower on CPU.
        nn.init.normal_(self.embed.weight, mean=0.0, std=D**-0.5)
        with torch.no_grad():
            self.embed.weight[PAD].zero_()
        self.scale = math.sqrt(D)

    def forward(self, src_ids: Tensor, tgt_in: Tensor) -> Tensor:
        src_pad = src_ids.eq(PAD)  # (B, S), True = padding (nn.Transformer's polarity)
        T = tgt_in.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tgt_in.device)  # (T, T)
        x = self.positional(self.embed(src_ids) * self.scale)  # (B, S, D)
        y = self.positional(self.embed(tgt_in) * self.scale)  # (B, T, D)
        pads = {"src_key_padding_mask": src_pad, "memory_key_padding_mask": src_pad}
        hidden = self.transformer(x, y, tgt_mask=causal, tgt_is_causal=True, **pads)  # (B, T, D)
        return self.generator(hidden)  # (B, T, V)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model: nn.Module, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> None:
    model.zero_grad(set_to_none=True)
    logits = model(src, tgt_in)  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
    loss.backward()


def timed_step(model: nn.Module, batch: tuple[Tensor, ...], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    train_step(model, *batch)
    sync(device)
    return time.perf_counter() - start


def profile(
    models: dict[str, nn.Module], batch: tuple[Tensor, ...], device: torch.device, top: int
) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name, model in models.items():
        with torch_profile(activities=activities) as prof:
            train_step(model, *batch)
            sync(device)
        print(f"\n--- profile: {name} (one step, top {top} ops by self time) ---")
        print(prof.key_averages().table(sort_by=sort_by, row_limit=top, max_name_column_width=50))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=preset_names(), default="small")
    parser.add_argument("--batch", type=int, default=64, help="sentence pairs per batch")
    parser.add_argument("--len", type=int, default=30, help="source and target tokens per sentence")
    parser.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per model first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    keep = "keep the preset's attn/act dropout instead of matching nn.Transformer"
    parser.add_argument("--preset-dropouts", action="store_true", help=keep)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="profile one step of each model")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    fields, source = load_preset(args.preset)
    if args.dropout is not None:
        fields["dropout"] = args.dropout
    if not args.preset_dropouts:  # the same three dropouts as nn.Transformer
        fields["attn_dropout"] = fields["act_dropout"] = fields.get("dropout", 0.1)
    cfg = ModelConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, pad_id=PAD, **fields)

    models = {
        "ours": Transformer(cfg).to(device).train(),
        "nn.Transformer": PeerModel(cfg).to(device).train(),
    }
    B, L = args.batch, args.len
    src = torch.randint(1, args.vocab, (B, L), device=device)
    tgt = torch.randint(1, args.vocab, (B, L + 1), device=device)
    batch = (src, tgt[:, :-1], tgt[:, 1:])  # source, target input, target output
    tokens = B * L * 2  # source + target tokens per step

    print(
        f"preset={args.preset} ({source}) d_model={cfg.d_model} heads={cfg.n_heads} "
        f"d_ff={cfg.d_ff} "
        f"layers={cfg.n_encoder_layers}+{cfg.n_decoder_layers} dropout={cfg.dropout} "
        f"attn/act dropout={cfg.attn_dropout}/{cfg.act_dropout} vocab={args.vocab} shared+tied"
    )
    print(
        f"batch={B} x {L}+{L} tokens, device={device}, threads={torch.get_num_threads()}, "
        f"torch {torch.__version__}, warmup={args.warmup}, repeats={args.repeats} (interleaved)"
    )

    for _ in range(args.warmup):
        for model in models.values():
            train_step(model, *batch)
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.repeats):  # ABAB: noise is shared between the two
        for name, model in models.items():
            times[name].append(timed_step(model, batch, device))

    if args.profile:
        profile(models, batch, device, top=15)

    results = {}
    print(
        f"\n{'model':<16}{'params':>12}{'median ms':>12}{'min ms':>10}{'max ms':>10}"
        f"{'tokens/s':>12}"
    )
    for name, model in models.items():
        median = statistics.median(times[name])
        n_params = sum(p.numel() for p in model.parameters())
        results[name] = {
            "params": n_params,
            "times_s": times[name],
            "median_s": median,
            "tokens_per_s": tokens / median,
        }
        print(
            f"{name:<16}{n_params:>12,}{median * 1e3:>12.1f}{min(times[name]) * 1e3:>10.1f}"
            f"{max(times[name]) * 1e3:>10.1f}{tokens / median:>12,.0f}"
        )
    ratio = results["ours"]["tokens_per_s"] / results["nn.Transformer"]["tokens_per_s"]

    if args.json:
        report = {
            "preset": args.preset,
            "preset_source": source,
            "config": dataclasses.asdict(cfg),
            "batch": B,
            "len": L,
            "tokens_per_step": tokens,
            "device": str(device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "warmup": args.warmup,
            "repeats": args.repeats,
            "results": results,
            "ratio_ours_over_peer": ratio,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    print(f"ratio ours/nn.Transformer (tokens/s): {ratio:.3f}")


if __name__ == "__main__":
    main()
