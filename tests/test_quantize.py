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

from checkpoint import model_payload, save_checkpoint
from common.errors import UserError
from decoding import SearchConfig, Translator, cli
from decoding.search import beam_search
from model import MultiHeadAttention, padding_mask
from model.quantize import quantize_dynamic_int8
from tests.helpers_decoding import SPECIAL, random_sources, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def sources_and_targets() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return random_sources([5, 9, 3], seed=2), torch.randint(4, 40, (3, 6), generator=gen)


@pytest.mark.parametrize("tie_output", [True, False], ids=["tied", "untied"])
def test_int8_logits_are_close_to_float32(tie_output: bool, tiny_model) -> None:
    model = tiny_model(seed=0, dropout=0.0, tie_output=tie_output)
    quantized = quantize_dynamic_int8(model)
    assert quantized is not model and isinstance(model.generator, torch.nn.Linear)
    assert not any(isinstance(m, torch.nn.Linear) for m in quantized.modules())
    if tie_output:  # the float model still shares one table; embeddings stay float32
        assert model.generator.weight is model.tgt_embed.weight
        assert quantized.tgt_embed.weight.dtype == torch.float32
    src, tgt = sources_and_targets()
    with torch.no_grad():
        expected = torch.log_softmax(model(src, tgt), dim=-1)
        got = torch.log_softmax(quantized(src, tgt), dim=-1)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 0.15  # log-probs of a ~3-wide distribution
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9


def test_int8_cached_decoding_is_close_to_its_full_pass(tiny_model) -> None:
    """The split cross-attention projections and the KV cache work under int8. Activations are
    quantized per call (one scale per input tensor), so a step equals the full pass only up
    to int8 rounding."""
    quantized = quantize_dynamic_int8(tiny_model(seed=1, dropout=0.0))
    src, tgt = sources_and_targets()
    src_mask = padding_mask(src, SPECIAL.pad)
    with torch.no_grad():
        memory = quantized.encode(src, src_mask)
        full = quantized.decode(tgt, memory, src_mask)
        caches = quantized.new_caches()
        for i in range(tgt.size(1)):
            step = quantized.decode(tgt[:, i : i + 1], memory, src_mask, caches, offset=i)
            torch.testing.assert_close(step[:, 0], full[:, i], atol=0.2, rtol=0.0)
    result = beam_search(quantized, src, SPECIAL, SearchConfig(beam_size=3))
    assert len(result.hypotheses) == 3


def test_split_in_proj_changes_nothing() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2).eval()
    query, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        cross, self_ = attn(query, memory).output, attn(query).output
        attn.split_in_proj()
        assert attn.in_proj is None
        torch.testing.assert_close(attn(query, memory).output, cross, atol=1e-6, rtol=0.0)
        torch.testing.assert_close(attn(query).output, self_, atol=1e-6, rtol=0.0)


def test_split_projections_decode_step_by_step_as_the_full_pass(tiny_model) -> None:
    # Every attention split (int8 splits only cross-attention): the one-token step path
    # (`DecoderLayer.step`) must take q and k|v from the two modules as the fused one does.
    model = tiny_model(seed=0, dropout=0.0).eval()
    src, tgt = sources_and_targets()
    src_mask = padding_mask(src, SPECIAL.pad)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        for layer in model.decoder.layers:
            layer.self_attn.split_in_proj()
            layer.cross_attn.split_in_proj()
        caches = model.new_caches()
        for i in range(tgt.size(1)):
            step = model.decode(tgt[:, i : i + 1], memory, src_mask, caches, offset=i)
            torch.testing.assert_close(step[:, 0], full[:, i], atol=1e-5, rtol=0.0)


def test_int8_is_refused_off_the_cpu_and_with_autocast() -> None:
    cli.check_quantize("none", "cuda", "bf16")
    cli.check_quantize("int8", "cpu", "fp32")
    with pytest.raises(UserError, match="CPU only"):
        cli.check_quantize("int8", "cuda", "fp32")
    with pytest.raises(UserError, match="--precision bf16"):
        cli.check_quantize("int8", "cpu", "bf16")


@pytest.mark.skipif(
    not cli.autocast_supported("cpu", torch.bfloat16), reason="no CPU bf16 autocast"
)
def test_bf16_search_runs_with_a_bf16_cache(tiny_model) -> None:
    model = tiny_model(seed=0, dropout=0.0)
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
    int8 = Translator(quantize_dynamic_int8(model), tokenizer, SearchConfig(beam_size=2))
    assert lines == int8.translate(sentences)
