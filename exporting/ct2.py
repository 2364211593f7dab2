"""Export to CTranslate2: a `TransformerSpec` folder for `ctranslate2.Translator`.

A `TransformerSpec` takes our tensors as they are (fused q|k|v, our own position table, post-
or pre-norm), with the decoder started from `<s>` and `</s>` appended to the source by the
model itself (`ct2_spec`). CTranslate2's stock Marian/OPUS-MT loaders do not fit: they drop the
last vocabulary row as an appended pad and start the decoder from a zero embedding.

Our decoding rules travel as `translate_batch` options (`ct2_options`), since the model folder
has no place for them. `ct2_search_ids` runs `translate_batch` on our ids with our
per-sentence budgets (`exporting.shared.by_budget`).

`ctranslate2` is optional (`pip install -e '.[export]'`) and imported only when used.

Legend: D d_model, V vocabulary, B batch, S source length, T target length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnmt.data.batching import encode_source_batch, pad_rows
from attnmt.data.tokenizer import Tokenizer
from attnmt.decoding.config import SearchConfig
from attnmt.exporting.shared import (
    MAX_POSITIONS,
    ExportError,
    by_budget,
    fp32,
    fp32_model,
    our_search_ids,
    probe_sentences,
    require,
)
from attnmt.model import Transformer, sinusoid_table

# An exported fp32 model is not written when the log-probabilities it gives our greedy outputs
# differ from ours by more.
LOGPROB_ATOL = 1e-3
# Our feed-forward activations by CTranslate2's names (`specs.common_spec.Activation`).
_CT2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}
# CTranslate2's weight types (`ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`).
_INT8_TYPES = ("int8", "int8_float32", "int8_float16", "int8_bfloat16")
QUANTIZATIONS = (*_INT8_TYPES, "int16", "float16", "bfloat16", "float32")


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
        activation=getattr(specs.common_spec.Activation, _CT2_ACTIVATIONS[cfg.activation]),
    )

    def array(t: Tensor) -> Any:
        return fp32(t).numpy()

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

    # (P, D): the model's own layout (interleaved; an imported model's halves or fairseq's)
    table = array(sinusoid_table(max_positions, D, cfg.positions, cfg.pad_id))
    for stack, embed in ((spec.encoder, model.src_embed), (spec.decoder, model.tgt_embed)):
        embeddings = stack.embeddings[0] if stack is spec.encoder else stack.embeddings
        embeddings.weight = array(embed.weight)
        stack.position_encodings.encodings = table
        stack.scale_embeddings = True  # x sqrt(d_model)
    spec.decoder.start_from_zero_embedding = False  # the first step reads BOS's embedding
    # tied: the same values; an imported OPUS-MT model's final_logits_bias as the bias
    linear(spec.decoder.projection, model.generator.weight, model.generator.bias)
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

    return by_budget(src_ids, tokenizer.special, cfg, batch_size, translate)


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
        expected = torch.log_softmax(fp32_model(model)(src, tgt_in), dim=-1)  # (B, T, V)
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
