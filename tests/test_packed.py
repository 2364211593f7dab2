"""Pre-packed oneDNN linear layers (`engine/packed.py`): the same numbers as `F.linear` to
float32 rounding, the same parameters, the same search output; `F.linear` wherever a gradient
is needed; and `translate.py`'s CPU loading path uses them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from checkpoint import model_payload, save_checkpoint
from decoding.config import SearchConfig
from decoding.search import beam_search, greedy_search
from engine import Engine, load_engine
from engine.packed import PackedLinear, packing_available
from tests.helpers_decoding import SEARCH_MODEL, SPECIAL, random_sources, tiny_tokenizer

pytestmark = pytest.mark.skipif(
    not packing_available(), reason="this torch build has no oneDNN (mkldnn) linear kernels"
)


def linear_pair(d_in: int = 24, d_out: int = 40, bias: bool = True) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(0)
    plain = nn.Linear(d_in, d_out, bias=bias)
    return plain, PackedLinear.from_linear(plain)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24), (1, 24)])
def test_packed_equals_f_linear(shape: tuple[int, ...], bias: bool) -> None:
    plain, packed = linear_pair(bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        got, want = packed(x), plain(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_row_slice_equals_slice_of_the_weight() -> None:
    """`rows=(a, b)` (the q or k|v slice of a fused projection) = F.linear on those rows."""
    plain, packed = linear_pair(d_out=3 * 8)
    x = torch.randn(4, 24)
    with torch.no_grad():
        got = packed(x, rows=(8, 24))
    want = F.linear(x, plain.weight[8:24], plain.bias[8:24])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_copy_follows_in_place_weight_changes() -> None:
    plain, packed = linear_pair()
    x = torch.randn(4, 24)
    with torch.no_grad():
        before = packed(x)
        plain.weight.mul_(2.0)  # shared parameter, changed in place (as load_state_dict does)
        after = packed(x)
    torch.testing.assert_close(after, plain(x).detach(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before, after)


def test_gradients_use_f_linear() -> None:
    """With autograd on (training), the layer is a plain nn.Linear: gradients flow."""
    plain, packed = linear_pair()
    x = torch.randn(4, 24, requires_grad=True)
    packed(x).sum().backward()
    assert packed.weight.grad is not None and x.grad is not None
    want = torch.ones(4, 40) @ plain.weight  # d(sum)/dx
    torch.testing.assert_close(x.grad, want)


def test_bf16_autocast_returns_bf16_like_autocast() -> None:
    plain, packed = linear_pair()
    x = torch.randn(6, 24)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = packed(x), plain(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_engine_packs_on_the_models_parameters_and_ties(tiny_model) -> None:
    model = tiny_model(seed=0, tie_output=True)
    before = {name: t.data_ptr() for name, t in model.state_dict().items()}
    engine = Engine(model, pack=True)
    assert {name: t.data_ptr() for name, t in model.state_dict().items()} == before
    assert not any(isinstance(m, PackedLinear) for m in model.modules())  # model unchanged
    assert isinstance(engine.generator, PackedLinear)
    assert engine.generator.weight is model.tgt_embed.weight
    linears = [m for m in engine.modules() if isinstance(m, nn.Linear)]
    packed = [m for m in linears if isinstance(m, PackedLinear)]
    assert {id(m.weight) for m in packed} == {id(p) for p in model.parameters() if p.dim() == 2}


@pytest.mark.parametrize("beam", [1, 3])
def test_search_output_is_unchanged(beam: int, tiny_model) -> None:
    model = tiny_model(seed=2, **SEARCH_MODEL)
    src = random_sources([5, 9, 3, 7], seed=3)
    cfg = SearchConfig(beam_size=beam, nbest=beam)
    search = greedy_search if beam == 1 else beam_search
    want = search(Engine(model, pack=False), src, SPECIAL, cfg).hypotheses
    got = search(Engine(model, pack=True), src, SPECIAL, cfg).hypotheses
    assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(
            torch.tensor([h.score for h in g]), torch.tensor([h.score for h in w])
        )


def test_translate_loading_packs_on_cpu_only_without_int8(tmp_path, tiny_model) -> None:
    """`load_engine` (what translate.py and the benchmarks load through) packs fp32 CPU
    models, and leaves --quantize int8 to torch.ao's modules."""
    tokenizer = tiny_tokenizer(tmp_path / "spm")
    model = tiny_model(vocab_size=tokenizer.src_vocab_size, seed=2, dropout=0.0)
    save_checkpoint(tmp_path / "model.pt", model_payload(model, tokenizer))
    packed, _ = load_engine([tmp_path / "model.pt"], "cpu")
    assert isinstance(packed.generator, PackedLinear)
    int8, _ = load_engine([tmp_path / "model.pt"], "cpu", quantize="int8")
    assert not any(isinstance(m, PackedLinear) for m in int8.modules())


def test_fused_relu_equals_relu_of_the_output() -> None:
    plain, packed = linear_pair()
    x = torch.randn(5, 24)
    with torch.inference_mode():
        fused = packed(x, relu=True)
        assert torch.equal(fused, torch.relu(packed(x)))
    torch.testing.assert_close(fused, torch.relu(plain(x)), rtol=1e-5, atol=1e-5)
    y = torch.randn(5, 24, requires_grad=True)  # the F.linear path (autograd) applies it too
    assert torch.equal(packed(y, relu=True), torch.relu(F.linear(y, plain.weight, plain.bias)))
