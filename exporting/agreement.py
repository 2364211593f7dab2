"""How often the exported models' greedy outputs equal ours on a test set (what
`scripts/export_check.py` reports). Every system gets our per-sentence length budget,
int(max_len_a * src_len + max_len_b) tokens (`hf.hf_search_ids`, `ct2.ct2_search_ids`), so a
difference is a difference in the model's numbers, not in the search."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from attnmt.common.errors import UserError


def check_exports(
    checkpoint: str,
    src: Path,
    ref: Path | None = None,
    limit: int = 0,
    batch_size: int = 64,
    threads: int = 0,
    metrics: Callable[[list[str], list[str]], str] | None = None,
) -> list[str]:
    """Export `checkpoint` to Transformers, CTranslate2 float32 and int8 (temporary folders),
    decode `src` (its first `limit` lines; 0: all) greedily with each and with ours, and
    report, a line each as it goes (on stdout too), how many outputs equal ours, the seconds
    and, with `ref`, what `metrics(translations, references)` says; an export that cannot run here is reported as skipped."""
    import torch

    from attnmt.checkpoint import load_for_inference, resolve_checkpoint
    from attnmt.common.files import read_src_ref
    from attnmt.decoding.config import SearchConfig
    from attnmt.exporting.ct2 import ct2_search_ids, export_ct2
    from attnmt.exporting.hf import export_hf, hf_search_ids
    from attnmt.exporting.shared import budgets, our_search_ids, require

    if threads:
        torch.set_num_threads(threads)
    path = resolve_checkpoint(checkpoint)
    model, tokenizer, _ = load_for_inference(path)
    lines, refs = read_src_ref(src, ref, limit)
    src_ids = tokenizer.encode_src([line.strip() for line in lines])
    cfg = SearchConfig(beam_size=1, batch_size=batch_size)
    n = len(src_ids)

    def score(ids: list[list[int]]) -> str:
        if refs is None or metrics is None:
            return ""
        return metrics(tokenizer.decode_tgt(ids), refs)

    start = time.perf_counter()
    ours = our_search_ids(model, tokenizer, src_ids, cfg)
    limits = budgets(src_ids, tokenizer.special, cfg)
    at_budget = sum(len(o) >= b > 0 for o, b in zip(ours, limits, strict=True))
    report = [
        f"{path}: {n} sentences of {src}, greedy, budget int({cfg.max_len_a} * src_len + "
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
                intra = {"intra_threads": threads} if threads else {}  # `threads` stays an int
                translator = ctranslate2.Translator(str(folder), device="cpu", **intra)
                start = time.perf_counter()
                ids = ct2_search_ids(translator, tokenizer, src_ids, cfg, batch_size)
                compare(name, ids, time.perf_counter() - start)
            except UserError as e:
                report.append(f"{name:<24} skipped: {e}")
                print(report[-1], flush=True)
    return report
