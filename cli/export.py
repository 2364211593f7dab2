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
import json
import sys
from pathlib import Path
from typing import Any

from attnmt.cli.args import Parser, program_name
from attnmt.common.errors import exit_status

PROG = program_name("export.py")
REPO = "attnmt"


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


# ----------------------------------------------------------------------------- model card


def model_card(
    kind: str, ckpt: dict[str, Any], path: Path, n_params: int, quantization: str | None
) -> str:
    """README.md of the exported folder: sizes, data, results.json, usage, training config."""
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else None
    config = ckpt.get("config")
    hydra = run_dir / ".hydra" / "config.yaml" if run_dir else None
    data = (config or {}).get("data", {})
    tok = (config or {}).get("tokenizer", {})
    src, tgt = data.get("src_lang", "src"), data.get("tgt_lang", "tgt")
    m = ckpt["model_config"]
    step = ckpt.get("train_state", {}).get("step")
    library = "transformers" if kind == "hf" else "ctranslate2"
    lines = [
        "---",
        *(["language:", f"- {src}", f"- {tgt}"] if data else []),
        "tags:",
        "- translation",
        f"- {REPO}",
        f"library_name: {library}",
        "pipeline_tag: translation",
        "---",
        "",
        f"# {REPO} {src}->{tgt} Transformer",
        "",
        f"An encoder-decoder Transformer trained with {REPO}, exported from `{path.name}`"
        + (f" (step {step})" if step is not None else "")
        + f" by `scripts/export.py {kind}`"
        + (f" with `{quantization}` weights" if quantization else "")
        + ".",
        "",
        "## Model",
        "",
        "| d_model | heads | d_ff | layers (enc+dec) | vocabulary (src, tgt) | norm | embeddings "
        "| parameters |",
        "|---|---|---|---|---|---|---|---|",
        f"| {m['d_model']} | {m['n_heads']} | {m['d_ff']} | {m['n_encoder_layers']}+"
        f"{m['n_decoder_layers']} | {m['src_vocab_size']}, {m['tgt_vocab_size']} | "
        f"{'pre' if m['norm_first'] else 'post'} | "
        f"{'shared' if m['share_embeddings'] else 'separate'}"
        f"{', tied output' if m['tie_output'] else ''} | {n_params / 1e6:.2f}M |",
        "",
        "## Data",
        "",
        _data_line(data, tok),
        "",
        "## Results",
        "",
        *_results_lines(run_dir, path),
        "",
        "## Usage",
        "",
        *(_usage_hf() if kind == "hf" else _usage_ct2()),
        "",
        "## Training config",
        "",
    ]
    if config:
        lines += ["```json", json.dumps(config, indent=2, default=str), "```"]
    elif hydra and hydra.is_file():
        lines += ["```yaml", hydra.read_text(encoding="utf-8").rstrip(), "```"]
    else:
        lines.append("Not stored in this checkpoint.")
    return "\n".join(lines) + "\n"


def _data_line(data: dict[str, Any], tok: dict[str, Any]) -> str:
    if not data:
        return "Not stored in this checkpoint."
    corpus = (
        f"local folder `{data['dir']}`"
        if data.get("dir")
        else f"`{data.get('hub_name')}`"
        + (f" ({data['hub_config']})" if data.get("hub_config") else "")
    )
    text = (
        f"Corpus: {corpus}, {data.get('src_lang')} -> {data.get('tgt_lang')}, trained on split "
        f"`{data.get('train_split', 'train')}`, validated on `{data.get('valid_split', 'valid')}`."
    )
    if tok:
        text += (
            f" Tokenizer: SentencePiece {tok.get('model_type')}, "
            f"{'joint' if tok.get('joint') else 'separate'}, {tok.get('vocab_size')} pieces."
        )
    return text


def _results_lines(run_dir: Path | None, path: Path) -> list[str]:
    results_path = run_dir / "results.json" if run_dir else None
    if not results_path or not results_path.is_file():
        return ["No `results.json` beside this checkpoint."]
    try:
        results = json.loads(results_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [f"`{results_path.name}` is unreadable."]
    decoding = results.get("decoding", {})
    search = "greedy" if decoding.get("beam_size", 1) == 1 else f"beam {decoding['beam_size']}"
    lines = [
        f"From the run's `results.json`: `checkpoints/best.pt` (step {results.get('best_step')} "
        f"of {results.get('steps')}), {search} search"
        + ("." if path.name == "best.pt" else f"; this export is `{path.name}`, not best.pt."),
        "",
        "| split | BLEU | chrF | signature |",
        "|---|---|---|---|",
    ]
    valid = results.get("valid", {})
    if valid:
        lines.append(f"| valid | {valid.get('bleu', 0):.2f} | {valid.get('chrf', 0):.2f} | |")
    for split, score in results.get("test", {}).items():
        signature = score.get("signature", "").replace("|", "\\|")  # a pipe ends a cell
        lines.append(
            f"| {split} | {score.get('bleu', 0):.2f} | {score.get('chrf', 0):.2f} | `{signature}` |"
        )
    return lines


def _usage_hf() -> list[str]:
    return [
        "```python",
        "from transformers import MarianMTModel, MarianTokenizer",
        "",
        'tokenizer = MarianTokenizer.from_pretrained("THIS_FOLDER")',
        'model = MarianMTModel.from_pretrained("THIS_FOLDER")',
        'batch = tokenizer(["A sentence."], return_tensors="pt", padding=True)',
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        "```",
        "",
        "`generate()`'s defaults (`generation_config.json`) are the training toolkit's greedy "
        "search; `num_beams=5` gives Transformers' beam search.",
    ]


def _usage_ct2() -> list[str]:
    return [
        "```python",
        "import ctranslate2",
        "import sentencepiece as spm",
        "",
        'translator = ctranslate2.Translator("THIS_FOLDER")',
        'source = spm.SentencePieceProcessor(model_file="THIS_FOLDER/source.spm")',
        'target = spm.SentencePieceProcessor(model_file="THIS_FOLDER/target.spm")',
        'tokens = source.encode(["A sentence."], out_type=str)',
        "results = translator.translate_batch(",
        "    tokens, beam_size=1, max_input_length=0,",
        '    suppress_sequences=[["<pad>"], ["<s>"]],',
        ")",
        "print([target.decode(r.hypotheses[0]) for r in results])",
        "```",
        "",
        "These options make CTranslate2 search as the training toolkit does (greedy; an empty "
        "output allowed; no truncation; pad and `<s>` never generated). Its output limit is "
        "`max_decoding_length` (default 256) tokens.",
    ]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status(PROG, lambda: print(run(args)))


if __name__ == "__main__":
    sys.exit(main())
