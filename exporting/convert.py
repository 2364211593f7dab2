"""Export a trained model to Hugging Face Transformers (`MarianMTModel`) and to CTranslate2.

Both toolkits can run the network we train (an encoder-decoder with ReLU feed-forward layers,
embeddings x sqrt(d_model), sinusoidal positions, the decoder started from BOS), so an export
is a mapping of weights, and this module is the one place that knows it:

* **Transformers.** `MarianMTModel` does not store its position table: it rebuilds it on load
  with the sines in the first half of the model dimension and the cosines in the second
  ([sin | cos]), where ours interleaves them (sin in even dims, cos in odd dims). Renumbering
  the model dimension with `perm = [0, 2, 4, ..., 1, 3, 5, ...]` turns our table into theirs,
  and it is an exact symmetry of the network when applied everywhere the residual stream is
  touched: embedding columns, the input columns of every projection that reads the stream
  (q, k, v, fc1), the output rows and biases of every projection that writes to it (out_proj,
  fc2), and LayerNorm gains and biases (mean and variance ignore the order of features). Heads
  and feed-forward units keep their order, and the output layer reads permuted embedding
  rows, so the logits are ours (`marian_state_dict`; `export_hf` checks it on the written
  folder). Marian has no pre-norm variant: a pre-norm model is refused (`check_marian`).
* **CTranslate2.** A `TransformerSpec` takes our tensors as they are (fused q|k|v, our own
  position table, post- or pre-norm), with the decoder started from `<s>` and `</s>`
  appended to the source by the model itself (`ct2_spec`). CTranslate2's stock Marian/OPUS-MT
  loaders do not fit: they drop the last vocabulary row as an appended pad and start the
  decoder from a zero embedding.

Our decoding rules travel too: for Transformers in `generation_config.json` (greedy, pad and
BOS never generated, EOS never first and forced at `max_length`); for CTranslate2 as `translate_batch`
options (`ct2_options`), since its model folder has no place for them. Our output budget is
per sentence, `int(max_len_a * src_len + max_len_b)` tokens, where `generate` and
`translate_batch` take one limit per call: `hf_search_ids` and `ct2_search_ids` group
sentences by budget, which reproduces ours exactly.

`transformers`, `safetensors` and `ctranslate2` are optional (`pip install -e '.[export]'`)
and imported only when used.

Legend: D d_model, V vocabulary, B batch, S source length, T target length.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import shutil
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from common.errors import UserError
from data.batching import encode_source_batch, pad_rows
from data.tokenizer import SpecialIds, Tokenizer
from decoding.config import SearchConfig
from decoding.translator import Translator
from model import ModelConfig, Transformer, sinusoid_table

INSTALL_HINT = "pip install -e '.[export]'"
# Positions the exported models have a table for (ours grows without limit): sentences up to
# this many tokens, EOS included, on either side.
MAX_POSITIONS = 1024
# An exported Transformers model whose fp32 logits differ from ours by more is not written.
# Measured: ~1e-6 to 1e-5 (the same sums in another order).
LOGITS_ATOL = 1e-3
# The same for CTranslate2 fp32: log-probabilities of our greedy outputs, scored by it.
LOGPROB_ATOL = 1e-3
# CTranslate2's weight types (`ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`).
QUANTIZATIONS = (
    "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
    "float32",
)  # fmt: skip


class ExportError(UserError):
    """A model or a request that cannot be exported; one line: problem and fix."""


def require(package: str) -> ModuleType:
    """Import an optional package, or raise a one-line `ExportError` naming the extra."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ExportError(
            f"exporting needs the Python package {package!r}, which is not installed; "
            f"install it with: {INSTALL_HINT}"
        ) from None


def _fp32(t: Tensor) -> Tensor:
    """A detached float32 CPU copy (the caller's model stays where and what it is)."""
    return t.detach().to("cpu", torch.float32).clone()


# ------------------------------------------------------------------------------ Transformers


def check_marian(cfg: ModelConfig) -> None:
    """Refuse what `MarianMTModel` cannot express (one line, before anything is written)."""
    if cfg.norm_first:
        raise ExportError(
            "this model is pre-norm (model.norm_first=true) and MarianMTModel is post-norm "
            "only, so it cannot be exported to Transformers; export it to CTranslate2 "
            "instead (export.py ct2)"
        )


def marian_permutation(d_model: int) -> Tensor:
    """perm (D,): Marian's feature j is our feature perm[j] (even dims first, then odd).

    Ours puts sin(pos * w_i) in dim 2i and cos(pos * w_i) in dim 2i + 1; Marian puts the sines
    in dims 0 .. ceil(D/2) - 1 and the cosines after them, with the same frequencies w_i.
    """
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_config(cfg: ModelConfig, special: SpecialIds, max_positions: int = MAX_POSITIONS) -> Any:
    """A `transformers.MarianConfig` of our sizes, sharing, special ids and dropouts."""
    check_marian(cfg)
    transformers = require("transformers")
    return transformers.MarianConfig(
        vocab_size=cfg.src_vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        dropout=cfg.dropout,
        attention_dropout=cfg.attn_dropout,
        activation_dropout=cfg.act_dropout,
        activation_function="relu",
        scale_embedding=True,  # x sqrt(d_model), as ours
        max_position_embeddings=max_positions,
        share_encoder_decoder_embeddings=cfg.share_embeddings,
        tie_word_embeddings=cfg.tie_output,
        pad_token_id=special.pad,
        bos_token_id=special.bos,
        eos_token_id=special.eos,
        decoder_start_token_id=special.bos,  # ours starts the decoder from BOS (Marian: pad)
        forced_eos_token_id=special.eos,
        use_cache=True,
    )


def marian_generation_config(special: SpecialIds, max_length: int = MAX_POSITIONS) -> Any:
    """`generate()` defaults that make a plain call our greedy search.

    Greedy, no sampling, pad and BOS never generated (`suppress_tokens`), EOS forced when
    `max_length` (start token included) is reached, never first (`min_new_tokens=1`, ours'
    minimum length), no repetition rules.
    """
    transformers = require("transformers")
    return transformers.GenerationConfig(
        decoder_start_token_id=special.bos,
        bos_token_id=special.bos,
        eos_token_id=special.eos,
        pad_token_id=special.pad,
        forced_eos_token_id=special.eos,
        suppress_tokens=[special.pad, special.bos],
        max_length=max_length,
        min_new_tokens=1,  # EOS never first, as ours
        num_beams=1,
        do_sample=False,
    )


def marian_state_dict(model: Transformer) -> dict[str, Tensor]:
    """Our weights (fp32, CPU copies) under `MarianMTModel`'s names, the model dimension
    permuted (see the module docstring). Without position tables: Marian builds its own."""
    cfg = model.cfg
    check_marian(cfg)
    perm = marian_permutation(cfg.d_model)
    D = cfg.d_model
    out: dict[str, Tensor] = {}

    def reads(weight: Tensor) -> Tensor:  # (out, D): reads the residual stream
        return _fp32(weight)[:, perm]

    def writes(prefix: str, linear: nn.Linear) -> None:  # (D, in): writes to it
        out[f"{prefix}.weight"] = _fp32(linear.weight)[perm]
        out[f"{prefix}.bias"] = _fp32(linear.bias)[perm]

    def norm(name: str, layer_norm: nn.LayerNorm) -> None:
        out[f"{name}.weight"] = _fp32(layer_norm.weight)[perm]
        out[f"{name}.bias"] = _fp32(layer_norm.bias)[perm]

    def attention(prefix: str, ours: nn.Module) -> None:
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):  # in_proj is q | k | v
            out[f"{prefix}.{name}.weight"] = reads(ours.in_proj.weight[i * D : (i + 1) * D])
            out[f"{prefix}.{name}.bias"] = _fp32(ours.in_proj.bias[i * D : (i + 1) * D])
        writes(f"{prefix}.out_proj", ours.out_proj)

    def feed_forward(prefix: str, layer: nn.Module) -> None:
        out[f"{prefix}.fc1.weight"] = reads(layer.feed_forward.linear1.weight)
        out[f"{prefix}.fc1.bias"] = _fp32(layer.feed_forward.linear1.bias)
        writes(f"{prefix}.fc2", layer.feed_forward.linear2)

    src_embed = reads(model.src_embed.weight)  # (V, D)
    tgt_embed = src_embed if cfg.share_embeddings else reads(model.tgt_embed.weight)
    if cfg.share_embeddings:
        out["model.shared.weight"] = src_embed
    out["model.encoder.embed_tokens.weight"] = src_embed
    out["model.decoder.embed_tokens.weight"] = tgt_embed
    out["lm_head.weight"] = tgt_embed if cfg.tie_output else reads(model.generator.weight)
    out["final_logits_bias"] = torch.zeros(1, cfg.tgt_vocab_size)
    for i, layer in enumerate(model.encoder.layers):
        prefix = f"model.encoder.layers.{i}"
        attention(f"{prefix}.self_attn", layer.self_attn)
        feed_forward(prefix, layer)
        norm(f"{prefix}.self_attn_layer_norm", layer.norms[0])
        norm(f"{prefix}.final_layer_norm", layer.norms[1])
    for i, layer in enumerate(model.decoder.layers):
        prefix = f"model.decoder.layers.{i}"
        attention(f"{prefix}.self_attn", layer.self_attn)
        attention(f"{prefix}.encoder_attn", layer.cross_attn)
        feed_forward(prefix, layer)
        norm(f"{prefix}.self_attn_layer_norm", layer.norms[0])
        norm(f"{prefix}.encoder_attn_layer_norm", layer.norms[1])
        norm(f"{prefix}.final_layer_norm", layer.norms[2])
    return out


def to_marian(
    model: Transformer,
    special: SpecialIds,
    max_positions: int = MAX_POSITIONS,
    attn_implementation: str | None = None,
) -> Any:
    """A `MarianMTModel` (CPU, fp32, eval mode) that computes exactly our function.

    `attn_implementation` ("eager", "sdpa", ...) picks its attention kernels (benchmarks);
    None leaves Transformers' default.
    """
    transformers = require("transformers")
    transformers.logging.set_verbosity_error()
    config = marian_config(model.cfg, special, max_positions)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    marian = transformers.MarianMTModel(config)
    marian.generation_config = marian_generation_config(special, max_positions)
    state = marian_state_dict(model)
    theirs = marian.state_dict()
    positions = {name for name in theirs if name.endswith("embed_positions.weight")}
    # Which tied names exist depends on the sharing flags: every name the model has (but the
    # position tables) must get our weights, and must still hold them after loading (a tie
    # the config did not make would silently keep one of two tensors).
    missing = set(theirs) - positions - set(state)
    if missing:
        raise RuntimeError(f"no weights for {sorted(missing)[:3]}: did transformers change?")
    marian.load_state_dict({k: v for k, v in state.items() if k in theirs}, strict=False)
    loaded = marian.state_dict()
    for name, value in state.items():
        if name in loaded and not torch.equal(loaded[name], value):
            raise RuntimeError(f"{name} lost the exported weights: did transformers change?")
    return marian.eval()


def write_marian_tokenizer(tokenizer: Tokenizer, out_dir: Path, max_positions: int) -> None:
    """`source.spm`, `target.spm`, `vocab.json` (+ `target_vocab.json` with separate models)
    and `tokenizer_config.json`, as `MarianTokenizer.save_pretrained` writes them.

    `vocab.json` maps each SentencePiece piece to our id (ids are not remapped), so
    `MarianTokenizer(text).input_ids` is our source ids followed by EOS.
    """
    transformers = require("transformers")
    state = tokenizer.state_dict()
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        files = {name: Path(tmp) / name for name in ("src.spm", "tgt.spm", "src.json", "tgt.json")}
        files["src.spm"].write_bytes(state["src_model"])
        files["tgt.spm"].write_bytes(state.get("tgt_model", state["src_model"]))
        for key, pieces in (
            ("src.json", tokenizer.src_pieces(range(tokenizer.src_vocab_size))),
            ("tgt.json", tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size))),
        ):
            vocab = {piece: i for i, piece in enumerate(pieces)}
            files[key].write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        special = tokenizer.special
        with warnings.catch_warnings():  # "Recommended: pip install sacremoses" (unused here)
            warnings.simplefilter("ignore")
            hf_tokenizer = transformers.MarianTokenizer(
                source_spm=str(files["src.spm"]),
                target_spm=str(files["tgt.spm"]),
                vocab=str(files["src.json"]),
                target_vocab_file=str(files["tgt.json"]),
                separate_vocabs=not tokenizer.joint,
                unk_token=tokenizer.src_pieces([special.unk])[0],
                eos_token=tokenizer.src_pieces([special.eos])[0],
                pad_token=tokenizer.src_pieces([special.pad])[0],
                model_max_length=max_positions,
            )
            hf_tokenizer.save_pretrained(str(out_dir))


def export_hf(
    model: Transformer,
    tokenizer: Tokenizer,
    out_dir: Path,
    max_positions: int = MAX_POSITIONS,
) -> dict[str, Any]:
    """Write into the folder `out_dir` (created if missing) what `MarianMTModel` and
    `MarianTokenizer.from_pretrained` load offline: config, safetensors weights, generation
    config, SentencePiece model(s), vocabularies, tokenizer config.

    The folder is then loaded back and compared with our model (`check_hf_folder`): an
    `ExportError` if logits or tokenizer ids differ. Returns the check's numbers.
    """
    check_marian(model.cfg)
    require("safetensors")
    transformers = require("transformers")
    marian = to_marian(model, tokenizer.special, max_positions)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    transformers.utils.logging.disable_progress_bar()
    marian.save_pretrained(str(out_dir), safe_serialization=True)
    write_marian_tokenizer(tokenizer, out_dir, max_positions)
    return check_hf_folder(model, tokenizer, out_dir)


@torch.no_grad()
def check_hf_folder(model: Transformer, tokenizer: Tokenizer, folder: Path) -> dict[str, Any]:
    """Load an exported folder as a user would; compare tokenizer ids and teacher-forced
    logits of our greedy outputs with ours on probe sentences."""
    transformers = require("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        marian = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
        hf_tokenizer = transformers.MarianTokenizer.from_pretrained(str(folder))
    special = tokenizer.special
    texts = probe_sentences(tokenizer)
    src_ids = tokenizer.encode_src(texts)
    if hf_tokenizer(texts).input_ids != [ids + [special.eos] for ids in src_ids]:
        raise ExportError(
            f"the tokenizer written to {folder} does not give our source ids; please report "
            "this with the checkpoint"
        )
    src = encode_source_batch(src_ids, special)  # (B, S)
    ours = our_search_ids(model, tokenizer, src_ids, SearchConfig(beam_size=1))
    tgt_in = pad_rows(ours, special.pad, prefix=[special.bos])  # (B, T)
    expected = _fp32_model(model)(src, tgt_in)  # (B, T, V)
    got = marian(input_ids=src, attention_mask=src.ne(special.pad), decoder_input_ids=tgt_in)
    real = tgt_in.ne(special.pad)  # (B, T): positions that are not padding
    diff = (got.logits - expected).abs()[real].max().item()
    if not diff <= LOGITS_ATOL:  # also catches NaN
        raise ExportError(
            f"the model written to {folder} does not reproduce ours (logits differ by up to "
            f"{diff:.3g}); please report this with the checkpoint"
        )
    return {"probe_sentences": len(texts), "logits_max_abs_diff": diff}


@torch.no_grad()
def hf_search_ids(
    marian: Any,
    special: SpecialIds,
    src_ids: list[list[int]],
    cfg: SearchConfig,
    batch_size: int = 64,
) -> list[list[int]]:
    """`marian.generate` on our source ids (no specials) with our per-sentence budgets:
    target ids without BOS/EOS, in input order; an empty source gives []."""

    def generate(batch: list[list[int]], budget: int) -> list[list[int]]:
        return hf_generate(marian, special, batch, cfg, budget)

    return _by_budget(src_ids, special, cfg, batch_size, generate)


@torch.no_grad()
def hf_generate(
    marian: Any, special: SpecialIds, src_ids: list[list[int]], cfg: SearchConfig, budget: int
) -> list[list[int]]:
    """One `marian.generate` call on a batch of our source ids (no specials, none empty),
    at most `budget` tokens each: target ids without BOS/EOS."""
    src = encode_source_batch(src_ids, special).to(marian.device)  # (B, S)
    beam = {"num_beams": cfg.beam_size, "length_penalty": cfg.length_penalty}
    out = marian.generate(
        input_ids=src,
        attention_mask=src.ne(special.pad),
        max_new_tokens=budget + 1,  # budget tokens, then EOS (forced_eos_token_id)
        **(beam if cfg.beam_size > 1 else {}),
    )  # (B, 1 + T): the start token first
    return [_strip(row[1:], special) for row in out.tolist()]


# ------------------------------------------------------------------------------- CTranslate2


def ct2_spec(model: Transformer, tokenizer: Tokenizer, max_positions: int = MAX_POSITIONS) -> Any:
    """A `ctranslate2.specs.TransformerSpec` holding our weights as they are (fp32)."""
    ctranslate2 = require("ctranslate2")
    specs = ctranslate2.specs
    cfg = model.cfg
    D = cfg.d_model
    spec = specs.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm_first,  # pre-norm: + a final LayerNorm after each stack, as ours
        activation=specs.common_spec.Activation.RELU,
    )

    def array(t: Tensor) -> Any:
        return _fp32(t).numpy()

    def linear(dst: Any, weight: Tensor, bias: Tensor | None = None) -> None:
        dst.weight = array(weight)
        if bias is not None:
            dst.bias = array(bias)

    def norm(dst: Any, layer_norm: nn.LayerNorm) -> None:
        dst.gamma, dst.beta = array(layer_norm.weight), array(layer_norm.bias)

    def feed_forward(dst: Any, layer: nn.Module) -> None:
        ff = layer.feed_forward
        linear(dst.linear_0, ff.linear1.weight, ff.linear1.bias)
        linear(dst.linear_1, ff.linear2.weight, ff.linear2.bias)

    table = array(sinusoid_table(max_positions, D))  # (P, D) ours: sin/cos interleaved
    for stack, embed in ((spec.encoder, model.src_embed), (spec.decoder, model.tgt_embed)):
        embeddings = stack.embeddings[0] if stack is spec.encoder else stack.embeddings
        embeddings.weight = array(embed.weight)
        stack.position_encodings.encodings = table
        stack.scale_embeddings = True  # x sqrt(d_model)
    spec.decoder.start_from_zero_embedding = False  # the first step reads BOS's embedding
    linear(spec.decoder.projection, model.generator.weight)  # tied: the same values
    if cfg.norm_first:
        norm(spec.encoder.layer_norm, model.encoder.final_norm)
        norm(spec.decoder.layer_norm, model.decoder.final_norm)
    for dst, ours in zip(spec.encoder.layer, model.encoder.layers, strict=True):
        attn = ours.self_attn
        linear(dst.self_attention.linear[0], attn.in_proj.weight, attn.in_proj.bias)  # q|k|v
        linear(dst.self_attention.linear[1], attn.out_proj.weight, attn.out_proj.bias)
        norm(dst.self_attention.layer_norm, ours.norms[0])
        feed_forward(dst.ffn, ours)
        norm(dst.ffn.layer_norm, ours.norms[1])
    for dst, ours in zip(spec.decoder.layer, model.decoder.layers, strict=True):
        attn, cross = ours.self_attn, ours.cross_attn
        linear(dst.self_attention.linear[0], attn.in_proj.weight, attn.in_proj.bias)
        linear(dst.self_attention.linear[1], attn.out_proj.weight, attn.out_proj.bias)
        norm(dst.self_attention.layer_norm, ours.norms[0])
        linear(dst.attention.linear[0], cross.in_proj.weight[:D], cross.in_proj.bias[:D])  # q
        linear(dst.attention.linear[1], cross.in_proj.weight[D:], cross.in_proj.bias[D:])  # k|v
        linear(dst.attention.linear[2], cross.out_proj.weight, cross.out_proj.bias)
        norm(dst.attention.layer_norm, ours.norms[1])
        feed_forward(dst.ffn, ours)
        norm(dst.ffn.layer_norm, ours.norms[2])
    special = tokenizer.special
    spec.config.unk_token = tokenizer.tgt_pieces([special.unk])[0]
    spec.config.bos_token = tokenizer.tgt_pieces([special.bos])[0]
    spec.config.eos_token = tokenizer.tgt_pieces([special.eos])[0]
    spec.config.decoder_start_token = spec.config.bos_token
    spec.config.add_source_eos = True  # ours encodes `ids + [eos]`
    spec.config.layer_norm_epsilon = model.encoder.layers[0].norms[0].eps  # torch's 1e-5
    spec.register_source_vocabulary(tokenizer.src_pieces(range(tokenizer.src_vocab_size)))
    spec.register_target_vocabulary(tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size)))
    return spec


def export_ct2(
    model: Transformer,
    tokenizer: Tokenizer,
    out_dir: Path,
    quantization: str | None = None,
    max_positions: int = MAX_POSITIONS,
) -> dict[str, Any]:
    """Write into the folder `out_dir` (created if missing) what `ctranslate2.Translator`
    loads, plus the SentencePiece models as `source.spm` and `target.spm`.

    The folder is then loaded back (`check_ct2_folder`): with fp32 weights (no quantization)
    an `ExportError` if it scores our greedy outputs differently from ours. Returns the
    check's numbers.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(
            f"--quantization {quantization} is not a CTranslate2 weight type; use one of "
            f"{', '.join(QUANTIZATIONS)}"
        )
    spec = ct2_spec(model, tokenizer, max_positions)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(out_dir))
    state = tokenizer.state_dict()
    (out_dir / "source.spm").write_bytes(state["src_model"])
    (out_dir / "target.spm").write_bytes(state.get("tgt_model", state["src_model"]))
    exact = quantization in (None, "float32")
    return check_ct2_folder(model, tokenizer, out_dir, strict=exact)


def ct2_options(tokenizer: Tokenizer, beam_size: int = 1) -> dict[str, Any]:
    """`translate_batch` options under which CTranslate2 searches as ours does (with
    `max_decoding_length` = our budget of the sentence)."""
    special = tokenizer.special
    return {
        "beam_size": beam_size,  # CTranslate2's default is 2
        "min_decoding_length": 1,  # EOS never first, as ours (CTranslate2's default too)
        "max_input_length": 0,  # never truncate a source (default: 1024 tokens)
        "suppress_sequences": [
            tokenizer.tgt_pieces([special.pad]),
            tokenizer.tgt_pieces([special.bos]),
        ],
    }


def ct2_translate(
    translator: Any,
    tokenizer: Tokenizer,
    src_ids: list[list[int]],
    cfg: SearchConfig,
    batch_size: int = 64,
    max_decoding_length: int = 256,
    target_ids: dict[str, int] | None = None,
    **overrides: Any,
) -> list[list[int]]:
    """One `translate_batch` call of a `ctranslate2.Translator` on our source ids (no
    specials), searching as ours does (`ct2_options`): the best target ids of each, without
    BOS/EOS. `target_ids` (piece -> id, `ct2_target_ids`) may be passed to build it once;
    `overrides` replace `translate_batch` options (benchmarks: `min_decoding_length`)."""
    target_ids = target_ids or ct2_target_ids(tokenizer)
    options = ct2_batch_options(tokenizer, cfg, batch_size, max_decoding_length, **overrides)
    results = translator.translate_batch([tokenizer.src_pieces(ids) for ids in src_ids], **options)
    return [[target_ids[piece] for piece in r.hypotheses[0]] for r in results]


def ct2_batch_options(
    tokenizer: Tokenizer,
    cfg: SearchConfig,
    batch_size: int = 64,
    max_decoding_length: int = 256,
    **overrides: Any,
) -> dict[str, Any]:
    """All `translate_batch` options of `ct2_translate` (`ct2_options` with the limits)."""
    return {
        "max_decoding_length": max_decoding_length,
        "length_penalty": cfg.length_penalty,
        "max_batch_size": batch_size,
        **ct2_options(tokenizer, cfg.beam_size),
        **overrides,
    }


def ct2_target_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """Target piece -> our id (CTranslate2 answers in pieces)."""
    return {p: i for i, p in enumerate(tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size)))}


def ct2_search_ids(
    translator: Any,
    tokenizer: Tokenizer,
    src_ids: list[list[int]],
    cfg: SearchConfig,
    batch_size: int = 64,
) -> list[list[int]]:
    """A `ctranslate2.Translator`'s search on our source ids (no specials) with our
    per-sentence budgets: target ids without BOS/EOS, in input order; an empty source gives
    []. Greedy (beam 1) gives our ids exactly with fp32 weights; beam search follows
    CTranslate2's own rules (length normalisation, stopping), which are not fairseq's."""
    target_ids = ct2_target_ids(tokenizer)

    def translate(batch: list[list[int]], budget: int) -> list[list[int]]:
        return ct2_translate(translator, tokenizer, batch, cfg, batch_size, budget, target_ids)

    return _by_budget(src_ids, tokenizer.special, cfg, batch_size, translate)


def check_ct2_folder(
    model: Transformer, tokenizer: Tokenizer, folder: Path, strict: bool = True
) -> dict[str, Any]:
    """Load an exported folder; let it score our greedy outputs of probe sentences
    (teacher-forced log-probabilities, EOS included) and search them greedily."""
    ctranslate2 = require("ctranslate2")
    translator = ctranslate2.Translator(str(folder), device="cpu")
    special = tokenizer.special
    src_ids = tokenizer.encode_src(probe_sentences(tokenizer))
    greedy = SearchConfig(beam_size=1)
    ours = our_search_ids(model, tokenizer, src_ids, greedy)
    scored = translator.score_batch(
        [tokenizer.src_pieces(ids) for ids in src_ids], [tokenizer.tgt_pieces(ids) for ids in ours]
    )
    src = encode_source_batch(src_ids, special)  # (B, S)
    tgt_in = pad_rows(ours, special.pad, prefix=[special.bos])  # (B, T)
    with torch.no_grad():
        expected = torch.log_softmax(_fp32_model(model)(src, tgt_in), dim=-1)  # (B, T, V)
    diff = 0.0
    for i, (ids, result) in enumerate(zip(ours, scored, strict=True)):
        want = expected[i, torch.arange(len(ids) + 1), torch.tensor(ids + [special.eos])]
        diff = max(diff, (want - torch.tensor(result.log_probs)).abs().max().item())
    theirs = ct2_search_ids(translator, tokenizer, src_ids, greedy)
    same = sum(a == b for a, b in zip(theirs, ours, strict=True))
    if strict and not diff <= LOGPROB_ATOL:
        raise ExportError(
            f"the model written to {folder} does not reproduce ours (log-probabilities differ "
            f"by up to {diff:.3g}); please report this with the checkpoint"
        )
    return {"probe_sentences": len(src_ids), "logprob_max_abs_diff": diff, "greedy_same": same}


# --------------------------------------------------------------------------------- shared


def our_search_ids(
    model: Transformer, tokenizer: Tokenizer, src_ids: list[list[int]], cfg: SearchConfig
) -> list[list[int]]:
    """Our search (as `translate.py` runs it) on source ids: the best target ids each."""
    return [nbest[0].tokens for nbest in Translator(model, tokenizer, cfg).search_ids(src_ids)]


def probe_sentences(tokenizer: Tokenizer, n: int = 8, seed: int = 0) -> list[str]:
    """Deterministic source text made of the vocabulary's own pieces (any language)."""
    gen = torch.Generator().manual_seed(seed)
    first = max(vars(tokenizer.special).values()) + 1  # no specials
    ids = [
        torch.randint(first, tokenizer.src_vocab_size, (int(k),), generator=gen).tolist()
        for k in torch.randint(3, 16, (n,), generator=gen)
    ]
    return [text for text in tokenizer.decode_src(ids) if text.strip()] or ["a"]


def _fp32_model(model: Transformer) -> Transformer:
    """A float32 CPU copy in eval mode (or the model itself when it already is one)."""
    p = next(model.parameters())
    if p.device.type == "cpu" and p.dtype == torch.float32 and not model.training:
        return model
    copy = Transformer(model.cfg)
    copy.load_state_dict({k: _fp32(v) for k, v in model.state_dict().items()})
    return copy.eval()


def budgets(src_ids: list[list[int]], special: SpecialIds, cfg: SearchConfig) -> list[int]:
    """Our output budget of each sentence (`decoding.search.max_lengths`, the same float64
    arithmetic, in Python: no torch op, see `benchmarks.peers.ct2_from_folder`); 0 for an
    empty source, which our search never decodes."""
    not_counted = {special.pad, special.eos}
    return [
        math.floor(sum(i not in not_counted for i in ids) * cfg.max_len_a + cfg.max_len_b)
        if ids
        else 0
        for ids in src_ids
    ]


def _by_budget(
    src_ids: list[list[int]],
    special: SpecialIds,
    cfg: SearchConfig,
    batch_size: int,
    search: Callable[[list[list[int]], int], list[list[int]]],
) -> list[list[int]]:
    """Run `search(batch, budget)` on the sentences grouped by our output budget (equal
    budgets share a call); results in input order, [] for an empty source."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (ids, budget) in enumerate(zip(src_ids, budgets(src_ids, special, cfg), strict=True)):
        if ids:
            groups[budget].append(i)
    results: list[list[int]] = [[] for _ in src_ids]
    for budget, members in sorted(groups.items()):
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            for i, ids in zip(chunk, search([src_ids[i] for i in chunk], budget), strict=True):
                results[i] = ids
    return results


def _strip(row: list[int], special: SpecialIds) -> list[int]:
    """Generated ids up to the first EOS, without pad."""
    out = []
    for token in row:
        if token == special.eos:
            break
        if token != special.pad:
            out.append(token)
    return out


# ----------------------------------------------------------------------------- file system


def check_output(target: Path, force: bool = False) -> None:
    """Refuse an output that is not a folder, or a non-empty folder without `force`."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ExportError(f"output {target} exists and is not a folder; choose another -o")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ExportError(
            f"output folder {target} exists and is not empty; choose another -o or pass "
            "--force to replace it"
        )


@contextlib.contextmanager
def staged_dir(target: Path, force: bool = False) -> Iterator[Path]:
    """A new empty folder beside `target` to write into. When the block ends without error it
    becomes `target` (an existing one is replaced only with `force`); otherwise it is deleted
    and `target` is left as it was."""
    target = Path(target)
    check_output(target, force)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as e:
        raise ExportError(
            f"cannot write beside {target} ({e.strerror}); choose another -o"
        ) from None
    try:
        yield staging
        _make_readable(staging)
        if not target.exists():
            staging.rename(target)
            return
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        target.rename(trash / target.name)
        try:
            staging.rename(target)
        except OSError:
            (trash / target.name).rename(target)  # put the old folder back
            raise
        shutil.rmtree(trash)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    """`mkdtemp` and some writers create owner-only files: give them the usual modes."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
