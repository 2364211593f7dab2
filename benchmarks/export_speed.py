"""Sentences/s of ours and of the checkpoint's CTranslate2 exports (float32, int8), timed
interleaved, each system in a process of its own (`benchmarks.peers`, the timing
`python -m benchmarks.benchmark --run` reports: the peers get ours' length-sorted batches of
`--batch-size`, each with the batch's largest length budget). BLEU is that of the last
repeat's output.

    python -m benchmarks.export_speed -c RUN_DIR --src test2016.en --ref test2016.de --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from attnmt.checkpoint import load_for_inference, resolve_checkpoint
from attnmt.common.errors import exit_status
from attnmt.common.files import read_src_ref
from attnmt.decoding.config import SearchConfig
from attnmt.evaluation.bleu import corpus_bleu
from attnmt.exporting.ct2 import export_ct2
from benchmarks import peers

PROG = "benchmarks.export_speed"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--checkpoint", required=True, help="run dir or .pt file")
    parser.add_argument("--src", required=True, type=Path, help="source sentences, one a line")
    parser.add_argument("--ref", type=Path, default=None, help="references: BLEU per system")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed repeats")
    parser.add_argument("--beam", type=int, default=5, help="beam size (1: greedy)")
    return parser


def run(args: argparse.Namespace) -> list[str]:
    path = resolve_checkpoint(args.checkpoint)
    model, tokenizer, _ = load_for_inference(path)
    lines, refs = read_src_ref(args.src, args.ref, args.limit)
    src_ids = tokenizer.encode_src([line.strip() for line in lines])
    cfg = SearchConfig(beam_size=args.beam, batch_size=args.batch_size)
    threads = args.threads or torch.get_num_threads()
    report = [f"speed, beam {args.beam}, batch {args.batch_size}, {args.repeats} repeats:"]
    print(report[0], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        systems = {"ours": peers.Isolated(peers.ours_from_checkpoint, (str(path), "none"), threads)}
        for quantization in ("float32", "int8"):
            folder = Path(tmp) / quantization
            export_ct2(model, tokenizer, folder, quantization)
            spec = (peers.ct2_from_folder, (str(folder), str(path), threads), threads)
            systems[f"ctranslate2 {quantization}"] = peers.Isolated(*spec)
        cells = peers.compare(systems, src_ids, [cfg], args.repeats)
    ours_times = cells[("ours", args.beam)].times_s
    for name in systems:
        cell = cells[(name, args.beam)]
        ratio = peers.ratio_spread(ours_times, cell.times_s).format(".2f", "x")
        bleu = ""
        if refs is not None:
            bleu = f"  BLEU {corpus_bleu(tokenizer.decode_tgt(cell.ids), refs).score:.2f}"
        report.append(f"{name:<24} {cell.rate().format()} sent/s  ours/it {ratio}{bleu}")
        print(report[-1], flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
