"""Ours against its peers, `MarianMTModel` (transformers) and CTranslate2, on the same weights.
With `--run DIR --src FILE [--ref FILE]`: a trained model decodes real sentences, ours as
translate.py runs it (fp32, int8), each system in a process of its own (`benchmarks.peers`).
Without `--run`: the training step (forward, label-smoothed loss, backward, Adam) of ours and
`MarianMTModel` on one random batch; on a GPU also bf16, torch.compile and MFU. Ratios: ours /
peer per repeat. Explained with today's figures in docs/benchmarks.md.

    python -m benchmarks.benchmark --run RUN_DIR --src test2016.en --ref test2016.de \\
        --peers ctranslate2 --limit 512 --repeats 3 --threads 2 --cpu-kinds native,avx2
    python -m benchmarks.benchmark --variants fp32,bf16 --peers transformers --repeats 5
    python -m benchmarks.benchmark --device cuda --preset base --variants fp32,bf16,bf16+compile
"""

import argparse
import dataclasses
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnmt.common.errors import UserError
from attnmt.common.runtime import DATASHEET_BF16_FLOPS, autocast, datasheet_gpu
from attnmt.data.batching import Batch, collate
from attnmt.data.tokenizer import SpecialIds
from attnmt.exporting.ct2 import export_ct2
from attnmt.exporting.hf import check_marian, to_marian
from attnmt.exporting.shared import INSTALL_HINT, require
from attnmt.model import ModelConfig, Transformer
from attnmt.model.config import ACTIVATIONS
from attnmt.training.kernels import label_smoothed_cross_entropy, use_fast_dropout
from benchmarks import harness, peers

ROOT = harness.ROOT
PRESETS = ROOT / "conf" / "model"  # the model presets' one source: conf/model/<name>.yaml
SPECIAL = SpecialIds()  # pad 0, unk 1, bos 2, eos 3: what our tokenizer uses
LABEL_SMOOTHING = 0.1
OURS, MARIAN, CT2 = "ours", "transformers", "ctranslate2"  # CT2: the --peers name
CT2_FP32, CT2_INT8 = "CTranslate2 fp32", "CTranslate2 int8"
ATTNMT, ATTNMT_INT8, UNPACKED = "attnmt", "attnmt int8", "attnmt unpacked"
VARIANTS = ("fp32", "bf16", "fp32+compile", "bf16+compile")


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESETS.glob("*.yaml"))


def train_configs(overrides: list[str]) -> Any:
    """train.py's `Configs` for these command-line overrides (its conf/, composed by Hydra)."""
    from hydra import compose, initialize_config_dir

    from attnmt.training.config import Configs

    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        return Configs.from_hydra(compose("train", overrides=overrides))


def model_config(preset: str, vocab: int, activation: str = "relu") -> tuple[ModelConfig, str]:
    """Our config for conf/model/<preset>.yaml (P_drop everywhere), and that path."""
    import yaml  # installed with hydra-core

    path = PRESETS / f"{preset}.yaml"
    if not path.is_file():
        raise UserError(f"no model preset {path}; choose one of {', '.join(preset_names())}")
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    fields = {
        k: v for k, v in (yaml.safe_load(path.read_text("utf-8")) or {}).items() if k in names
    }
    fields["attn_dropout"] = fields["act_dropout"] = fields.get("dropout", 0.1)
    cfg = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=SPECIAL.pad,
                      activation=activation, **fields)  # fmt: skip
    if cfg.norm_first or not (cfg.share_embeddings and cfg.tie_output):
        raise UserError("the peer is post-norm with shared, tied embeddings; use a preset with "
                        "norm_first=false, share_embeddings/tie_output=true")  # fmt: skip
    return cfg, str(path.relative_to(ROOT))


def build_models(
    cfg: ModelConfig, peer_names: list[str], device: torch.device, max_positions: int, seed: int
) -> dict[str, nn.Module]:
    """Ours and `MarianMTModel` (when named) with the same initial weights, computing the same
    function (`exporting.hf.to_marian`: Marian's [sin | cos] position table is ours)."""
    torch.manual_seed(seed)
    models: dict[str, nn.Module] = {OURS: use_fast_dropout(Transformer(cfg))}  # as training does
    if MARIAN in peer_names:
        models[MARIAN] = to_marian(models[OURS], SPECIAL, max_positions, attn_implementation="sdpa")  # fmt: skip
    return {name: model.to(device) for name, model in models.items()}


def forward_fn(name: str, model: nn.Module) -> Callable[[Batch], Tensor]:
    """Teacher-forced logits (B, T, V) of a batch, whatever the model's calling convention."""
    if name != MARIAN:
        return lambda b: model(b.src_ids, b.tgt_in)
    return lambda b: model(input_ids=b.src_ids, attention_mask=b.src_mask,
                           decoder_input_ids=b.tgt_in, use_cache=False).logits  # fmt: skip


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Distinct trainable parameters (Marian's frozen position table is not one)."""
    return [p for p in model.parameters() if p.requires_grad]


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


def trainee(name: str, model: nn.Module, compiled: bool, device: torch.device, precision: str) -> tuple[Callable[[Batch], None], int]:  # fmt: skip
    """One model's training step (forward, the trainer's label-smoothed loss per token,
    backward, Adam), maybe compiled, and its number of trainable parameters."""
    params = trainable_parameters(model.train())
    forward = forward_fn(name, torch.compile(model) if compiled else model)
    optimizer = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(batch: Batch) -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            logits = forward(batch)  # (B, T, V)
        out = label_smoothed_cross_entropy(logits, batch.tgt_out, SPECIAL.pad, LABEL_SMOOTHING)
        (out.loss / batch.n_tgt_tokens).backward()
        optimizer.step()

    return step, sum(p.numel() for p in params)


def bench_train(args: argparse.Namespace, cfg: ModelConfig, batch_tokens: int, variant: str, peaks: dict) -> dict[str, Any]:  # fmt: skip
    """Ours and the peer's training step on one batch budget and variant, interleaved; the
    table, and ours / the peer (median and range of per-repeat ratios)."""
    device, (precision, compiled) = torch.device(args.device), harness.variant(variant)
    if compiled:  # start from no compiled graphs: the previous variant's must not count
        torch._dynamo.reset()
    batch = train_batch(batch_tokens, args.max_len, cfg.tgt_vocab_size, args.seed).to(device)
    models = build_models(cfg, args.peers, device, args.max_positions, args.seed)
    trainees = {name: trainee(name, m, compiled, device, precision) for name, m in models.items()}
    (B, S), flops, tokens = batch.src_ids.shape, train_flops(cfg, batch), batch.n_src_tokens + batch.n_tgt_tokens  # fmt: skip
    print(f"\n== training [{variant}] {batch_tokens} batch tokens: {B} sentences, "
          f"{batch.n_src_tokens}+{batch.n_tgt_tokens} src+tgt tokens (padded {B}x{S} + "
          f"{B}x{batch.tgt_in.size(1)}), fwd+bwd+Adam, warmup {args.warmup}, "
          f"repeats {args.repeats} interleaved")  # fmt: skip
    runs = {name: (lambda step=step: step(batch)) for name, (step, _) in trainees.items()}
    for _ in range(args.warmup + (2 if compiled else 0)):  # compile: recompile passes
        harness.interleaved(runs, 1)
    times = harness.interleaved(runs, args.repeats, lambda: now(device))
    results, rows = {}, []
    for name, (_, n_params) in trainees.items():
        spread = harness.Spread.of(times[name])
        r = results[name] = {"params": n_params, "times_s": times[name], "median_s": spread.median,
                             "min_s": spread.low, "tokens_per_s": tokens / spread.median}  # fmt: skip
        r["mfu"], r["mfu_datasheet"] = mfu(flops, spread.median, peaks)
        rows.append([name, f"{n_params:,}", f"{r['median_s'] * 1e3:.1f}", f"{r['min_s'] * 1e3:.1f}",
                     f"{r['tokens_per_s']:,.0f}", harness.percent(r["mfu"]), harness.percent(r["mfu_datasheet"])])  # fmt: skip
    print("\n".join(harness.table(["model", "params", "median ms", "min ms", "tokens/s", "MFU", "MFU sheet"], rows)))  # fmt: skip
    entry = {"variant": variant, "batch_tokens": batch_tokens, "sentences": B,
             "src_tokens": batch.n_src_tokens, "tgt_tokens": batch.n_tgt_tokens,
             "flops_per_step": flops, "results": results, "ratios": {}, "ratio_ranges": {}}  # fmt: skip
    for name in [n for n in results if n != OURS]:
        spread = harness.ratio_spread(times[OURS], times[name])
        entry["ratios"][f"ours/{name}"] = spread.median
        entry["ratio_ranges"][f"ours/{name}"] = spread.as_dict()
        print(f"  ratio ours/{name} (training tokens/s): {spread.format('.3f')}")
    return entry


def bench_training(args: argparse.Namespace) -> dict[str, Any]:
    """Every --variants x --batch-tokens training measurement, and the report."""
    device = torch.device(args.device)
    cfg, source = model_config(args.preset, args.vocab, args.activation)
    gpu, peaks = device.type == "cuda", bf16_peaks(device)
    print(f"preset={args.preset} ({source}) d_model={cfg.d_model} heads={cfg.n_heads} "
          f"d_ff={cfg.d_ff} layers={cfg.n_encoder_layers}+{cfg.n_decoder_layers} "
          f"dropout={cfg.dropout} attn/act dropout={cfg.attn_dropout}/{cfg.act_dropout} "
          f"vocab={args.vocab} shared+tied, post-norm; device={device} "
          f"threads={torch.get_num_threads()} torch {torch.__version__} "
          f"transformers {harness.version('transformers') or 'not installed'}; peers: "
          f"{', '.join(args.peers) or 'none'}; variants: {', '.join(args.variants)}")  # fmt: skip
    if gpu:
        print(f"bf16 matmul peak: measured {peaks['measured'] / 1e12:.1f} TFLOP/s (8192^3), "
              f"datasheet ({peaks['gpu']}) {(peaks['datasheet'] or 0) / 1e12:.0f} TFLOP/s")  # fmt: skip
    meta = {"preset": args.preset, "preset_source": source, "config": dataclasses.asdict(cfg),
            "device": str(device), "device_name": harness.device_name(device),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": harness.version("transformers"), "python": platform.python_version(),
            "platform": platform.platform(), "peers": args.peers, "variants": args.variants,
            "batch_tokens": args.batch_tokens, "max_len": args.max_len,
            "warmup": args.warmup, "repeats": args.repeats, "label_smoothing": LABEL_SMOOTHING}  # fmt: skip
    train = [bench_train(args, cfg, n, v, peaks) for v in args.variants for n in args.batch_tokens]
    return {"meta": meta, "peak_bf16_flops": peaks["measured"], "datasheet_gpu": peaks["gpu"] or "unknown",
            "datasheet_bf16_flops": peaks["datasheet"], "train": train}  # fmt: skip


def real_systems(args: argparse.Namespace, path: Path, model: Transformer, tokenizer: Any, tmp: Path, label: str = "") -> tuple[dict[str, peers.Isolated], dict[str, str]]:  # fmt: skip
    """Every system of a --run comparison, each for a process of its own, on every --cpu-kinds
    (the first kind's names unmarked; a later --run's with its `label`), and the peers skipped
    with why."""
    threads, systems, skipped = torch.get_num_threads(), {}, {}
    ours = [(ATTNMT, "none", None), (ATTNMT_INT8, "int8", None)]
    for kind in args.cpu_kinds:
        for name, quantize, pack in ours + ([(UNPACKED, "none", False)] if args.unpacked else []):
            flags = (str(path), quantize, args.inter_threads, args.precision if quantize == "none" else "fp32", pack)  # fmt: skip
            env = peers.CPU_KINDS[kind]["ours"]
            systems[kind_name(args, name, kind, label)] = peers.Isolated(peers.ours_from_checkpoint, flags, threads, env)  # fmt: skip
    if MARIAN in args.peers:
        try:
            require("transformers")  # what the worker would raise, checked here
            check_marian(model.cfg)
            systems[kind_name(args, MARIAN, args.cpu_kinds[0], label)] = peers.Isolated(peers.transformers_from_checkpoint, (str(path),), threads)  # fmt: skip
        except UserError as e:
            skipped[kind_name(args, MARIAN, args.cpu_kinds[0], label)] = str(e)
    for quantization, name in ((("float32", CT2_FP32), ("int8", CT2_INT8)) if CT2 in args.peers else ()):  # fmt: skip
        export_ct2(model, tokenizer, folder := tmp / label / quantization, quantization)
        for kind in args.cpu_kinds:
            flags = (str(folder), str(path), threads, args.inter_threads)
            env = peers.CPU_KINDS[kind]["ctranslate2"]
            systems[kind_name(args, name, kind, label)] = peers.Isolated(peers.ct2_from_folder, flags, threads, env)  # fmt: skip
    return systems, skipped


def kind_name(args: argparse.Namespace, name: str, kind: str, label: str = "") -> str:
    name = f"{name} ({label})" if label else name
    return name if kind == args.cpu_kinds[0] else f"{name} [{kind}]"


def real_tables(args: argparse.Namespace, cells: dict, bleu: Callable | None, same_vocab: Callable) -> tuple[list[str], dict[str, Any]]:  # fmt: skip
    """A table per CPU kind (every system against ours on that kind), with int8 against int8."""
    table: list[str] = []
    by_kind: dict[str, Any] = {}
    for kind in args.cpu_kinds:
        ours_int8 = kind_name(args, ATTNMT_INT8, kind)
        if len(args.cpu_kinds) > 1:
            env = {who: " ".join(f"{k}={v}" for k, v in pairs) or "no cap" for who, pairs in peers.CPU_KINDS[kind].items()}  # fmt: skip
            table += [""] if table else []
            table.append(f"CPU kind {kind}: ours under {env['ours']}, CTranslate2 [{kind}] under {env['ctranslate2']}")  # fmt: skip
        kind_table, by_kind[kind] = peers.table(cells, kind_name(args, ATTNMT, kind), bleu, same_vocab)  # fmt: skip
        table += kind_table
        every = [kind_name(args, CT2_INT8, k, label) for k in (args.cpu_kinds[0], kind) for label in args.labels]  # fmt: skip
        for beam in args.beams:
            for peer in dict.fromkeys(every):
                if (ours_int8, beam) in cells and (peer, beam) in cells:
                    mine, theirs = cells[(ours_int8, beam)], cells[(peer, beam)]
                    ratio = harness.ratio_spread(mine.times_s, theirs.times_s).format(".2f", "x")
                    table.append(f"  {ours_int8} / {peer}, {peers.search_name(beam)}: {ratio}")
    return table, by_kind


def run_labels(runs: list[Path]) -> list[str]:
    """None for the first --run, then each later run's folder (or checkpoint) name, unique."""
    labels = [""]
    for i, run in enumerate(runs[1:], 2):
        name = run.name if run.is_dir() or run.suffix != ".pt" else f"{run.parent.name}/{run.stem}"
        labels.append(name if name and name not in labels else f"{name or 'run'} #{i}")
    return labels


def bench_real(args: argparse.Namespace) -> dict[str, Any]:
    """Every system of every --run at every --beams, each in a process of its own (one table
    per CPU kind, ratios against the first run's ours)."""
    from attnmt.checkpoint import load_for_inference, resolve_checkpoint
    from attnmt.common.files import read_src_ref
    from attnmt.decoding.config import SearchConfig
    from attnmt.evaluation.bleu import corpus_bleu

    if args.device != "cpu":
        raise UserError("--run measures on the CPU (CTranslate2 and int8 here are CPU builds)")
    paths, args.labels = [resolve_checkpoint(run) for run in args.run], run_labels(args.run)
    lines, refs = read_src_ref(args.src, args.ref, args.limit)
    if not lines:
        raise UserError(f"--src {args.src} has no sentences")
    threads, inter = torch.get_num_threads(), args.inter_threads
    meta = {"checkpoint": str(paths[0]), "runs": dict(zip(args.labels, map(str, paths), strict=True)),
            "src": str(args.src), "ref": str(args.ref) if refs else None,
            "sentences": len(lines), "beams": args.beams, "batch": args.decode_batch,
            "threads": threads, "inter_threads": inter, "cpu_kinds": args.cpu_kinds,
            "precision": args.precision, "unpacked": args.unpacked,
            "repeats": args.repeats, "torch": torch.__version__,
            "transformers": harness.version("transformers"), "ctranslate2": harness.version("ctranslate2"),
            "device_name": harness.cpu_model(), "platform": platform.platform(),
            "code": harness.code_under_test(), "skipped": {}}  # fmt: skip
    print(f"{', '.join(map(str, paths))}: {len(lines)} sentences of {args.src}, searched as "
          f"translate.py does (ours in {args.precision}, int8 in int8/fp32) "
          f"in batches of {args.decode_batch} on {threads} threads"
          + (f" ({inter} batches at once; transformers one at a time)" if inter > 1 else "")
          + f"; {args.repeats} interleaved repeats, ids in and out, each system in a process of "
          f"its own; CPU: {meta['device_name']}; torch {meta['torch']}, transformers "
          f"{meta['transformers']}, ctranslate2 {meta['ctranslate2']}; code: {meta['code']}")  # fmt: skip
    systems, src_ids, tokenizers = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in zip(args.labels, paths, strict=True):
            model, tokenizer, _ = load_for_inference(path)  # for exports, checks; timed in workers
            mine, skipped = real_systems(args, path, model, tokenizer, Path(tmp), label)
            systems.update(mine)
            meta["skipped"].update(skipped)
            src_ids.update(dict.fromkeys(mine, tokenizer.encode_src([s.strip() for s in lines])))
            tokenizers.update(dict.fromkeys(mine, tokenizer))
        for name, reason in meta["skipped"].items():
            print(f"{name}: skipped: {reason}")
        cfgs = [SearchConfig(beam_size=beam, batch_size=args.decode_batch) for beam in args.beams]
        cells = peers.compare(systems, src_ids, cfgs, args.repeats)
    bleu = lambda name, ids: corpus_bleu(tokenizers[name].decode_tgt(ids), refs).score  # noqa: E731
    same_vocab = lambda name: tokenizers[name] is tokenizers[ATTNMT]  # noqa: E731  # a later run's: its own
    table, by_kind = real_tables(args, cells, bleu if refs is not None else None, same_vocab)
    print("\n" + "\n".join(table))
    signature = corpus_bleu(["a"], ["a"]).signature if refs is not None else None
    return {"meta": meta, "bleu_signature": signature, "systems": by_kind[args.cpu_kinds[0]],
            "cpu_kinds": by_kind, "table": table}  # fmt: skip


def add_flags(add: Callable) -> None:
    csv, kinds = harness.csv, ", ".join(peers.CPU_KINDS)
    # fmt: off
    add("--peers", type=csv(str), default=[MARIAN, CT2], help=f"comma list of {MARIAN} (training and --run) and {CT2} (--run) (default: both)")  # noqa: E501
    add("--preset", choices=preset_names(), default=None, help="training: conf/model/<preset>.yaml (default: CPU tiny, GPU base)")  # noqa: E501
    add("--vocab", type=int, default=8000, help="training: shared vocabulary (default: 8000)")
    add("--activation", choices=ACTIVATIONS, default="relu", help="training: FFN activation")
    add("--batch-tokens", type=csv(int), default=None, help="training: batch budgets, B * max(S, T) (default: CPU 2048, GPU 4096,16384)")  # noqa: E501
    add("--max-len", type=int, default=32, help="training: lengths in [max_len/2, max_len]")
    add("--variants", type=csv(str), default=None, help=f"training: {', '.join(VARIANTS)} (default: CPU fp32, GPU fp32,bf16,bf16+compile)")  # noqa: E501
    add("--warmup", type=int, default=2, help="training: untimed steps first (default: 2)")
    add("--run", type=Path, action="append", default=[], metavar="DIR", help="a train.py run dir or checkpoint: decode --src with ours (fp32, int8) and the --peers; repeated: every run (its own tokenizer) in one table, ratios against the first")  # noqa: E501
    add("--src", type=Path, default=None, help="source sentences, one a line")
    add("--ref", type=Path, default=None, help="references: sacreBLEU per cell")
    add("--limit", type=int, default=0, help="first N sentences only (0: all)")
    add("--beams", type=csv(int), default=[1, 5], help="beam sizes; 1 = greedy (default: 1,5)")
    add("--decode-batch", type=int, default=64, help="sentences per batch (default: 64)")
    add("--inter-threads", type=int, default=1, metavar="N", help="ours and CTranslate2 search N batches at once, the threads divided (default: 1)")  # noqa: E501
    add("--cpu-kinds", type=csv(str), default=["native"], help=f"run every system on each of {kinds} (peers.CPU_KINDS' environment caps the instruction sets); a table per kind (default: native)")  # noqa: E501
    add("--precision", choices=("fp32", "bf16"), default="fp32", help="ours' float systems decode under this autocast, as translate.py --precision")  # noqa: E501
    add("--unpacked", action="store_true", help=f"ours once more with the engine's packed paths off: '{UNPACKED}'")  # noqa: E501
    # fmt: on


def resolve_defaults(args: argparse.Namespace) -> None:
    """The flags checked together, and the defaults of the device and mode."""
    if (not args.run) != (args.src is None):
        raise UserError("--run and --src go together: a trained run dir and the sentences to decode")  # fmt: skip
    if args.ref is not None and not args.run:
        raise UserError("--ref needs --run and --src")
    if args.inter_threads < 1:
        raise UserError(f"--inter-threads must be >= 1, got {args.inter_threads}")
    if not args.cpu_kinds or any(k not in peers.CPU_KINDS for k in args.cpu_kinds):
        raise UserError(f"--cpu-kinds takes {', '.join(peers.CPU_KINDS)}, got {args.cpu_kinds}")
    real = {"--inter-threads": args.inter_threads > 1, "--cpu-kinds": args.cpu_kinds != ["native"],
            "--precision": args.precision != "fp32", "--unpacked": args.unpacked}  # fmt: skip
    for flag in [flag for flag, given in real.items() if given and not args.run]:
        raise UserError(f"{flag} needs --run and --src (real sentences)")
    if not args.beams or min(args.beams) < 1:
        raise UserError(f"--beams must be beam sizes >= 1, got {args.beams}")
    gpu, args.seed = args.device.startswith("cuda"), args.seed or 0
    args.repeats = args.repeats or (3 if args.run else 7)
    args.threads = args.threads or (2 if args.run else None)
    args.preset = args.preset or ("base" if gpu else "tiny")
    args.batch_tokens = args.batch_tokens or ([4096, 16384] if gpu else [2048])
    args.variants = args.variants or (["fp32", "bf16", "bf16+compile"] if gpu else ["fp32"])
    if bad := [v for v in args.variants if v not in VARIANTS]:
        raise UserError(f"unknown variant(s) {bad}; use {', '.join(VARIANTS)}")
    args.max_positions = max(128, 2 * (args.max_len + 2))  # Marian's position table
    args.warmup = max(1, args.warmup)
    if unknown := [p for p in args.peers if p not in (MARIAN, CT2)]:
        raise UserError(f"unknown peer(s) {unknown}; use {MARIAN},{CT2}")
    for name, hint in ((MARIAN, "pip install -e '.[bench]'"), (CT2, INSTALL_HINT)):
        if name in args.peers and harness.version(name) is None:
            print(f"NOTE: `{name}` is not installed, so it is skipped (install it with: {hint}).")
            args.peers = [p for p in args.peers if p != name]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the measurements, print tables; returns the JSON report."""
    resolve_defaults(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    return bench_real(args) if args.run else bench_training(args)


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
