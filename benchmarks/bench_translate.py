#!/usr/bin/env python
"""Translation quality and speed of a trained checkpoint, with and without the KV cache.

In one run:
  (a) test BLEU and chrF (sacreBLEU, with signatures) of greedy and beam-5 search on the whole
      input, translated as `translate.py` does (length-sorted batches of 64, default
      `SearchConfig` length limits and length penalty);
  (b) translation speed, sentences/s and target tokens/s (generated tokens + EOS), for greedy
      and beam 5 at batch sizes 1 and 64, for the model WITH its KV cache and the same model
      WITHOUT it (`decoding.uncached.UncachedModel`: every step runs the decoder over the whole
      target prefix; only the last position goes through the output layer). Both must produce
      the same tokens; this is checked on every sentence (exit status 1 if not). Speed uses the
      first N sentences (`--limit-speed`: no-cache beam search at batch 1 is slow), text in,
      text out
      (SentencePiece included), warm-up first, then repeats interleaved (cache, no cache, ...)
      and their median.

Usage:
    python -m benchmarks.bench_translate -c RUN_DIR --input test.en --ref test.de
    python -m benchmarks.bench_translate -c RUN_DIR --input test.en --ref test.de \\
        --limit-speed 100 --repeats 1 --json bench_translate.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnmt.common.errors import UserError
from attnmt.common.files import read_lines
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.translator import TextHypothesis, Translator
from attnmt.decoding.uncached import UncachedModel
from attnmt.evaluation.bleu import corpus_bleu, corpus_chrf
from attnmt.model import Transformer
from benchmarks import peers

ROOT = Path(__file__).resolve().parent.parent


def n_target_tokens(hyps: list[list[TextHypothesis]]) -> int:
    """Generated tokens + EOS: the decoder steps that produced the best hypotheses."""
    return sum(len(nbest[0].tokens) + 1 for nbest in hyps)


def search_name(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam{beam}"


def quality(
    model: nn.Module, tokenizer: Any, lines: list[str], refs: list[str], beams: list[int]
) -> dict[str, dict]:
    """BLEU and chrF of each search on the whole input (cached model, batches of 64)."""
    out = {}
    for beam in beams:
        translator = Translator(model, tokenizer, SearchConfig(beam_size=beam, batch_size=64))
        start = time.perf_counter()
        hyps = translator.translate(lines)
        seconds = time.perf_counter() - start
        bleu, chrf = corpus_bleu(hyps, refs), corpus_chrf(hyps, refs)
        out[search_name(beam)] = {
            "bleu": bleu.score,
            "bleu_signature": bleu.signature,
            "chrf": chrf.score,
            "chrf_signature": chrf.signature,
            "seconds": seconds,
        }
    return out


def speed(
    model: Transformer,
    tokenizer: Any,
    lines: list[str],
    beams: list[int],
    batch_sizes: list[int],
    repeats: int,
) -> list[dict[str, Any]]:
    """Cached vs uncached translation speed of `lines` for every (search, batch size)."""
    rows = []
    models = {"cache": model, "no_cache": UncachedModel(model)}
    for beam in beams:
        for batch_size in batch_sizes:
            cfg = SearchConfig(beam_size=beam, batch_size=batch_size)
            translators = {name: Translator(m, tokenizer, cfg) for name, m in models.items()}
            for translator in translators.values():  # warm-up on a few sentences
                translator.translate_nbest(lines[: min(len(lines), 2 * batch_size, 16)])
            outputs: dict[str, list[list[TextHypothesis]]] = {}  # the first run's are compared
            runs = {  # interleaved, alternating who goes first
                name: lambda n=name, t=t, o=outputs: o.setdefault(n, t.translate_nbest(lines))
                for name, t in translators.items()
            }
            times = peers.interleaved(runs, max(1, repeats))
            row: dict[str, Any] = {
                "search": search_name(beam),
                "beam": beam,
                "batch_size": batch_size,
            }
            for name in translators:
                median = statistics.median(times[name])
                row[name] = {
                    "times_s": times[name],
                    "median_s": median,
                    "sentences_per_s": len(lines) / median,
                    "tokens_per_s": n_target_tokens(outputs[name]) / median,
                }
            cached, uncached = outputs["cache"], outputs["no_cache"]
            row["different_outputs"] = sum(
                a[0].tokens != b[0].tokens for a, b in zip(cached, uncached, strict=True)
            )
            row["speedup_cache_over_no_cache"] = (
                row["cache"]["sentences_per_s"] / row["no_cache"]["sentences_per_s"]
            )
            rows.append(row)
            speedup = row["speedup_cache_over_no_cache"]
            done = f"{row['search']:<7} batch {batch_size:>3}: cache/no cache {speedup:.2f}x"
            print(f"  done: {done}", flush=True)
    return rows


def print_speed_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'search':<8}{'batch':>6} | {'KV cache sent/s':>15}{'tok/s':>9} | "
        f"{'no cache sent/s':>15}{'tok/s':>9} | {'same output':>11} | {'cache/no cache':>14}"
    )
    for r in rows:
        c, n = r["cache"], r["no_cache"]
        same = "yes" if r["different_outputs"] == 0 else f"NO ({r['different_outputs']})"
        print(
            f"{r['search']:<8}{r['batch_size']:>6} | {c['sentences_per_s']:>15,.1f}"
            f"{c['tokens_per_s']:>9,.0f} | {n['sentences_per_s']:>15,.1f}{n['tokens_per_s']:>9,.0f}"
            f" | {same:>11} | {r['speedup_cache_over_no_cache']:>13.2f}x"
        )


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_translate.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("-c", "--checkpoint", required=True, help="run dir (checkpoints/best.pt) or .pt file")
    add("--input", required=True, help="source sentences, one per line")
    add("--ref", required=True, help="reference translations, one per line")
    add(
        "--limit-speed",
        type=int,
        default=200,
        metavar="N",
        help="time translation speed on the first N sentences (default: 200; 0 = all)",
    )
    add("--beams", type=csv_ints, default=[1, 5], help="beam sizes (default: 1,5; 1 = greedy)")
    add(
        "--batch-sizes",
        type=csv_ints,
        default=[1, 64],
        help="search batch sizes for the speed table (default: 1,64)",
    )
    add(
        "--repeats",
        type=int,
        default=3,
        help="timed translations of the N sentences per setting, interleaved (default: 3)",
    )
    add("--device", default="cpu", help="cpu or cuda (default: cpu)")
    add("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add("--json", type=Path, default=None, metavar="PATH", help="write all results here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UserError as e:
        print(f"bench_translate.py: error: {e}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    """Everything `main` does; user mistakes raise `UserError`."""
    if args.threads:
        torch.set_num_threads(args.threads)
    from attnmt.checkpoint import load_for_inference

    model, tokenizer, _ = load_for_inference(args.checkpoint, args.device)
    model.eval()
    lines, refs = read_lines(args.input, "--input"), read_lines(args.ref, "--ref")
    if len(lines) != len(refs):
        raise UserError(
            f"--input has {len(lines)} lines but --ref has {len(refs)}; pass matching files"
        )
    n_speed = len(lines) if args.limit_speed <= 0 else min(args.limit_speed, len(lines))
    cfg = model.cfg
    print(
        f"checkpoint {args.checkpoint}: d_model={cfg.d_model} layers={cfg.n_encoder_layers}+"
        f"{cfg.n_decoder_layers} vocab={cfg.tgt_vocab_size} params={model.num_parameters():,}; "
        f"device={args.device} threads={torch.get_num_threads()} torch {torch.__version__}"
    )
    print(f"input {args.input}: {len(lines)} sentences; ref {args.ref}")

    print("\n== quality on the whole input (batches of 64, max_len 1.2*src+10, lenpen 1.0)")
    scores = quality(model, tokenizer, lines, refs, args.beams)
    for name, s in scores.items():
        print(f"{name:<7} BLEU {s['bleu']:6.2f}  chrF {s['chrf']:6.2f}  ({s['seconds']:.1f} s)")
        print(f"        {s['bleu_signature']}\n        {s['chrf_signature']}")

    print(
        f"\n== speed on the first N={n_speed} sentences: KV cache vs no cache, median of "
        f"{args.repeats} interleaved repeats after a warm-up (text in, text out)"
    )
    rows = speed(model, tokenizer, lines[:n_speed], args.beams, args.batch_sizes, args.repeats)
    print_speed_table(rows)
    mismatches = sum(r["different_outputs"] for r in rows)
    report = {
        "checkpoint": str(args.checkpoint),
        "input": args.input,
        "ref": args.ref,
        "n_sentences": len(lines),
        "device": args.device,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "model_config": dataclasses.asdict(cfg),
        "quality": scores,
        "speed": {"n_sentences": n_speed, "repeats": args.repeats, "rows": rows},
        "outputs_identical": mismatches == 0,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    if mismatches:
        print(f"ERROR: cached and uncached search differ on {mismatches} sentence(s)")
        return 1
    print("cached and uncached search gave identical tokens on every sentence")
    return 0


if __name__ == "__main__":
    sys.exit(main())
