#!/usr/bin/env python
"""How often the exported models' greedy outputs equal ours, on a real test set.

    python scripts/export_check.py -c RUN_DIR --src test2016.en
    python scripts/export_check.py -c RUN_DIR --src test2016.en --ref test2016.de --limit 200

Exports the checkpoint (as `scripts/export.py` does, into temporary folders) to Transformers
(MarianMTModel), CTranslate2 float32 and CTranslate2 int8, decodes `--src` greedily with each
and with ours (`translate.py --beam 1`), and prints, for each export, on how many sentences
its output ids are identical to ours, with the seconds it took (and BLEU/chrF with `--ref`).
Their speed against ours: `python -m benchmarks.benchmark --run RUN_DIR --peers ctranslate2`.
Every system gets our per-sentence length budget, int(max_len_a * src_len + max_len_b) tokens
(`exporting.hf.hf_search_ids` / `exporting.ct2.ct2_search_ids`), so a difference is a
difference in the
model's numbers, not in the search. An export that cannot run here (a pre-norm model for
Transformers, a package not installed) is reported as skipped.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from attnmt.cli.args import Parser, program_name
from attnmt.common.errors import UserError, exit_status

PROG = program_name("export_check.py")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--checkpoint", required=True, help="run dir or .pt file")
    parser.add_argument("--src", required=True, type=Path, help="source sentences, one a line")
    parser.add_argument("--ref", type=Path, default=None, help="references: BLEU/chrF per system")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: library default)")
    return parser


def run(args: argparse.Namespace) -> list[str]:
    import torch

    from attnmt.checkpoint import load_for_inference, resolve_checkpoint
    from attnmt.common.files import read_src_ref
    from attnmt.decoding.config import SearchConfig
    from attnmt.evaluation.bleu import corpus_bleu, corpus_chrf
    from attnmt.exporting.ct2 import ct2_search_ids, export_ct2
    from attnmt.exporting.hf import export_hf, hf_search_ids
    from attnmt.exporting.shared import budgets, our_search_ids, require

    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_checkpoint(args.checkpoint)
    model, tokenizer, _ = load_for_inference(path)
    lines, refs = read_src_ref(args.src, args.ref, args.limit)
    src_ids = tokenizer.encode_src([line.strip() for line in lines])
    cfg = SearchConfig(beam_size=1, batch_size=args.batch_size)
    n = len(src_ids)

    def score(ids: list[list[int]]) -> str:
        if refs is None:
            return ""
        hyps = tokenizer.decode_tgt(ids)
        return (
            f"  BLEU {corpus_bleu(hyps, refs).score:.2f} chrF {corpus_chrf(hyps, refs).score:.2f}"
        )

    start = time.perf_counter()
    ours = our_search_ids(model, tokenizer, src_ids, cfg)
    limits = budgets(src_ids, tokenizer.special, cfg)
    at_budget = sum(len(o) >= b > 0 for o, b in zip(ours, limits, strict=True))
    report = [
        f"{path}: {n} sentences of {args.src}, greedy, budget int({cfg.max_len_a} * src_len + "
        f"{cfg.max_len_b}) tokens (ours reached it on {at_budget})",
        f"{'ours':<24} {time.perf_counter() - start:7.1f} s{score(ours)}",
    ]

    def compare(name: str, ids: list[list[int]], seconds: float) -> None:
        same = sum(a == b for a, b in zip(ids, ours, strict=True))
        rate = f"{same}/{n} ({100 * same / max(n, 1):.2f}%)"
        report.append(f"{name:<24} {seconds:7.1f} s  identical to ours: {rate}{score(ids)}")
        print(report[-1], flush=True)

    print("\n".join(report), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            export_hf(model, tokenizer, Path(tmp) / "hf")
            marian = require("transformers").MarianMTModel.from_pretrained(f"{tmp}/hf")
            start = time.perf_counter()
            ids = hf_search_ids(marian.eval(), tokenizer.special, src_ids, cfg)
            compare("transformers", ids, time.perf_counter() - start)
        except UserError as e:
            report.append(f"{'transformers':<24} skipped: {e}")
            print(report[-1], flush=True)
        for quantization in ("float32", "int8"):
            name = f"ctranslate2 {quantization}"
            try:
                folder = Path(tmp) / quantization
                export_ct2(model, tokenizer, folder, quantization)
                ctranslate2 = require("ctranslate2")
                threads = {"intra_threads": args.threads} if args.threads else {}
                translator = ctranslate2.Translator(str(folder), device="cpu", **threads)
                start = time.perf_counter()
                ids = ct2_search_ids(translator, tokenizer, src_ids, cfg, args.batch_size)
                compare(name, ids, time.perf_counter() - start)
            except UserError as e:
                report.append(f"{name:<24} skipped: {e}")
                print(report[-1], flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
