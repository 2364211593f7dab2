#!/usr/bin/env python
"""Import a pretrained model from Hugging Face Transformers: OPUS-MT or NLLB-200 / M2M100.

    python scripts/import_hf.py path/to/opus-mt-en-de --out runs/opus-en-de
    python scripts/import_hf.py Helsinki-NLP/opus-mt-en-de --out runs/opus-en-de   # Hub name
    python scripts/import_hf.py path/to/nllb-200-distilled-600M --out runs/nllb \\
        --src-lang eng_Latn --tgt-lang deu_Latn

SRC is a local Transformers folder (config.json, model.safetensors or pytorch_model.bin, the
tokenizer files) of a `MarianMTModel` or an `M2M100ForConditionalGeneration`, or a Hub name
when the Hub is reachable. `--out` becomes an ordinary run dir (`checkpoints/best.pt` and the
tokenizer) for `translate.py -c`, `serve.py -c`, `train.py trainer.init_from=` and
`scripts/export.py`. `--src-lang`/`--tgt-lang` set a multilingual model's default pair (what
translation and fine-tuning use when none is given). The folder is written beside `--out` and
renamed when complete, after the imported model's logits are checked against the folder's
(when transformers is installed); a non-empty `--out` is refused. Every user mistake is one
line, `import_hf.py: error: ...`, exit status 1 (2 for bad flags). See docs/importing.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnmt.cli.args import Parser, program_name
from attnmt.common.errors import exit_status

PROG = program_name("import_hf.py")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("src", help="a Transformers folder, or a Hub name (org/model)")
    parser.add_argument("--out", required=True, type=Path, help="the run dir to create")
    parser.add_argument("--src-lang", help="default source language code (NLLB: eng_Latn)")
    parser.add_argument("--tgt-lang", help="default target language code (NLLB: deu_Latn)")
    return parser


def run(args: argparse.Namespace) -> str:
    from attnmt.exporting.folders import check_output, staged_dir
    from attnmt.exporting.from_hf import import_hf

    check_output(args.out)
    with staged_dir(args.out) as folder:
        summary = import_hf(args.src, folder, args.src_lang, args.tgt_lang)
    cfg, langs = summary["config"], summary["languages"]
    pair = f"{', '.join(langs['source'][:3]) or '?'} -> {', '.join(langs['target'][:3]) or '?'}"
    many = max(len(langs["source"]), len(langs["target"]))
    return (
        f"wrote {args.out}: {summary['family']} model, {summary['parameters']:,} parameters, "
        f"d_model {cfg.d_model}, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, "
        f"{cfg.activation}, languages {pair}"
        + (f" ({many} codes)" if many > 3 else "")
        + (
            f"; logits max |diff| vs the folder's model {summary['check']:.2g}"
            if summary["check"] is not None
            else "; not checked against the folder (transformers is not installed)"
        )
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: print(run(args)))


if __name__ == "__main__":
    sys.exit(main())
