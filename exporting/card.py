"""The model card of an exported folder (its README.md): the model's sizes, its data, the run's
BLEU from `results.json`, how to load it, and the training config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = "attnmt"


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
