#!/usr/bin/env python
"""Export a trained model to Hugging Face Transformers or to CTranslate2.

    python scripts/export.py hf  -c RUN_DIR -o model-hf      # MarianMTModel + MarianTokenizer
    python scripts/export.py ct2 -c RUN_DIR -o model-ct2     # ctranslate2.Translator
    python scripts/export.py ct2 -c RUN_DIR/checkpoints/best.pt -o model-int8 --quantization int8

`-c` takes a run dir (its checkpoints/best.pt, else last.pt) or a .pt file. The output folder
holds everything needed to translate (weights, config, SentencePiece model(s)) and a
README.md model card with the model's sizes, training config, data and the run's BLEU
(`results.json`). It is written into a temporary folder beside `-o` and renamed when complete,
then loaded back and checked against the checkpoint: nothing half-written or wrong is left.
An existing non-empty `-o` is replaced only with `--force`.

Transformers cannot express a pre-norm model (MarianMTModel is post-norm only): it is
refused; CTranslate2 takes it. The weight mappings live in `exporting/hf.py` and
`exporting/ct2.py`. Needs the
optional packages: pip install -e '.[export]'. Every user mistake ends with one line,
`export.py: error: ...`, and exit status 1 (2 for bad flags).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnmt.cli.args import Parser, program_name
from attnmt.common.errors import exit_status

PROG = program_name("export.py")


def build_parser() -> argparse.ArgumentParser:
    from attnmt.exporting.ct2 import QUANTIZATIONS

    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="{hf,ct2}")
    hf = kinds.add_parser("hf", help="a folder for transformers' MarianMTModel/MarianTokenizer")
    ct2 = kinds.add_parser("ct2", help="a folder for ctranslate2.Translator")
    for sub in (hf, ct2):
        sub.add_argument("-c", "--checkpoint", required=True, help="run dir or .pt file")
        sub.add_argument("-o", "--output", required=True, type=Path, help="folder to write")
        sub.add_argument(
            "--force", action="store_true", help="replace -o if it exists and is not empty"
        )
    ct2.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="weight type (default: float32, which gives our greedy outputs exactly); "
        "int8 is about 4x smaller",
    )
    return parser


def run(args: argparse.Namespace) -> str:
    """Export; returns the summary line."""
    from attnmt.checkpoint import load_for_inference, resolve_checkpoint
    from attnmt.exporting.card import model_card
    from attnmt.exporting.ct2 import export_ct2
    from attnmt.exporting.folders import check_output, staged_dir
    from attnmt.exporting.hf import check_marian, export_hf
    from attnmt.exporting.shared import require

    check_output(args.output, args.force)
    path = resolve_checkpoint(args.checkpoint)
    model, tokenizer, ckpt = load_for_inference(path)
    quantization = getattr(args, "quantization", None)
    if args.kind == "hf":  # refuse before writing anything
        check_marian(model.cfg)
        require("transformers")
        require("safetensors")
    else:
        require("ctranslate2")
    card = model_card(args.kind, ckpt, path, model.num_parameters(), quantization)
    with staged_dir(args.output, args.force) as folder:
        if args.kind == "hf":
            check = export_hf(model, tokenizer, folder)
            result = f"logits max |diff| vs ours {check['logits_max_abs_diff']:.2g}"
        else:
            check = export_ct2(model, tokenizer, folder, quantization)
            result = (
                f"log-probs max |diff| vs ours {check['logprob_max_abs_diff']:.2g}, greedy "
                f"outputs equal to ours {check['greedy_same']}/{check['probe_sentences']}"
            )
        (folder / "README.md").write_text(card, encoding="utf-8")
    what = "MarianMTModel" if args.kind == "hf" else f"CTranslate2 ({quantization or 'float32'})"
    return (
        f"wrote {args.output}: {what} from {path}; check on {check['probe_sentences']} probe "
        f"sentences: {result}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: print(run(args)))


if __name__ == "__main__":
    sys.exit(main())
