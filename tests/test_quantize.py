"""Inference precision: dynamic int8 quantization (`--quantize int8`) and bf16 autocast on the
CPU, on the tiny model: they run, stay close to float32, and a tied output layer keeps working.

Legend: B batch, S src len, T tgt len, V vocab.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnmt.checkpoint import model_payload, save_checkpoint
from attnmt.common import runtime
from attnmt.common.errors import UserError
from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import beam_search
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine
from attnmt.engine.engine import _copy, _rows
from attnmt.engine.runs import check_quantize
from attnmt.model import padding_mask
from tests.helpers_decoding import SPECIAL, random_sources, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def sources_and_targets() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return random_sources([5, 9, 3], seed=2), torch.randint(4, 40, (3, 6), generator=gen)


def stepwise_logits(engine: Engine, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of `tgt` decoded one token at a time on the engine's caches."""
    src_mask = padding_mask(src, SPECIAL.pad)
    memory = engine.encode(src, src_mask)
    caches = engine.new_caches()
    steps = [
        engine.decode(tgt[:, i : i + 1], memory, src_mask, caches, i) for i in range(tgt.size(1))
    ]
    return torch.cat(steps, dim=1)


def engine_linears(engine: Engine) -> list[torch.nn.Module]:
    """The layers the engine runs (its model keeps float32 layers of its own)."""
    holders = [engine.encoder_linears, engine.decoder_linears, engine.generator]
    return [m for holder in holders for m in holder.modules()]


@pytest.mark.parametrize("tie_output", [True, False], ids=["tied", "untied"])
def test_int8_logits_are_close_to_float32(tie_output: bool, tiny_model) -> None:
    model = tiny_model(seed=0, dropout=0.0, tie_output=tie_output).eval()
    quantized = Engine(model, quantize="int8")
    assert isinstance(model.generator, torch.nn.Linear)  # the model keeps its float layers
    assert not any(isinstance(m, torch.nn.Linear) for m in engine_linears(quantized))
    if tie_output:  # the float model still shares one table; embeddings stay float32
        assert model.generator.weight is model.tgt_embed.weight
        assert model.tgt_embed.weight.dtype == torch.float32
    src, tgt = sources_and_targets()
    with torch.no_grad():
        expected = torch.log_softmax(model(src, tgt), dim=-1)
        got = torch.log_softmax(stepwise_logits(quantized, src, tgt), dim=-1)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 0.15  # log-probs of a ~3-wide distribution
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9


def test_int8_cached_decoding_is_close_to_the_full_pass(tiny_model) -> None:
    """The split cross-attention projections and the KV cache work under int8. Activations are
    quantized per call (one scale per input tensor), so a step equals the float full pass only
    up to int8 rounding."""
    model = tiny_model(seed=1, dropout=0.0).eval()
    quantized = Engine(model, quantize="int8")
    src, tgt = sources_and_targets()
    src_mask = padding_mask(src, SPECIAL.pad)
    with torch.no_grad():
        full = model.decode(tgt, model.encode(src, src_mask), src_mask)
        torch.testing.assert_close(stepwise_logits(quantized, src, tgt), full, atol=0.2, rtol=0.0)
    result = beam_search(quantized, src, SPECIAL, SearchConfig(beam_size=3))
    assert len(result.hypotheses) == 3


def test_int8_split_projections_hold_the_slices_of_in_proj(tiny_model) -> None:
    """int8 quantizes cross-attention's q and k|v as layers of their own: copies of the two
    slices of the fused projection, which the model keeps."""
    model = tiny_model(seed=0, dropout=0.0)
    cross = model.decoder.layers[0].cross_attn.in_proj
    D = cross.in_features
    for start, end in ((0, D), (D, 3 * D)):
        part = _rows(cross, start, end, _copy)
        assert part.weight is not cross.weight
        torch.testing.assert_close(part.weight, cross.weight[start:end], atol=0.0, rtol=0.0)
        torch.testing.assert_close(part.bias, cross.bias[start:end], atol=0.0, rtol=0.0)


def test_int8_is_refused_off_the_cpu_and_with_autocast() -> None:
    check_quantize("none", "cuda", "bf16")
    check_quantize("int8", "cpu", "fp32")
    with pytest.raises(UserError, match="CPU only"):
        check_quantize("int8", "cuda", "fp32")
    with pytest.raises(UserError, match="--precision bf16"):
        check_quantize("int8", "cpu", "bf16")


@pytest.mark.skipif(
    not runtime.autocast_supported("cpu", torch.bfloat16), reason="no CPU bf16 autocast"
)
def test_bf16_search_runs_with_a_bf16_cache(tiny_model) -> None:
    model = Engine(tiny_model(seed=0, dropout=0.0).eval())
    src, _ = sources_and_targets()
    expected = beam_search(model, src, SPECIAL, SearchConfig(beam_size=3)).best_tokens()
    caches = []
    original = model.new_caches

    def recording_new_caches() -> list:
        caches.extend(original())
        return caches

    model.new_caches = recording_new_caches
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = beam_search(model, src, SPECIAL, SearchConfig(beam_size=3)).best_tokens()
    assert caches[0].self_k.dtype == torch.bfloat16
    assert len(got) == len(expected) and all(isinstance(t, list) for t in got)


def test_translate_py_quantize_int8(tmp_path: Path, tiny_model) -> None:
    """`translate.py --quantize int8` as a user runs it, on a tied model: the same output as
    the int8 model in-process."""
    tokenizer = tiny_tokenizer(tmp_path / "spm")
    model = tiny_model(vocab_size=tokenizer.src_vocab_size, seed=2, dropout=0.0)
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(checkpoint, model_payload(model, tokenizer))
    sentences = ["Ein Mann fährt Fahrrad.", "", "Die Sonne scheint."]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "translate.py"), "-c", str(checkpoint), "--quantize", "int8"]
        + ["--beam", "2", "--device", "cpu", *sentences],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""
    int8 = Translator(Engine(model, quantize="int8"), tokenizer, SearchConfig(beam_size=2))
    assert lines == int8.translate(sentences)
