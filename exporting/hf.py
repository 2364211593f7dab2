"""Export to Hugging Face Transformers: a `MarianMTModel` folder that computes our function.

Transformers can run the network we train (an encoder-decoder with ReLU feed-forward layers,
embeddings x sqrt(d_model), sinusoidal positions, the decoder started from BOS), so the export
is a mapping of weights, with one twist. `MarianMTModel` does not store its position table: it
rebuilds it on load with the sines in the first half of the model dimension and the cosines in
the second ([sin | cos]), where ours interleaves them (sin in even dims, cos in odd dims).
Renumbering the model dimension with `perm = [0, 2, 4, ..., 1, 3, 5, ...]` turns our table into
theirs, and it is an exact symmetry of the network when applied everywhere the residual stream
is touched: embedding columns, the input columns of every projection that reads the stream (q,
k, v, fc1), the output rows and biases of every projection that writes to it (out_proj, fc2),
and LayerNorm gains and biases (mean and variance ignore the order of features). Heads and
feed-forward units keep their order, and the output layer reads permuted embedding rows, so
the logits are ours (`marian_state_dict`; `export_hf` checks it on the written folder). Marian
has no pre-norm variant: a pre-norm model is refused (`check_marian`).

Our decoding rules travel in `generation_config.json` (greedy, pad and BOS never generated, EOS
never first and forced at `max_length`). `hf_search_ids` runs `generate` on our ids with our
per-sentence budgets (`exporting.shared.by_budget`).

`transformers` and `safetensors` are optional (`pip install -e '.[export]'`) and imported
only when used.

Legend: D d_model, V vocabulary, B batch, S source length, T target length.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnmt.data.batching import encode_source_batch, pad_rows
from attnmt.data.tokenizer import SpecialIds, Tokenizer
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
from attnmt.model import ModelConfig, Transformer

# An exported model whose fp32 logits differ from ours by more is not written.
# Measured: ~1e-6 to 1e-5 (the same sums in another order).
LOGITS_ATOL = 1e-3


def check_marian(cfg: ModelConfig) -> None:
    """Refuse what `MarianMTModel` cannot express (one line, before anything is written)."""
    if cfg.positions == "fairseq" or cfg.norm_first:  # an NLLB / M2M100 model is pre-norm
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
        activation_function={"silu": "swish"}.get(cfg.activation, cfg.activation),
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
    # An imported OPUS-MT model already has Marian's layout: nothing to renumber.
    halves = cfg.positions == "halves"
    perm = torch.arange(cfg.d_model) if halves else marian_permutation(cfg.d_model)
    D = cfg.d_model
    out: dict[str, Tensor] = {}

    def reads(weight: Tensor) -> Tensor:  # (out, D): reads the residual stream
        return fp32(weight)[:, perm]

    def writes(prefix: str, linear: nn.Linear) -> None:  # (D, in): writes to it
        out[f"{prefix}.weight"] = fp32(linear.weight)[perm]
        out[f"{prefix}.bias"] = fp32(linear.bias)[perm]

    def norm(name: str, layer_norm: nn.LayerNorm) -> None:
        out[f"{name}.weight"] = fp32(layer_norm.weight)[perm]
        out[f"{name}.bias"] = fp32(layer_norm.bias)[perm]

    def attention(prefix: str, ours: nn.Module) -> None:
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):  # in_proj is q | k | v
            out[f"{prefix}.{name}.weight"] = reads(ours.in_proj.weight[i * D : (i + 1) * D])
            out[f"{prefix}.{name}.bias"] = fp32(ours.in_proj.bias[i * D : (i + 1) * D])
        writes(f"{prefix}.out_proj", ours.out_proj)

    def feed_forward(prefix: str, layer: nn.Module) -> None:
        out[f"{prefix}.fc1.weight"] = reads(layer.feed_forward.linear1.weight)
        out[f"{prefix}.fc1.bias"] = fp32(layer.feed_forward.linear1.bias)
        writes(f"{prefix}.fc2", layer.feed_forward.linear2)

    src_embed = reads(model.src_embed.weight)  # (V, D)
    tgt_embed = src_embed if cfg.share_embeddings else reads(model.tgt_embed.weight)
    if cfg.share_embeddings:
        out["model.shared.weight"] = src_embed
    out["model.encoder.embed_tokens.weight"] = src_embed
    out["model.decoder.embed_tokens.weight"] = tgt_embed
    out["lm_head.weight"] = tgt_embed if cfg.tie_output else reads(model.generator.weight)
    bias = model.generator.bias
    out["final_logits_bias"] = (
        torch.zeros(1, cfg.tgt_vocab_size) if bias is None else fp32(bias).reshape(1, -1)
    )
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
    expected = fp32_model(model)(src, tgt_in)  # (B, T, V)
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

    return by_budget(src_ids, special, cfg, batch_size, generate)


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
    return [strip_generated(row[1:], special) for row in out.tolist()]


def strip_generated(row: list[int], special: SpecialIds) -> list[int]:
    """Generated ids up to the first EOS, without pad."""
    out = []
    for token in row:
        if token == special.eos:
            break
        if token != special.pad:
            out.append(token)
    return out
