#!/usr/bin/env python
"""Benchmark against peers: training and decoding speed of our Transformer beside Hugging Face
`transformers` (`MarianMTModel`) and `torch.nn.Transformer`, in one process, at identical sizes.

What is timed (each model gets the same random batch, the same precision, the same loss):

* training: one step = forward + label-smoothed (0.1) cross-entropy ignoring pad + backward +
  Adam step; tokens/s counts source + target non-pad tokens; peak memory of a step above the
  resting state (weights, gradients, Adam state): CUDA `max_memory_allocated`, CPU the peak RSS
  (/proc VmHWM, reset through /proc/self/clear_refs, measured after all timings with glibc's
  mmap threshold pinned low so that freed tensors leave the RSS), else 'n/a'.
  Peers: `MarianMTModel` built from a `MarianConfig` of the same sizes (shared + tied
  embeddings, relu, scale_embedding, static sinusoidal positions, post-norm) and
  `torch.nn.Transformer` inside the same embeddings/positions/tied output
  (`PeerModel` below). Both get a copy of our initial weights (Marian's
  through `exporting.hf.to_marian`, the model dimension permuted to fit its [sin | cos]
  position table), so the three run the same numbers; Marian then computes exactly our
  function (checked by the tests); nn.Transformer adds one LayerNorm after each stack.
* decoding: greedy and beam 5 on a fixed batch of random sources. Random weights would stop at
  random lengths, so EOS is forbidden for the first L steps and forced at step L+1 for both:
  ours (`engine.Engine(model)`, what `translate.py` runs) through a wrapper that masks the
  EOS logit while `offset < L` (`max_len_a=0`, `max_len_b=L`: the search forces EOS at the
  budget), `MarianMTModel.generate` through
  `min_new_tokens=L, max_new_tokens=L+1, forced_eos_token_id` (`use_cache=True`,
  `do_sample=False`, the same `num_beams`, length penalty 1, pad/bos suppressed as ours does).
  Every sentence thus gets L tokens + EOS from both (checked); target tokens/s counts L + 1 per
  sentence. CTranslate2 (peer `ctranslate2`, float32 and int8, on our weights through
  `exporting.ct2.export_ct2`) has no forced EOS: it gets `min_decoding_length =
  max_decoding_length = L + 1`, the same number of decoder steps (checked: L + 1 tokens each);
  ours int8 (`engine.Engine(model, "int8")`, what `--quantize int8` runs) decodes beside it.
  `--activation silu --preset base --vocab 58101` gives OPUS-MT en-de's shape.
* real sentences (`--run DIR --src FILE [--ref FILE]`, instead of the above): a trained run's
  `checkpoints/best.pt` decodes the sentences with ours as `translate.py` searches (fp32, and
  `--quantize int8`), `MarianMTModel.generate` on our weights, and CTranslate2 float32 and
  int8, at every `--beams`, batches of `--decode-batch`, `--threads` (default 2) threads; one
  table of sentences/s, sacreBLEU (with `--ref`) and ours / each system
  (`benchmarks.peers`, shared with `benchmarks/export_speed.py`). `--cpu-kinds native,avx2`
  runs every system once more capped to AVX2 (`peers.CPU_KINDS`: environment variables of
  its worker process only), all interleaved in one run, with a table per kind.
* GPU only: bf16 autocast and torch.compile variants, and model FLOPs utilisation (MFU) = achieved
  training FLOP/s over the bf16 matmul peak measured here with a big matmul, and over the datasheet
  bf16 dense peak of the GPU (`DATASHEET_BF16_FLOPS`; "unknown" for other GPUs). Model FLOPs per
  step = 6 x (weight-matrix parameters x the tokens they see: encoder and cross-K/V on source
  tokens, decoder and output layer on target tokens) + 6 x attention score/value matmuls (2 x q_len
  x k_len x d_model per layer and sentence), all on non-pad tokens.

Warm-up calls first, then repeats interleaved with a rotating order (A B C, B C A, ...):
medians, ranges and ratios as docs/benchmarks.md, "How to read the figures", says.
`--batch-tokens` budgets a batch as the trainer does (`B * max(S, T) <= batch_tokens`, padding
included); sentence lengths are uniform in [max_len/2, max_len] on each side.

CPU defaults (a few minutes on 2 cores): preset tiny, 2048-token batches (the default Multi30k
run's), 64 sentences decoded to 24 tokens, fp32 eager. GPU defaults: preset base, 4096- and
16384-token batches, fp32 / bf16 / bf16 + torch.compile.

Usage:
    python -m benchmarks.benchmark                                  # CPU defaults
    python -m benchmarks.benchmark --preset small --batch-tokens 4096 --json bench.json
    python -m benchmarks.benchmark --device cuda --preset base --variants fp32,bf16,bf16+compile
    python -m benchmarks.benchmark --run RUN_DIR --src test2016.en --ref test2016.de --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import gc
import importlib
import json
import math
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnmt.common.errors import UserError, exit_status
from attnmt.common.runtime import DATASHEET_BF16_FLOPS, autocast, datasheet_gpu
from attnmt.data.batching import Batch, collate
from attnmt.data.tokenizer import SpecialIds
from attnmt.decoding.search import SearchConfig, SearchResult, beam_search, greedy_search
from attnmt.engine import Engine
from attnmt.exporting.ct2 import ct2_target_ids, ct2_translate, export_ct2
from attnmt.exporting.hf import check_marian, to_marian
from attnmt.exporting.shared import INSTALL_HINT, require
from attnmt.model import ModelConfig, SinusoidalPositionalEncoding, Transformer
from attnmt.model.config import ACTIVATIONS
from attnmt.training.kernels import label_smoothed_cross_entropy
from benchmarks import peers

ROOT = Path(__file__).resolve().parent.parent

SPECIAL = SpecialIds()  # pad 0, unk 1, bos 2, eos 3: what our tokenizer uses
LABEL_SMOOTHING = 0.1
OURS, MARIAN, TORCH = "ours", "transformers", "nn.Transformer"
CT2 = "ctranslate2"  # the --peers name; decodes at two weight types:
CT2_FP32, CT2_INT8 = "CTranslate2 fp32", "CTranslate2 int8"
OURS_INT8 = "ours int8"  # decoded beside CTranslate2's int8
VARIANTS = ("fp32", "bf16", "fp32+compile", "bf16+compile")
GOALS = {"train": 1.2, "beam5": 2.0}  # targets for ours / transformers on the same device
PRESETS = ROOT / "conf" / "model"  # the model presets' one source: conf/model/<name>.yaml


# ------------------------------------------------------------------------------- models


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
        D, pad = cfg.d_model, SPECIAL.pad
        self.embed = nn.Embedding(cfg.tgt_vocab_size, D, padding_idx=pad)  # shared src/tgt
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
            self.embed.weight[pad].zero_()
        self.scale = math.sqrt(D)

    def forward(self, src_ids: Tensor, tgt_in: Tensor) -> Tensor:
        src_pad = src_ids.eq(SPECIAL.pad)  # (B, S), True = padding (nn.Transformer's polarity)
        T = tgt_in.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tgt_in.device)  # (T, T)
        x = self.positional(self.embed(src_ids) * self.scale)  # (B, S, D)
        y = self.positional(self.embed(tgt_in) * self.scale)  # (B, T, D)
        pads = {"src_key_padding_mask": src_pad, "memory_key_padding_mask": src_pad}
        hidden = self.transformer(x, y, tgt_mask=causal, tgt_is_causal=True, **pads)  # (B, T, D)
        return self.generator(hidden)  # (B, T, V)


def model_config(
    preset: str, vocab: int, preset_dropouts: bool, activation: str = "relu"
) -> tuple[ModelConfig, str]:
    """Our config for a preset. By default every model gets the preset's P_drop on sublayer
    outputs, attention weights and after the FFN ReLU: `nn.Transformer` has one dropout for
    all three, so this is the only setting where the three do the same work."""
    fields, source = load_preset(preset)
    fields["activation"] = activation
    if not preset_dropouts:
        fields["attn_dropout"] = fields["act_dropout"] = fields.get("dropout", 0.1)
    cfg = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=SPECIAL.pad, **fields)
    if cfg.norm_first or not (cfg.share_embeddings and cfg.tie_output):
        raise UserError(
            "the peers are post-norm with shared, tied embeddings; "
            "use a preset with norm_first=false, share_embeddings/tie_output=true"
        )
    return cfg, source


def version(name: str) -> str | None:
    """The installed version of package `name`, None when it does not import."""
    try:
        return importlib.import_module(name).__version__
    except ImportError:
        return None


@torch.no_grad()
def copy_to_torch_peer(ours: Transformer, peer: PeerModel) -> None:
    """Our weights into `nn.Transformer` (same fused q|k|v layout); its final norms stay."""
    peer.embed.weight.copy_(ours.src_embed.weight)

    def layer(dst: nn.Module, src: nn.Module, attns: list[tuple[str, str]]) -> None:
        for dst_name, src_name in attns:
            mha, ours_attn = getattr(dst, dst_name), getattr(src, src_name)
            mha.in_proj_weight.copy_(ours_attn.in_proj.weight)
            mha.in_proj_bias.copy_(ours_attn.in_proj.bias)
            mha.out_proj.load_state_dict(ours_attn.out_proj.state_dict())
        dst.linear1.load_state_dict(src.feed_forward.linear1.state_dict())
        dst.linear2.load_state_dict(src.feed_forward.linear2.state_dict())
        for i, norm in enumerate(src.norms):
            getattr(dst, f"norm{i + 1}").load_state_dict(norm.state_dict())

    t = peer.transformer
    for dst, src in zip(t.encoder.layers, ours.encoder.layers, strict=True):
        layer(dst, src, [("self_attn", "self_attn")])
    for dst, src in zip(t.decoder.layers, ours.decoder.layers, strict=True):
        layer(dst, src, [("self_attn", "self_attn"), ("multihead_attn", "cross_attn")])


def build_models(
    cfg: ModelConfig, peers: list[str], device: torch.device, max_positions: int, seed: int
) -> dict[str, nn.Module]:
    """Ours and the peers, with the same initial weights, on `device`."""
    torch.manual_seed(seed)
    ours = Transformer(cfg)
    models: dict[str, nn.Module] = {OURS: ours}
    if MARIAN in peers:
        # Our weights under Marian's names, the model dimension permuted so that Marian's own
        # [sin | cos] position table is ours (exporting/hf.py): the same function.
        models[MARIAN] = to_marian(ours, SPECIAL, max_positions, attn_implementation="sdpa")
    if TORCH in peers:
        peer = PeerModel(cfg)
        copy_to_torch_peer(ours, peer)
        models[TORCH] = peer
    return {name: model.to(device) for name, model in models.items()}


def forward_fn(name: str, model: nn.Module) -> Callable[[Batch], Tensor]:
    """Teacher-forced logits (B, T, V) of a batch, whatever the model's calling convention."""
    if name == MARIAN:

        def marian_logits(b: Batch) -> Tensor:
            src = {"input_ids": b.src_ids, "attention_mask": b.src_mask}
            return model(**src, decoder_input_ids=b.tgt_in, use_cache=False).logits

        return marian_logits
    return lambda b: model(b.src_ids, b.tgt_in)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Distinct trainable parameters (Marian's frozen position table is not one)."""
    return [p for p in model.parameters() if p.requires_grad]


# --------------------------------------------------------------------------------- data


def random_batch(
    n_sentences: int, max_len: int, vocab: int, gen: torch.Generator
) -> tuple[list[list[int]], list[list[int]]]:
    """Random (source, target) id lists, lengths uniform in [max_len / 2, max_len]."""

    def lines() -> list[list[int]]:
        lengths = torch.randint(max(1, max_len // 2), max_len + 1, (n_sentences,), generator=gen)
        return [torch.randint(4, vocab, (int(n),), generator=gen).tolist() for n in lengths]

    return lines(), lines()


def train_batch(batch_tokens: int, max_len: int, vocab: int, seed: int) -> Batch:
    """A padded batch with `B * max(S, T) <= batch_tokens` (S, T count eos / bos)."""
    n_sentences = max(1, batch_tokens // (max_len + 1))
    src, tgt = random_batch(n_sentences, max_len, vocab, torch.Generator().manual_seed(seed))
    return collate(src, tgt, SPECIAL)


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
    attention_macs = (
        2
        * D
        * (  # q k^T and weights @ v
            Le * (S * S).sum().item() + Ld * (T * T).sum().item() + Ld * (T * S).sum().item()
        )
    )
    return 6.0 * (weight_macs + attention_macs)


# ------------------------------------------------------------------------------ helpers


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(
    runs: dict[str, Callable[[], Any]], repeats: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per call of each run, repeats interleaved (ABC BCA CAB ...): `peers.interleaved`
    with the device synchronised around each call."""
    return peers.interleaved(runs, repeats, lambda: sync(device))


def summary(times: list[float]) -> dict[str, Any]:
    return {"times_s": times, "median_s": statistics.median(times), "min_s": min(times)}


def print_ratios(results: dict[str, dict], unit: str) -> tuple[dict, dict]:
    """Print ours/peer for each peer (last lines of a measurement): the median of the per-repeat
    ratios (each repeat is one round of the interleaving, the same work for all) with their
    min-max range. Returns (medians, ranges)."""
    ratios, ranges = {}, {}
    pairs = [(OURS, name) for name in results if name not in (OURS, OURS_INT8)]
    if OURS_INT8 in results and CT2_INT8 in results:  # int8 against int8
        pairs.append((OURS_INT8, CT2_INT8))
    for mine, name in pairs:
        spread = peers.ratio_spread(results[mine]["times_s"], results[name]["times_s"])
        key = f"{mine}/{name}".replace(f"{OURS}/", "ours/")
        ratios[key] = spread.median
        ranges[key] = spread.as_dict()
        print(f"  ratio {key} ({unit}): {spread.format('.3f')}")
    return ratios, ranges


# --------------------------------------------------------------------------- peak memory


class CpuPeakRss:
    """Peak RSS of a call above the RSS before it: /proc/self/status VmHWM, reset by writing 5
    to /proc/self/clear_refs (Linux). glibc keeps freed heap memory resident, and after the
    first big frees it also raises its mmap threshold, so `prepare()` pins the threshold low:
    tensors are then mmap-ed and returned on free, and the RSS follows live memory. Call it
    only after all timings (it changes how malloc works for the rest of the process)."""

    def __init__(self) -> None:
        self.libc = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._status("VmHWM")
            self.libc = ctypes.CDLL("libc.so.6")
        except (OSError, ValueError):
            pass

    @property
    def available(self) -> bool:
        return self.libc is not None

    @staticmethod
    def _status(field: str) -> int:
        """A /proc/self/status field in bytes."""
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise ValueError(f"no {field} in /proc/self/status")

    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)

    def prepare(self) -> None:
        self.libc.mallopt(self.M_MMAP_THRESHOLD, 64 * 1024)
        self.libc.mallopt(self.M_TRIM_THRESHOLD, 128 * 1024)

    def restore(self) -> None:
        """Where glibc's dynamic thresholds end up after big frees (32 MiB mmap, 2x trim)."""
        self.libc.mallopt(self.M_MMAP_THRESHOLD, 32 * 2**20)
        self.libc.mallopt(self.M_TRIM_THRESHOLD, 64 * 2**20)

    def measure(self, fn: Callable[[], Any]) -> int:
        self.libc.malloc_trim(0)
        before = self._status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        fn()
        return max(0, self._status("VmHWM") - before)


# ------------------------------------------------------------------------------ training


@dataclasses.dataclass
class Setup:
    """What every synthetic measurement shares: the flags (after `resolve_defaults`), our
    config, the device, and on a GPU the bf16 FLOP/s peaks that MFU divides by."""

    args: argparse.Namespace
    cfg: ModelConfig
    device: torch.device
    peak_flops: float | None = None  # measured here (`matmul_peak_flops`)
    sheet_flops: float | None = None  # the datasheet's (`DATASHEET_BF16_FLOPS`)


@dataclasses.dataclass
class Trainee:
    """One model ready for training steps: its (maybe compiled) forward and its optimizer."""

    name: str
    model: nn.Module
    forward: Callable[[Batch], Tensor]
    optimizer: torch.optim.Optimizer
    n_params: int


def make_trainees(models: dict[str, nn.Module], compile_: bool) -> list[Trainee]:
    trainees = []
    for name, model in models.items():
        model.train()
        params = trainable_parameters(model)
        runner = torch.compile(model) if compile_ else model
        optimizer = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        n_params = sum(p.numel() for p in params)
        trainees.append(Trainee(name, model, forward_fn(name, runner), optimizer, n_params))
    return trainees


def train_step(trainee: Trainee, batch: Batch, device: torch.device, precision: str) -> None:
    """Forward, the trainer's label-smoothed loss (per token), backward, Adam step."""
    trainee.optimizer.zero_grad(set_to_none=True)
    with autocast(device, precision):
        logits = trainee.forward(batch)  # (B, T, V)
    out = label_smoothed_cross_entropy(logits, batch.tgt_out, SPECIAL.pad, LABEL_SMOOTHING)
    (out.loss / batch.n_tgt_tokens).backward()
    trainee.optimizer.step()


def cuda_step_memory(trainee: Trainee, batch: Batch, device: torch.device, precision: str) -> dict:
    sync(device)
    resting = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    train_step(trainee, batch, device, precision)
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_mem_mb": (peak - resting) / 2**20, "peak_mem_total_mb": peak / 2**20}


def bench_train(setup: Setup, batch_tokens: int, variant: str) -> dict[str, Any]:
    args, cfg, device = setup.args, setup.cfg, setup.device
    precision, compile_ = variant.split("+")[0], variant.endswith("+compile")
    if compile_:  # start from no compiled graphs: the previous variant's must not count
        torch._dynamo.reset()
    batch = train_batch(batch_tokens, args.max_len, cfg.tgt_vocab_size, args.seed).to(device)
    n_tokens = batch.n_src_tokens + batch.n_tgt_tokens
    flops = train_flops(cfg, batch)
    models = build_models(cfg, args.peers, device, args.max_positions, args.seed)
    trainees = make_trainees(models, compile_)
    B, S = batch.src_ids.shape
    print(
        f"\n== training [{variant}] {batch_tokens} batch tokens: {B} sentences, "
        f"{batch.n_src_tokens}+{batch.n_tgt_tokens} src+tgt tokens (padded {B}x{S} + "
        f"{B}x{batch.tgt_in.size(1)}), fwd+bwd+Adam, warmup {args.warmup}, "
        f"repeats {args.repeats} interleaved"
    )
    for trainee in trainees:
        for _ in range(args.warmup + (2 if compile_ else 0)):  # compile: recompile passes
            train_step(trainee, batch, device, precision)
    runs = {t.name: (lambda t=t: train_step(t, batch, device, precision)) for t in trainees}
    times = interleaved(runs, args.repeats, device)
    results: dict[str, dict] = {}
    for trainee in trainees:
        r = results[trainee.name] = {"params": trainee.n_params, **summary(times[trainee.name])}
        r["tokens_per_s"] = n_tokens / r["median_s"]
        r["peak_mem_mb"] = None
        if device.type == "cuda":
            r.update(cuda_step_memory(trainee, batch, device, precision))
        peak, sheet = setup.peak_flops, setup.sheet_flops
        r["mfu"] = flops / r["median_s"] / peak if peak else None
        r["mfu_datasheet"] = flops / r["median_s"] / sheet if sheet else None
    entry = {
        "variant": variant,
        "batch_tokens": batch_tokens,
        "sentences": B,
        "src_tokens": batch.n_src_tokens,
        "tgt_tokens": batch.n_tgt_tokens,
        "flops_per_step": flops,
        "results": results,
    }
    print_train_table(entry)
    return entry


def print_train_table(entry: dict[str, Any]) -> None:
    head = f"  {'model':<16}{'params':>12}{'median ms':>11}{'min ms':>9}{'tokens/s':>11}"
    head += f"{'peak MB':>9}{'MFU':>10}{'MFU sheet':>11}"
    print(head)
    for name, r in entry["results"].items():
        mem = "n/a" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.0f}"
        mfu = "GPU only" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        sheet = "n/a" if r["mfu_datasheet"] is None else f"{100 * r['mfu_datasheet']:.1f}%"
        print(
            f"  {name:<16}{r['params']:>12,}{r['median_s'] * 1e3:>11.1f}{r['min_s'] * 1e3:>9.1f}"
            f"{r['tokens_per_s']:>11,.0f}{mem:>9}{mfu:>10}{sheet:>11}"
        )
    ours_mem = entry["results"][OURS]["peak_mem_mb"]
    entry["memory_ratios"] = {
        f"ours/{name}": ours_mem / r["peak_mem_mb"]
        for name, r in entry["results"].items()
        if name != OURS and ours_mem and r["peak_mem_mb"]
    }
    for key, value in entry["memory_ratios"].items():
        print(f"  ratio {key} (peak step memory, lower is better): {value:.3f}")
    entry["ratios"], entry["ratio_ranges"] = print_ratios(entry["results"], "training tokens/s")


def cpu_train_memory(setup: Setup, entries: list[dict]) -> None:
    """Peak RSS of one training step per model, after all timings (see `CpuPeakRss`)."""
    meter = CpuPeakRss()
    if not meter.available:
        print("\n(peak CPU memory: n/a, needs Linux /proc/self/clear_refs and glibc)")
        return
    meter.prepare()
    try:
        print("\n== peak memory of a training step above the resting state (CPU: RSS high-water)")
        for entry in entries:
            cpu_entry_memory(setup, entry, meter)
    finally:
        meter.restore()


def cpu_entry_memory(setup: Setup, entry: dict, meter: CpuPeakRss) -> None:
    """One entry's models rebuilt fresh (eager), one resting step, then one measured step."""
    args, cfg, device = setup.args, setup.cfg, setup.device
    precision = entry["variant"].split("+")[0]  # eager: compiling again only for this
    batch = train_batch(entry["batch_tokens"], args.max_len, cfg.tgt_vocab_size, args.seed)
    batch = batch.to(device)
    models = build_models(cfg, args.peers, device, args.max_positions, args.seed)
    trainees = make_trainees(models, compile_=False)
    for trainee in trainees:  # gradients and Adam state exist: the resting state
        train_step(trainee, batch, device, precision)
    gc.collect()
    for trainee in trainees:
        peak = meter.measure(lambda t=trainee: train_step(t, batch, device, precision))
        entry["results"][trainee.name]["peak_mem_mb"] = peak / 2**20
    print(f"\n-- training [{entry['variant']}] {entry['batch_tokens']} batch tokens")
    print_train_table(entry)


# ------------------------------------------------------------------------------ decoding


class FixedLengthModel:
    """Ours with EOS forbidden for the first `min_len` steps (`min_new_tokens` in HF terms):
    with `max_len_b = min_len` the search then forces EOS at step `min_len + 1`."""

    def __init__(self, model: nn.Module, min_len: int) -> None:  # an `Engine` or a `Transformer`
        self.model, self.min_len = model, min_len

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.model.encode(src_ids, src_mask)

    def new_caches(self) -> list:
        return self.model.new_caches()

    def decode(
        self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor, caches: list, offset: int = 0
    ) -> Tensor:
        logits = self.model.decode(tgt_ids, memory, src_mask, caches, offset)  # (N, 1, V)
        if offset < self.min_len:
            logits[..., SPECIAL.eos] = float("-inf")
        return logits


def decode_ours(model: nn.Module, src: Tensor, beam: int, length: int) -> list[list[int]]:
    wrapped = FixedLengthModel(model, length)
    cfg = SearchConfig(beam_size=beam, max_len_a=0.0, max_len_b=length, length_penalty=1.0)
    search = greedy_search if beam == 1 else beam_search
    result: SearchResult = search(wrapped, src, SPECIAL, cfg)
    return result.best_tokens()


# What `decode_marian` passes to every `generate` call besides the batch, the beam and the
# length: our special ids, pad and BOS never generated, EOS forced, one output per sentence.
MARIAN_GENERATE = {
    "do_sample": False,
    "use_cache": True,
    "length_penalty": 1.0,
    "early_stopping": False,
    "num_return_sequences": 1,
    "suppress_tokens": [SPECIAL.pad, SPECIAL.bos],
    "decoder_start_token_id": SPECIAL.bos,
    "eos_token_id": SPECIAL.eos,
    "forced_eos_token_id": SPECIAL.eos,
    "pad_token_id": SPECIAL.pad,
}


def decode_marian(model: nn.Module, src: Tensor, beam: int, length: int) -> list[list[int]]:
    src_mask = src.ne(SPECIAL.pad)  # (B, S)
    lengths = {"min_new_tokens": length, "max_new_tokens": length + 1}
    out = model.generate(
        input_ids=src, attention_mask=src_mask, num_beams=beam, **lengths, **MARIAN_GENERATE
    )  # (B, 1 + length + 1): start token, L tokens, EOS
    if out.size(1) != length + 2 or not out[:, -1].eq(SPECIAL.eos).all():
        raise RuntimeError(f"generate returned {tuple(out.shape)}, not L+1={length + 1} tokens")
    return out[:, 1:-1].tolist()


class IdPieces:
    """What `exporting.ct2.export_ct2` needs of a tokenizer, for random weights without a
    SentencePiece model: id i is the piece "t<i>" (the specials keep their usual names).
    CTranslate2 speaks in pieces; these map them one to one to our ids."""

    NAMES = {SPECIAL.pad: "<pad>", SPECIAL.unk: "<unk>", SPECIAL.bos: "<s>", SPECIAL.eos: "</s>"}

    def __init__(self, vocab: int) -> None:
        self.special = SPECIAL
        self.src_vocab_size = self.tgt_vocab_size = vocab

    def src_pieces(self, ids: Any) -> list[str]:
        return [self.NAMES.get(int(i), f"t{int(i)}") for i in ids]

    tgt_pieces = src_pieces

    def decode_src(self, rows: list[list[int]]) -> list[str]:
        return [" ".join(self.src_pieces(ids)) for ids in rows]

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return [[int(piece[1:]) for piece in text.split()] for text in texts]

    def state_dict(self) -> dict[str, bytes]:
        return {"src_model": b""}  # no SentencePiece model to ship


def ct2_decoders(
    model: Transformer, vocab: int, folder: Path, device: torch.device
) -> dict[str, Callable[[Tensor, int, int], list[list[int]]]]:
    """CTranslate2 float32 and int8 on our weights (`exporting.ct2.export_ct2`, which checks
    the float32 folder against our log-probabilities), decoding a padded source batch to
    exactly L + 1 tokens: `min_decoding_length = max_decoding_length = L + 1` (it has no forced
    EOS), the same number of decoder steps as L tokens + EOS from the others."""
    pieces = IdPieces(vocab)
    target_ids = ct2_target_ids(pieces)
    ctranslate2 = require("ctranslate2")
    threads = torch.get_num_threads()
    decoders = {}
    for quantization, name in (("float32", CT2_FP32), ("int8", CT2_INT8)):
        path = folder / quantization
        export_ct2(model, pieces, path, quantization)
        translator = ctranslate2.Translator(
            str(path), device=device.type, inter_threads=1, intra_threads=threads
        )
        translate = functools.partial(ct2_translate, translator, pieces, target_ids=target_ids)

        def decode(
            src: Tensor, beam: int, length: int, translate: Callable = translate
        ) -> list[list[int]]:
            src_ids = [
                [t for t in row if t not in (SPECIAL.pad, SPECIAL.eos)] for row in src.tolist()
            ]
            cfg = SearchConfig(beam_size=beam, length_penalty=1.0)
            steps = length + 1  # the minimum and the maximum: exactly L + 1 tokens
            return translate(src_ids, cfg, len(src_ids), steps, min_decoding_length=steps)

        decoders[name] = decode
    return decoders


def bench_decode(setup: Setup, precision: str) -> list[dict[str, Any]]:
    args, cfg, device = setup.args, setup.cfg, setup.device
    B = args.decode_batch
    gen = torch.Generator().manual_seed(args.seed + 1)
    src_lines, _ = random_batch(B, args.max_len, cfg.src_vocab_size, gen)
    src = collate(src_lines, src_lines, SPECIAL).src_ids.to(device)  # (B, S): ids + eos, padded
    decoding_peers = [p for p in args.peers if p == MARIAN]  # nn.Transformer has no search
    models = build_models(cfg, decoding_peers, device, args.max_positions, args.seed)
    for model in models.values():
        model.eval()
    base = {OURS: decode_ours, MARIAN: decode_marian}
    decoders = {name: functools.partial(base[name], model) for name, model in models.items()}
    decoders[OURS] = functools.partial(decode_ours, Engine(models[OURS]))  # as translate.py runs
    with contextlib.ExitStack() as stack:
        if CT2 in args.peers and precision == "fp32":
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            decoders.update(ct2_decoders(models[OURS], cfg.src_vocab_size, folder, device))
            # ours int8 (translate.py --quantize int8) beside CTranslate2 int8
            decoders[OURS_INT8] = functools.partial(decode_ours, Engine(models[OURS], "int8"))
        entries = []
        for beam in args.beams:
            entries.append(decode_one(setup, decoders, src, beam, precision))
    return entries


def decode_one(
    setup: Setup, decoders: dict[str, Callable], src: Tensor, beam: int, precision: str
) -> dict[str, Any]:
    args, device = setup.args, setup.device
    B, L = args.decode_batch, args.decode_len
    search = "greedy" if beam == 1 else f"beam{beam}"
    print(
        f"\n== decoding [{precision}] {search}: {B} random sentences (source {src.size(1)} max), "
        f"{L} tokens + EOS each (CTranslate2: {L + 1} tokens, no EOS), KV cache, "
        f"warmup {args.warmup}, repeats {args.repeats} interleaved"
    )

    def run(name: str) -> list[list[int]]:
        with autocast(device, precision), torch.inference_mode():
            return decoders[name](src, beam, L)

    outputs = {name: run(name) for name in decoders}  # warm-up + the output check
    for name in decoders:
        for _ in range(args.warmup - 1):
            run(name)
    for name, hyps in outputs.items():
        steps = L + 1 if name in (CT2_FP32, CT2_INT8) else L  # tokens before EOS (CT2: none)
        if any(len(h) != steps for h in hyps):
            raise RuntimeError(f"{name} {search}: not every output has {steps} tokens")
    runs = {name: (lambda name=name: run(name)) for name in decoders}
    times = interleaved(runs, args.repeats, device)
    results = {}
    print(
        f"  {'model':<18}{'median ms':>11}{'min ms':>9}{'sentences/s (min-max)':>26}"
        f"{'tokens/s':>11}"
    )
    for name in decoders:
        r = results[name] = summary(times[name])
        rate = peers.Spread.of([B / t for t in times[name]])
        r["sentences_per_s"] = B / r["median_s"]
        r["sentences_per_s_range"] = [rate.low, rate.high]
        r["tokens_per_s"] = B * (L + 1) / r["median_s"]
        print(
            f"  {name:<18}{r['median_s'] * 1e3:>11.1f}{r['min_s'] * 1e3:>9.1f}"
            f"{rate.format():>26}{r['tokens_per_s']:>11,.0f}"
        )
    entry = {
        "variant": precision,
        "search": search,
        "beam": beam,
        "batch": B,
        "length": L,
        "results": results,
    }
    if MARIAN in outputs:
        same = sum(a == b for a, b in zip(outputs[OURS], outputs[MARIAN], strict=True))
        entry["same_outputs_as_transformers"] = same / B
        print(f"  same tokens as transformers (same weights): {same}/{B} sentences")
    if CT2_FP32 in outputs:
        same = sum(a == b[:L] for a, b in zip(outputs[OURS], outputs[CT2_FP32], strict=True))
        entry["same_outputs_as_ctranslate2_fp32"] = same / B
        print(f"  same first {L} tokens as CTranslate2 fp32: {same}/{B} sentences")
    entry["ratios"], entry["ratio_ranges"] = print_ratios(results, "decoding tokens/s")
    return entry


# ------------------------------------------------------------------------ real sentences

ATTNMT, ATTNMT_INT8, ATTNMT_MALLOC = "attnmt", "attnmt int8", "attnmt (malloc defaults)"


def bench_real(args: argparse.Namespace) -> dict[str, Any]:
    """A trained model on real sentences: ours, ours int8, transformers and CTranslate2
    fp32/int8 at every --beams, through `benchmarks.peers` (one table)."""
    from attnmt.checkpoint import load_for_inference, resolve_checkpoint
    from attnmt.common.files import read_src_ref
    from attnmt.decoding.config import SearchConfig as Config
    from attnmt.evaluation.bleu import corpus_bleu

    if args.device != "cpu":
        raise UserError("--run measures on the CPU (CTranslate2 and int8 here are CPU builds)")
    path = resolve_checkpoint(args.run)
    model, tokenizer, _ = load_for_inference(path)  # for the exports and checks; timed in workers
    lines, refs = read_src_ref(args.src, args.ref, args.limit)
    if not lines:
        raise UserError(f"--src {args.src} has no sentences")
    src_ids = tokenizer.encode_src([line.strip() for line in lines])
    cfgs = [Config(beam_size=beam, batch_size=args.decode_batch) for beam in args.beams]
    threads, inter = torch.get_num_threads(), args.inter_threads
    parallel = (
        f" ({inter} batches at once, {max(1, threads // inter)} thread(s) each; transformers "
        "one batch at a time)"
        if inter > 1
        else ""
    )
    print(
        f"{path}: {len(src_ids)} sentences of {args.src}; searches "
        f"{', '.join(peers.search_name(b) for b in args.beams)} (translate.py's defaults: "
        f"budget int({cfgs[0].max_len_a} * src_len + {cfgs[0].max_len_b}), length penalty "
        f"{cfgs[0].length_penalty}), batches of {args.decode_batch}, {threads} threads{parallel}; "
        f"torch {torch.__version__}, transformers {version('transformers') or 'not installed'}, "
        f"ctranslate2 {version('ctranslate2') or 'not installed'}; 1 warm-up batch, "
        f"{args.repeats} interleaved repeats, ids in and out (SentencePiece not timed), each "
        f"system in a process of its own; CPU: {peers.cpu_model()}"
    )
    # each system in a process of its own, as users run them (see `peers.Isolated`); with
    # several --cpu-kinds, each system once per kind, all in one interleaved comparison
    systems: dict[str, peers.Isolated] = {}
    kinds = {kind: peers.CPU_KINDS[kind] for kind in args.cpu_kinds}

    def named(name: str, kind: str) -> str:
        return name if kind == args.cpu_kinds[0] else f"{name} [{kind}]"

    ours = [(ATTNMT, "none", True), (ATTNMT_INT8, "int8", True)]  # True: keep_freed_memory
    ours += [(ATTNMT_MALLOC, "none", False)] if args.malloc_defaults else []
    for kind, env in kinds.items():
        for name, quantize, keep_memory in ours:
            systems[named(name, kind)] = peers.Isolated(
                peers.ours_from_checkpoint,
                (str(path), quantize, args.inter_threads, keep_memory),
                threads,
                env["ours"],
            )
    skipped = {}
    if MARIAN in args.peers:
        try:
            require("transformers")  # what the worker would raise, checked here
            check_marian(model.cfg)
            systems[MARIAN] = peers.Isolated(
                peers.transformers_from_checkpoint, (str(path),), threads
            )
        except UserError as e:
            skipped[MARIAN] = str(e)
    with tempfile.TemporaryDirectory() as tmp:
        if CT2 in args.peers:
            for quantization, name in (("float32", CT2_FP32), ("int8", CT2_INT8)):
                folder = Path(tmp) / quantization
                export_ct2(model, tokenizer, folder, quantization)
                for kind, env in kinds.items():
                    systems[named(name, kind)] = peers.Isolated(
                        peers.ct2_from_folder,
                        (str(folder), str(path), threads, args.inter_threads),
                        threads,
                        env["ctranslate2"],
                    )
        for name, reason in skipped.items():
            print(f"{name}: skipped: {reason}")
        cells = peers.compare(systems, src_ids, cfgs, args.repeats)

    def bleu(ids: list[list[int]]) -> float:
        return corpus_bleu(tokenizer.decode_tgt(ids), refs).score

    table: list[str] = []
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in kinds:  # a table per kind: every system against ours on that kind
        ours_name, ours_int8 = named(ATTNMT, kind), named(ATTNMT_INT8, kind)
        if len(kinds) > 1:
            table += [""] if table else []
            table.append(f"CPU kind {kind}: {peers.describe_kind(kind)}")
        kind_table, by_kind[kind] = peers.table(
            cells, ours_name, bleu if refs is not None else None
        )
        table += kind_table
        for beam in args.beams:  # int8 against int8
            for peer in dict.fromkeys((CT2_INT8, named(CT2_INT8, kind))):
                if (ours_int8, beam) in cells and (peer, beam) in cells:
                    ratio = peers.ratio_spread(
                        cells[(ours_int8, beam)].times_s, cells[(peer, beam)].times_s
                    )
                    table.append(
                        f"  {ours_int8} / {peer}, {peers.search_name(beam)}: "
                        f"{ratio.format('.2f', 'x')}"
                    )
    results = by_kind[args.cpu_kinds[0]]
    print("\n" + "\n".join(table))
    report = {
        "meta": {
            "checkpoint": str(path),
            "src": str(args.src),
            "ref": str(args.ref) if refs else None,
            "sentences": len(src_ids),
            "beams": args.beams,
            "batch": args.decode_batch,
            "threads": threads,
            "inter_threads": args.inter_threads,
            "cpu_kinds": args.cpu_kinds,
            "repeats": args.repeats,
            "torch": torch.__version__,
            "transformers": version("transformers"),
            "ctranslate2": version("ctranslate2"),
            "device_name": peers.cpu_model(),
            "platform": platform.platform(),
            "skipped": skipped,
        },
        "bleu_signature": corpus_bleu(["a"], ["a"]).signature if refs is not None else None,
        "systems": results,
        "cpu_kinds": by_kind,
        "table": table,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return report


# ------------------------------------------------------------------------- GPU extras


def matmul_peak_flops(device: torch.device, n: int = 8192, repeats: int = 10) -> float:
    """Measured bf16 matmul FLOP/s (median of `repeats` n x n x n products)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = interleaved({"mm": lambda: a @ b}, repeats, device)["mm"]
    return 2 * n**3 / statistics.median(times)


# ---------------------------------------------------------------------------------- main


def csv(kind: type) -> Callable[[str], list]:
    return lambda text: [kind(x) for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmark.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Defaults marked 'CPU/GPU' depend on --device. Ratios are ours/peer (> 1: ours "
        "faster). Goals: training >= 1.2x and beam-5 decoding >= 2x transformers.",
    )
    add = p.add_argument
    add(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when available)",
    )
    add(
        "--preset",
        choices=preset_names(),
        default=None,
        help="model sizes from conf/model/<preset>.yaml (default: CPU tiny, GPU base)",
    )
    add("--vocab", type=int, default=8000, help="shared vocabulary size (default: 8000)")
    add(
        "--activation",
        choices=ACTIVATIONS,
        default="relu",
        help="feed-forward activation (OPUS-MT's shape: --preset base --vocab 58101 "
        "--activation silu; default: relu)",
    )
    add(
        "--preset-dropouts",
        action="store_true",
        help="keep the preset's attn/act dropout (0) for ours and Marian instead of P_drop "
        "everywhere; nn.Transformer cannot, it keeps one dropout for all three",
    )
    add(
        "--batch-tokens",
        type=csv(int),
        default=None,
        help="comma list of training batch budgets, B * max(S, T) incl. padding "
        "(default: CPU 2048, GPU 4096,16384)",
    )
    add(
        "--max-len",
        type=int,
        default=32,
        help="longest sentence (tokens per side before eos/bos); lengths are uniform in "
        "[max_len/2, max_len] (default: 32)",
    )
    add(
        "--variants",
        type=csv(str),
        default=None,
        help=f"comma list of {', '.join(VARIANTS)}; bf16 = autocast, compile = torch.compile "
        "(default: CPU fp32 (bf16/compile/MFU: GPU only), GPU fp32,bf16,bf16+compile)",
    )
    add("--decode-batch", type=int, default=64, help="sentences decoded at once (default: 64)")
    add(
        "--decode-len",
        type=int,
        default=24,
        help="L: every output gets exactly L tokens + EOS (default: 24)",
    )
    add("--beams", type=csv(int), default=[1, 5], help="beam sizes; 1 = greedy (default: 1,5)")
    add(
        "--peers",
        type=csv(str),
        default=[MARIAN, TORCH, CT2],
        help=f"comma list of {MARIAN} (MarianMTModel, train + decode), {TORCH} (train only) "
        f"and {CT2} (decode only, float32 and int8; CPU) (default: all three)",
    )
    add("--no-train", action="store_true", help="skip the training measurements")
    add("--no-decode", action="store_true", help="skip the decoding measurements")
    add("--warmup", type=int, default=2, help="untimed calls per model first (default: 2)")
    add(
        "--repeats",
        type=int,
        default=None,
        help="timed calls per model, interleaved; medians and min-max ranges are reported "
        "(default: 7; with --run 3)",
    )
    add(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of torch and CTranslate2 (default: torch's; with --run 2)",
    )
    add("--seed", type=int, default=0, help="seed of weights and batches (default: 0)")
    add("--json", type=Path, default=None, metavar="PATH", help="write all results here")
    real = p.add_argument_group(
        "real sentences (--run): a trained model on a test set instead of the synthetic runs"
    )
    real.add_argument(
        "--run",
        type=Path,
        default=None,
        metavar="DIR",
        help="a train.py run dir (its checkpoints/best.pt) or a checkpoint file: decode --src "
        "with ours (fp32 and --quantize int8), transformers and CTranslate2 fp32/int8 at "
        "--beams, batches of --decode-batch, and print one table",
    )
    real.add_argument("--src", type=Path, default=None, help="source sentences, one a line")
    real.add_argument("--ref", type=Path, default=None, help="references: sacreBLEU per cell")
    real.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    real.add_argument(
        "--inter-threads",
        type=int,
        default=1,
        metavar="N",
        help="ours (translate.py --inter-threads N) and CTranslate2 (inter_threads=N) search N "
        "batches at once, the threads divided among them; transformers has no such mode and "
        "searches one batch at a time (default: 1)",
    )
    real.add_argument(
        "--malloc-defaults",
        action="store_true",
        help="also time ours with glibc's default malloc settings instead of keep_freed_memory, "
        "in a worker of its own: what common.memory's choice earns",
    )
    real.add_argument(
        "--cpu-kinds",
        type=csv(str),
        default=["native"],
        help="comma list of CPU kinds to run every system on, interleaved in one run: "
        "native (what this CPU has) and avx2 (ours under ATEN_CPU_CAPABILITY=avx2 "
        "ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2, CTranslate2 under "
        "CT2_FORCE_CPU_ISA=AVX2); a table per kind, the first kind's names unmarked "
        "(default: native)",
    )
    return p


def resolve_defaults(args: argparse.Namespace) -> None:
    if (args.run is None) != (args.src is None):
        raise UserError(
            "--run and --src go together: a trained run dir and the sentences to decode"
        )
    if args.ref is not None and args.run is None:
        raise UserError("--ref needs --run and --src")
    if args.inter_threads < 1:
        raise UserError(f"--inter-threads must be >= 1, got {args.inter_threads}")
    if args.inter_threads > 1 and args.run is None:
        raise UserError("--inter-threads needs --run and --src (real sentences)")
    unknown_kinds = [k for k in args.cpu_kinds if k not in peers.CPU_KINDS]
    if unknown_kinds or not args.cpu_kinds:
        raise UserError(f"--cpu-kinds takes {', '.join(peers.CPU_KINDS)}, got {args.cpu_kinds}")
    if args.malloc_defaults and args.run is None:
        raise UserError("--malloc-defaults needs --run and --src (real sentences)")
    if args.cpu_kinds != ["native"] and args.run is None:
        raise UserError("--cpu-kinds needs --run and --src (real sentences)")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if args.repeats is not None and args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    args.repeats = args.repeats or (3 if args.run else 7)
    if not args.beams or min(args.beams) < 1:
        raise UserError(f"--beams must be beam sizes >= 1, got {args.beams}")
    gpu = args.device.startswith("cuda")
    args.preset = args.preset or ("base" if gpu else "tiny")
    args.batch_tokens = args.batch_tokens or ([4096, 16384] if gpu else [2048])
    args.variants = args.variants or (["fp32", "bf16", "bf16+compile"] if gpu else ["fp32"])
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        raise UserError(f"unknown variant(s) {bad}; use {', '.join(VARIANTS)}")
    args.max_positions = max(128, 2 * (args.max_len + args.decode_len + 2))  # Marian table
    args.warmup = max(1, args.warmup)
    unknown = [p for p in args.peers if p not in (MARIAN, TORCH, CT2)]
    if unknown:
        raise UserError(f"unknown peer(s) {unknown}; use {MARIAN},{TORCH},{CT2}")
    if MARIAN in args.peers and version("transformers") is None:
        print(
            "NOTE: `transformers` is not installed, so the MarianMTModel peer is skipped "
            "(install it with: pip install -e '.[bench]')."
        )
        args.peers = [p for p in args.peers if p != MARIAN]
    if CT2 in args.peers and version("ctranslate2") is None:
        print(
            "NOTE: `ctranslate2` is not installed, so the CTranslate2 columns are skipped "
            f"(install it with: {INSTALL_HINT})."
        )
        args.peers = [p for p in args.peers if p != CT2]


def goals(report: dict[str, Any]) -> dict[str, Any]:
    """The `GOALS` targets against transformers on this device, per measurement."""
    out: dict[str, Any] = {}
    for e in report["train"]:
        ratio = e.get("ratios", {}).get(f"ours/{MARIAN}")
        if ratio is not None:
            key = f"train {e['variant']} {e['batch_tokens']} tokens"
            out[key] = {"ratio": ratio, "goal": GOALS["train"], "met": ratio >= GOALS["train"]}
    for e in report["decode"]:
        ratio = e.get("ratios", {}).get(f"ours/{MARIAN}")
        if ratio is not None and e["beam"] == 5:
            key = f"decode {e['variant']} beam5"
            out[key] = {"ratio": ratio, "goal": GOALS["beam5"], "met": ratio >= GOALS["beam5"]}
    return out


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse flags, run every measurement, print tables; returns the JSON report."""
    args = build_parser().parse_args(argv)
    resolve_defaults(args)
    if args.run and args.threads is None:
        args.threads = 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.run:
        return bench_real(args)
    device = torch.device(args.device)
    cfg, source = model_config(args.preset, args.vocab, args.preset_dropouts, args.activation)
    gpu = device.type == "cuda"
    print(
        f"preset={args.preset} ({source}) d_model={cfg.d_model} heads={cfg.n_heads} "
        f"d_ff={cfg.d_ff} layers={cfg.n_encoder_layers}+{cfg.n_decoder_layers} "
        f"dropout={cfg.dropout} attn/act dropout={cfg.attn_dropout}/{cfg.act_dropout} "
        f"vocab={args.vocab} shared+tied, post-norm"
    )
    print(
        f"device={device} threads={torch.get_num_threads()} torch {torch.__version__} "
        f"transformers {version('transformers') or 'not installed'}; peers: "
        f"{', '.join(args.peers) or 'none'}; variants: {', '.join(args.variants)}"
    )
    if not gpu:
        print("bf16 / torch.compile / MFU: GPU only (skipped on CPU unless --variants asks)")
    peak = sheet_flops = None
    sheet_gpu = "unknown"
    if gpu:
        peak = matmul_peak_flops(device)
        print(f"measured bf16 matmul peak: {peak / 1e12:.1f} TFLOP/s (8192^3, median of 10)")
        sheet_gpu = datasheet_gpu(torch.cuda.get_device_name(device))
        sheet_flops = DATASHEET_BF16_FLOPS.get(sheet_gpu)
        sheet = "unknown" if sheet_flops is None else f"{sheet_flops / 1e12:.0f} TFLOP/s"
        print(f"datasheet bf16 dense peak ({sheet_gpu}): {sheet}")
    cpu_name = platform.processor() or platform.machine()
    device_name = torch.cuda.get_device_name(device) if gpu else cpu_name
    report: dict[str, Any] = {
        "meta": {
            "preset": args.preset,
            "preset_source": source,
            "config": dataclasses.asdict(cfg),
            "device": str(device),
            "device_name": device_name,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": version("transformers"),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "peers": args.peers,
            "variants": args.variants,
            "batch_tokens": args.batch_tokens,
            "max_len": args.max_len,
            "decode_batch": args.decode_batch,
            "decode_len": args.decode_len,
            "beams": args.beams,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "label_smoothing": LABEL_SMOOTHING,
        },
        "peak_bf16_flops": peak,
        "datasheet_gpu": sheet_gpu,
        "datasheet_bf16_flops": sheet_flops,
        "train": [],
        "decode": [],
    }
    setup = Setup(args, cfg, device, peak, sheet_flops)
    if not args.no_train:
        for variant in args.variants:
            for batch_tokens in args.batch_tokens:
                report["train"].append(bench_train(setup, batch_tokens, variant))
    if not args.no_decode:
        for precision in dict.fromkeys(v.split("+")[0] for v in args.variants):
            report["decode"] += bench_decode(setup, precision)
    if report["train"] and not gpu:
        cpu_train_memory(setup, report["train"])
    report["goals"] = goals(report)
    if report["goals"]:
        print(f"\n== goals vs transformers on {device} (ours/transformers)")
        for key, g in report["goals"].items():
            met = "met" if g["met"] else "NOT met"
            print(f"  {key}: {g['ratio']:.2f}x (goal >= {g['goal']}x): {met}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return report


def main(argv: list[str] | None = None) -> int:
    return exit_status("benchmark.py", lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
