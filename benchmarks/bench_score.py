"""Scoring given translations (`translate.py --score`) against beam search on the same input,
in one process, interleaved: sentences/s of each (median and range over the repeats), and
whether scoring the beam's own n-best lists gives the search's scores back.

    python -m benchmarks.bench_score -c RUN_DIR --src test2016.en --ref test2016.de --beam 5
"""

from __future__ import annotations

import argparse

import torch

from attnmt.common.errors import exit_status
from attnmt.common.files import read_lines
from attnmt.common.memory import keep_freed_memory
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.translator import Translator
from attnmt.engine import load_engine
from benchmarks import peers


def main(argv: list[str] | None = None) -> int:
    return exit_status("bench_score.py", lambda: run(argv))


def run(argv: list[str] | None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-c", "--checkpoint", required=True, help="run dir or .pt file")
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--ref", required=True, help="their reference translations (scored)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as translate.py does on the CPU
    model, tokenizer = load_engine([args.checkpoint], "cpu")
    src, refs = read_lines(args.src, "--src"), read_lines(args.ref, "--ref")
    cfg = SearchConfig(beam_size=args.beam, nbest=args.beam, batch_size=args.batch_size)
    translator = Translator(model, tokenizer, cfg)

    out: dict[str, list] = {}
    runs = {
        "beam search": lambda: out.update(nbest=translator.translate_nbest(src)),
        "score references": lambda: translator.score(src, refs),
    }
    times = peers.interleaved(runs, args.repeats)
    nbest = out["nbest"]
    print(
        f"{len(src)} sentences, beam {args.beam}, batch {args.batch_size}, {args.threads} threads"
    )
    rates = {name: peers.Spread.of([len(src) / s for s in times[name]]) for name in times}
    for name, r in rates.items():
        print(f"{name:>18}: {r.median:8.1f} sentences/s (range {r.low:.1f}-{r.high:.1f})")
    speedup = rates["score references"].median / rates["beam search"].median
    print(f"scoring / beam search: {speedup:.1f}x")

    # The search's own n-best lists, scored: from the ids, and from the text (re-tokenized).
    hyps = [(i, h) for i, hs in enumerate(nbest) for h in hs]
    src_ids = tokenizer.encode_src(src)
    by_ids = translator.score_ids([src_ids[i] for i, _ in hyps], [h.tokens for _, h in hyps])
    diffs = [abs(s.score - h.score) for (_, h), s in zip(hyps, by_ids, strict=True)]
    print(f"{len(hyps)} n-best hypotheses scored from their ids: max |score diff| {max(diffs):.2e}")
    by_text = translator.score([src[i] for i, _ in hyps], [h.text for _, h in hyps])
    same = sum(
        f"{s.score:.4f}" == f"{h.score:.4f}" for (_, h), s in zip(hyps, by_text, strict=True)
    )
    print(f"  from their text (as --score reads them): {same}/{len(hyps)} equal to 4 decimals")


if __name__ == "__main__":
    raise SystemExit(main())
