"""Ours against its peers, `MarianMTModel` (transformers) and CTranslate2, on the same weights:
a trained model (`--run DIR`) decodes real sentences (`--src FILE [--ref FILE]`), ours as
translate.py runs it (fp32, int8), each system in a process of its own (`benchmarks.peers`);
ratios ours / peer per repeat; today's figures in docs/benchmarks.md (training: `train_step`).

    python -m benchmarks.benchmark --run RUN_DIR --src test2016.en --ref test2016.de \\
        --peers ctranslate2 --limit 512 --repeats 3 --threads 2 --cpu-kinds native,avx2
"""

import argparse
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnmt.common.errors import UserError
from attnmt.exporting.ct2 import export_ct2
from attnmt.exporting.hf import check_marian
from attnmt.exporting.shared import INSTALL_HINT, require
from attnmt.model import Transformer
from benchmarks import harness, peers

MARIAN, CT2 = "transformers", "ctranslate2"  # the --peers names
CT2_FP32, CT2_INT8 = "CTranslate2 fp32", "CTranslate2 int8"
ATTNMT, ATTNMT_INT8, UNPACKED = "attnmt", "attnmt int8", "attnmt unpacked"


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
    add("--peers", type=csv(str), default=[MARIAN, CT2], help=f"comma list of {MARIAN} and {CT2} (default: both)")  # noqa: E501
    add("--run", type=Path, action="append", required=True, metavar="DIR", help="a train.py run dir or checkpoint: decode --src with ours (fp32, int8) and the --peers; repeated: every run (its own tokenizer) in one table, ratios against the first")  # noqa: E501
    add("--src", type=Path, required=True, help="source sentences, one a line")
    add("--ref", type=Path, default=None, help="references: sacreBLEU per cell")
    add("--limit", type=int, default=0, help="first N sentences only (0: all)")
    add("--beams", type=csv(int), default=[1, 5], help="beam sizes; 1 = greedy (default: 1,5)")
    add("--decode-batch", type=int, default=64, help="sentences per batch (default: 64)")
    add("--inter-threads", type=int, default=1, metavar="N", help="ours and CTranslate2 search N batches at once, the threads divided (default: 1)")  # noqa: E501
    add("--cpu-kinds", type=csv(str), default=["native"], help=f"run every system on each of {kinds} (peers.CPU_KINDS' environment caps the instruction sets); a table per kind (default: native)")  # noqa: E501
    add("--precision", choices=("fp32", "bf16"), default="fp32", help="ours' float systems decode under this autocast, as translate.py --precision")  # noqa: E501
    add("--unpacked", action="store_true", help=f"ours once more with the engine's packed paths off: '{UNPACKED}'")  # noqa: E501
    # fmt: on


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Check the flags, run the measurements, print tables; returns the JSON report."""
    if args.inter_threads < 1:
        raise UserError(f"--inter-threads must be >= 1, got {args.inter_threads}")
    if not args.cpu_kinds or any(k not in peers.CPU_KINDS for k in args.cpu_kinds):
        raise UserError(f"--cpu-kinds takes {', '.join(peers.CPU_KINDS)}, got {args.cpu_kinds}")
    if not args.beams or min(args.beams) < 1:
        raise UserError(f"--beams must be beam sizes >= 1, got {args.beams}")
    if unknown := [p for p in args.peers if p not in (MARIAN, CT2)]:
        raise UserError(f"unknown peer(s) {unknown}; use {MARIAN},{CT2}")
    for name, hint in ((MARIAN, "pip install -e '.[bench]'"), (CT2, INSTALL_HINT)):
        if name in args.peers and harness.version(name) is None:
            print(f"NOTE: `{name}` is not installed, so it is skipped (install it with: {hint}).")
            args.peers = [p for p in args.peers if p != name]
    args.repeats, args.seed = args.repeats or 3, args.seed or 0
    torch.set_num_threads(args.threads or 2)
    return bench_real(args)


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
