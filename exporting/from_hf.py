"""Import from Hugging Face Transformers: an OPUS-MT (`MarianMTModel`) or NLLB-200 / M2M100
(`M2M100ForConditionalGeneration`) folder -> our checkpoint and tokenizer.

Both are the paper's encoder-decoder with a few variants, which `ModelConfig` names
(`activation`, `output_bias`, `positions`, `norm_first`, `share_embeddings`, `tie_output`), so
an import is a mapping of weights: q, k and v are concatenated into our fused `in_proj`, and
every other tensor keeps its shape. Every value comes from the folder's `config.json`; one that
we cannot express is refused in one line before anything is written.

Their tokenizers keep their own ids (`data.vocab_tokenizer.Vocabulary`):
- OPUS-MT: `source.spm` / `target.spm` segment, `vocab.json` (and `target_vocab.json` when the
  vocabularies are separate) numbers the pieces; `</s>` ends the source; the decoder starts from
  `<pad>` (`decoder_start_token_id`); multi-target models take a `>>xxx<<` token first in the
  source (language code `xxx`).
- NLLB: one SentencePiece model numbered with fairseq's offset (`<s> <pad> </s> <unk>`, then
  the pieces from SentencePiece's id 3 on, shifted by one), language codes after them; the
  source is `[src_lang] ... </s>`, the decoder starts from `</s>` and the target language's
  token is forced first (`tokenizer.json`'s vocabulary wins where the folder has one).

Translation needs neither Transformers nor this module: the checkpoint holds the tokenizer.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnmt.checkpoint import build_model, model_payload, save_checkpoint
from attnmt.data.batching import pad_rows
from attnmt.data.tokenizer import SpecialIds, Tokenizer
from attnmt.data.vocab_tokenizer import VocabTokenizer, Vocabulary
from attnmt.exporting.hf import LOGITS_ATOL
from attnmt.exporting.shared import ExportError, probe_sentences, require
from attnmt.model import ModelConfig

ARCHITECTURES = {"MarianMTModel": "marian", "M2M100ForConditionalGeneration": "m2m_100"}
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}
_NLLB_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")


def _fail(message: str) -> ExportError:
    """A folder that cannot be imported: one line, problem and fix."""
    return ExportError(message)


# ----------------------------------------------------------------------------- the folder


def resolve_source(src: str) -> Path:
    """A local Transformers folder, or a Hub name downloaded into the Hub cache."""
    path = Path(src).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise _fail(
            f"{src} is a file; pass a Transformers folder (config.json, weights, tokenizer)"
        )
    if src.count("/") != 1 or src.startswith((".", "/")):
        raise _fail(f"{src} is not a folder; pass a Transformers folder or a Hub name (org/model)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(src))
    except Exception as e:  # offline, unknown repo, gated model: all one line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _fail(
            f"cannot download {src} from the Hugging Face Hub ({reason}); download it "
            "elsewhere (huggingface-cli download) and pass the folder"
        ) from None


def read_config(folder: Path) -> tuple[dict[str, Any], str]:
    """config.json and the model family ("marian" or "m2m_100")."""
    file = folder / "config.json"
    if not file.is_file():
        raise _fail(f"{folder} has no config.json; pass a Transformers model folder")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _fail(f"cannot read {file} ({e}); the folder is damaged") from None
    architectures = config.get("architectures") or []
    family = next((ARCHITECTURES[a] for a in architectures if a in ARCHITECTURES), None)
    if family is None:
        family = {"marian": "marian", "m2m_100": "m2m_100"}.get(config.get("model_type"))
    if family is None:
        what = ", ".join(architectures) or config.get("model_type") or "unknown"
        raise _fail(
            f"{folder} holds a {what} model, which cannot be imported; supported: "
            "MarianMTModel (OPUS-MT) and M2M100ForConditionalGeneration (M2M100, NLLB-200)"
        )
    return config, family


def _need(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise _fail(f"config.json lacks {key!r}; the folder is not a complete Transformers model")
    return config[key]


def model_config(config: dict[str, Any], family: str, pad_id: int) -> ModelConfig:
    """Our `ModelConfig` from config.json, every value read from it."""
    d_model = _need(config, "d_model")
    heads = {_need(config, "encoder_attention_heads"), _need(config, "decoder_attention_heads")}
    ffn = {_need(config, "encoder_ffn_dim"), _need(config, "decoder_ffn_dim")}
    if len(heads) != 1 or len(ffn) != 1:
        raise _fail(
            "the encoder and decoder differ in attention heads or feed-forward width "
            f"(heads {sorted(heads)}, ffn {sorted(ffn)}), which our model does not express"
        )
    activation = _need(config, "activation_function")
    if activation not in _ACTIVATIONS:
        raise _fail(
            f"activation_function={activation!r} is not supported; supported: "
            f"{', '.join(_ACTIVATIONS)}"
        )
    if not config.get("scale_embedding", False):
        raise _fail("scale_embedding=false is not supported: our embeddings are x sqrt(d_model)")
    if family == "marian" and (config.get("normalize_before") or config.get("normalize_embedding")):
        raise _fail("a Marian model with normalize_before/normalize_embedding is not supported")
    vocab = _need(config, "vocab_size")
    shared = family == "m2m_100" or config.get("share_encoder_decoder_embeddings", True)
    tgt_vocab = vocab if shared else config.get("decoder_vocab_size") or vocab
    return ModelConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=tgt_vocab,
        pad_id=pad_id,
        d_model=d_model,
        n_heads=heads.pop(),
        d_ff=ffn.pop(),
        n_encoder_layers=_need(config, "encoder_layers"),
        n_decoder_layers=_need(config, "decoder_layers"),
        dropout=config.get("dropout", 0.1),
        attn_dropout=config.get("attention_dropout", 0.0),
        act_dropout=config.get("activation_dropout", 0.0),
        norm_first=family == "m2m_100",  # M2M100: pre-norm with a final LayerNorm per stack
        share_embeddings=shared,
        tie_output=config.get("tie_word_embeddings", True),
        activation=_ACTIVATIONS[activation],
        output_bias=family == "marian",  # final_logits_bias
        positions="halves" if family == "marian" else "fairseq",
    )


def read_weights(folder: Path) -> dict[str, Tensor]:
    """model.safetensors (sharded or not), else pytorch_model.bin (loaded with weights_only)."""
    files = sorted(folder.glob("model*.safetensors"))
    if files:
        safetensors = require("safetensors.torch")
        weights: dict[str, Tensor] = {}
        for file in files:
            weights.update(safetensors.load_file(str(file)))
        return weights
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise _fail(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")
    weights = {}
    for file in bins:
        try:
            weights.update(torch.load(file, map_location="cpu", weights_only=True))
        except Exception as e:
            raise _fail(
                f"cannot read {file} safely ({type(e).__name__}); use safetensors"
            ) from None
    return weights


# ------------------------------------------------------------------------------ weights


def our_state_dict(theirs: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Transformers' names -> ours (q | k | v into `in_proj`; float32 copies)."""
    theirs = {k.removeprefix("model."): v.float() for k, v in theirs.items()}

    def get(name: str) -> Tensor:
        if name not in theirs:
            raise _fail(f"the weights lack {name!r}; the folder does not match its config.json")
        return theirs[name]

    out: dict[str, Tensor] = {}

    def linear(ours: str, name: str) -> None:
        out[f"{ours}.weight"], out[f"{ours}.bias"] = get(f"{name}.weight"), get(f"{name}.bias")

    def attention(ours: str, name: str) -> None:
        parts = [f"{name}.{p}_proj" for p in ("q", "k", "v")]
        out[f"{ours}.in_proj.weight"] = torch.cat([get(f"{p}.weight") for p in parts])
        out[f"{ours}.in_proj.bias"] = torch.cat([get(f"{p}.bias") for p in parts])
        linear(f"{ours}.out_proj", f"{name}.out_proj")

    src_embed = theirs.get("shared.weight", theirs.get("encoder.embed_tokens.weight"))
    if src_embed is None:
        raise _fail("the weights lack the embeddings (model.shared / encoder.embed_tokens)")
    # Tied weights appear under each of their names in our state dict.
    out["src_embed.weight"] = src_embed
    tgt_embed = src_embed if cfg.share_embeddings else get("decoder.embed_tokens.weight")
    out["tgt_embed.weight"] = tgt_embed
    out["generator.weight"] = tgt_embed if cfg.tie_output else get("lm_head.weight")
    if cfg.output_bias:
        out["generator.bias"] = get("final_logits_bias").reshape(-1)
    for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            ours, name = f"{stack}.layers.{i}", f"{stack}.layers.{i}"
            attention(f"{ours}.self_attn", f"{name}.self_attn")
            linear(f"{ours}.norms.0", f"{name}.self_attn_layer_norm")
            if stack == "decoder":
                attention(f"{ours}.cross_attn", f"{name}.encoder_attn")
                linear(f"{ours}.norms.1", f"{name}.encoder_attn_layer_norm")
            linear(f"{ours}.feed_forward.linear1", f"{name}.fc1")
            linear(f"{ours}.feed_forward.linear2", f"{name}.fc2")
            linear(f"{ours}.norms.{2 if stack == 'decoder' else 1}", f"{name}.final_layer_norm")
        if cfg.norm_first:
            linear(f"{stack}.final_norm", f"{stack}.layer_norm")
    return out


# ---------------------------------------------------------------------------- tokenizers


def _json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _fail(f"cannot read {file} ({e})") from None


def _file(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise _fail(
            f"{folder} lacks the tokenizer file {name}; copy the whole model folder "
            "(tokenizer files included)"
        )
    return path


def tokenizer_settings(folder: Path) -> dict[str, Any]:
    """The folder's tokenizer_config.json ({} when it has none)."""
    file = folder / "tokenizer_config.json"
    return _json(file) if file.is_file() else {}


def _id_list(vocab: dict[str, int], size: int, file: Path) -> list[str]:
    """id -> piece of a piece -> id mapping, padded with "" (ids no piece has) to `size`."""
    if max(vocab.values(), default=-1) >= size:
        raise _fail(
            f"{file} has ids up to {max(vocab.values())} but the weights have {size} rows; the "
            "tokenizer does not belong to these weights"
        )
    pieces = [""] * size
    for piece, i in vocab.items():
        pieces[i] = piece
    return pieces


def marian_tokenizer(folder: Path, config: dict[str, Any], cfg: ModelConfig) -> Tokenizer:
    """OPUS-MT: two SentencePiece models and vocab.json (target_vocab.json if separate)."""
    source = _file(folder, "source.spm").read_bytes()
    target = _file(folder, "target.spm").read_bytes()
    vocab_file = _file(folder, "vocab.json")
    src_vocab = _json(vocab_file)
    separate = tokenizer_settings(folder).get("separate_vocabs", False)
    tgt_vocab = _json(_file(folder, "target_vocab.json")) if separate else src_vocab
    src = _id_list(src_vocab, cfg.src_vocab_size, vocab_file)
    tgt = (
        src
        if not separate
        else _id_list(tgt_vocab, cfg.tgt_vocab_size, folder / "target_vocab.json")
    )
    if not separate and cfg.tgt_vocab_size != cfg.src_vocab_size:
        raise _fail("vocab.json is shared but the weights have two vocabulary sizes")
    if "<unk>" not in src_vocab:
        raise _fail(f"{vocab_file} has no <unk>; the folder is not an OPUS-MT tokenizer")
    special = SpecialIds(
        pad=_need(config, "pad_token_id"),
        unk=src_vocab["<unk>"],
        bos=config.get("decoder_start_token_id", config["pad_token_id"]),
        eos=_need(config, "eos_token_id"),
    )
    codes = {} if separate else {p[2:-2]: i for p, i in src_vocab.items() if _is_marian_code(p)}
    vocab = Vocabulary(src, tgt, special, codes, "marian")
    return VocabTokenizer(source, None if target == source else target, vocab)


def _is_marian_code(piece: str) -> bool:
    return piece.startswith(">>") and piece.endswith("<<") and len(piece) > 4


def nllb_tokenizer(folder: Path, config: dict[str, Any], cfg: ModelConfig) -> Tokenizer:
    """NLLB / M2M100 with an NllbTokenizer: sentencepiece.bpe.model, fairseq's ids."""
    model_file = _file(folder, "sentencepiece.bpe.model")
    spm_bytes = model_file.read_bytes()
    settings = tokenizer_settings(folder)
    if settings.get("tokenizer_class") == "M2M100Tokenizer" or (
        (folder / "vocab.json").is_file() and not (folder / "tokenizer.json").is_file()
    ):
        raise _fail(
            f"{folder} has M2M100's own tokenizer (vocab.json, __xx__ codes), which is not "
            "supported; NLLB-200's (NllbTokenizer) is"
        )
    if settings.get("legacy_behaviour"):
        raise _fail(
            "this NLLB tokenizer uses legacy_behaviour=true (language code after </s>), "
            "which is not supported; set it to false in tokenizer_config.json"
        )
    pieces: dict[str, int] = {}
    added: dict[str, int] = {}
    if (folder / "tokenizer.json").is_file():
        fast = _json(folder / "tokenizer.json")
        model_vocab = (fast.get("model") or {}).get("vocab")
        if isinstance(model_vocab, dict):
            pieces = dict(model_vocab)
        added = {t["content"]: t["id"] for t in fast.get("added_tokens", [])}
    for i, token in (settings.get("added_tokens_decoder") or {}).items():
        added.setdefault(token["content"], int(i))
    if not pieces:  # fairseq's numbering of the SentencePiece pieces
        import sentencepiece as spm

        processor = spm.SentencePieceProcessor()
        processor.LoadFromSerializedProto(spm_bytes)
        pieces = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for j in range(3, processor.get_piece_size()):
            pieces[processor.id_to_piece(j)] = j + 1
    listed = settings.get("extra_special_tokens") or settings.get("additional_special_tokens")
    listed = set(listed) if isinstance(listed, list) else None
    codes = {
        t: i
        for t, i in added.items()
        if (t in listed if listed is not None else bool(_NLLB_CODE.match(t)))
    }
    if not codes:
        raise _fail(
            f"{folder} names no language codes (tokenizer.json / tokenizer_config.json); copy "
            "the whole NLLB folder"
        )
    ids = {**pieces, **added}
    src = _id_list(ids, cfg.src_vocab_size, model_file)
    unk = ids.get(settings.get("unk_token", "<unk>"), 3)
    special = SpecialIds(
        pad=_need(config, "pad_token_id"),
        unk=unk,
        bos=_need(config, "decoder_start_token_id"),
        eos=_need(config, "eos_token_id"),
    )
    return VocabTokenizer(spm_bytes, None, Vocabulary(src, src, special, codes, "nllb"))


# --------------------------------------------------------------------------------- import


def import_hf(
    src: str,
    out_dir: Path,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> dict[str, Any]:
    """Write `out_dir/checkpoints/best.pt` and `out_dir/tokenizer.pt` from a Transformers
    folder (or Hub name); nothing is written unless everything checks. Returns a summary."""
    folder = resolve_source(src)
    config, family = read_config(folder)
    pad = _need(config, "pad_token_id")
    cfg = model_config(config, family, pad)
    theirs = read_weights(folder)
    embed = theirs.get("model.shared.weight", theirs.get("model.encoder.embed_tokens.weight"))
    if embed is not None and embed.size(0) != cfg.src_vocab_size:
        raise _fail(
            f"config.json says vocab_size={cfg.src_vocab_size} but the embeddings have "
            f"{embed.size(0)} rows; the folder's config does not match its weights"
        )
    tokenizer = (marian_tokenizer if family == "marian" else nllb_tokenizer)(folder, config, cfg)
    if src_lang is not None or tgt_lang is not None:
        tokenizer = tokenizer.for_languages(src_lang, tgt_lang)
    model = build_model(cfg, our_state_dict(theirs, cfg))
    check = check_against_folder(model, tokenizer, folder)
    languages = _languages(folder, tokenizer, family)
    payload = model_payload(model, tokenizer)
    payload["languages"] = languages
    pair = {
        "src_lang": src_lang or (languages["source"][0] if len(languages["source"]) == 1 else None),
        "tgt_lang": tgt_lang or (languages["target"][0] if len(languages["target"]) == 1 else None),
    }
    payload["config"] = {"data": pair, "imported_from": str(src)}
    (out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    save_checkpoint(out_dir / "checkpoints" / "best.pt", payload)
    tokenizer.save(out_dir)
    return {
        "family": family,
        "check": check,
        "parameters": model.num_parameters(),
        "languages": languages,
        "config": cfg,
    }


@torch.no_grad()
def check_against_folder(model: Any, tokenizer: Tokenizer, folder: Path) -> float | None:
    """The largest difference between our logits and the folder's model's, teacher-forced on
    probe sentences (None when transformers is not installed: nothing to compare with).

    Raises:
        ExportError: they differ by more than `LOGITS_ATOL`.
    """
    if importlib.util.find_spec("transformers") is None:
        return None
    import transformers

    transformers.logging.set_verbosity_error()
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(folder)).eval()
    special = tokenizer.special
    texts = probe_sentences(tokenizer)
    src_ids = [ids[:30] for ids in tokenizer.encode_src(texts)]
    tgt_ids = [ids[:30] for ids in tokenizer.encode_tgt(texts)]
    src = pad_rows(src_ids, special.pad, suffix=[special.eos])  # (B, S)
    tgt_in = pad_rows(tgt_ids, special.pad, prefix=[special.bos])  # (B, T)
    expected = theirs(
        input_ids=src, attention_mask=src.ne(special.pad), decoder_input_ids=tgt_in
    ).logits
    got = model(src, tgt_in)
    real = pad_rows([[0] * (len(ids) + 1) for ids in tgt_ids], -1).ne(-1)  # (B, T) no padding
    diff = (got - expected).abs()[real].max().item()
    if not diff <= LOGITS_ATOL:  # also catches NaN
        raise _fail(
            f"the imported model does not reproduce {folder} (logits differ by up to {diff:.3g}); "
            "please report this with the model's name"
        )
    return diff


def _languages(folder: Path, tokenizer: Tokenizer, family: str) -> dict[str, list[str]]:
    """What the model translates: NLLB's codes on both sides; OPUS-MT's pair from
    tokenizer_config.json (`source_lang`, `target_lang`), its `>>xxx<<` codes as targets."""
    if family == "m2m_100":
        return {"source": tokenizer.languages, "target": tokenizer.languages}
    settings = tokenizer_settings(folder)
    source = [settings["source_lang"]] if settings.get("source_lang") else []
    target = tokenizer.languages or (
        [settings["target_lang"]] if settings.get("target_lang") else []
    )
    return {"source": source, "target": target}
