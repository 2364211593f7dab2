"""The contract between the model and the engine beside it: the engine's one-token step
(`Engine.step`, what continuous batching and int8 run) computes the model's logits up to float
rounding, its encoder (int8's code path, here on float layers) the model's memory, and its
searches find the model's hypotheses, post- and pre-norm, for short and long sources; the model
is left as it was.

Legend: B batch, S src len, T tgt len, V vocab.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from attnmt.decoding.config import SearchConfig
from attnmt.decoding.scoring import score_batch
from attnmt.decoding.search import beam_search, greedy_search
from attnmt.engine import Engine, packing
from attnmt.engine import engine as engine_module
from attnmt.engine.cache import StepKVCache
from attnmt.engine.engine import PackedLinear
from attnmt.engine.packing import Packing, bf16_packing_runs
from attnmt.model import padding_mask
from tests.helpers_decoding import SEARCH_MODEL, SPECIAL, StepEngine, random_sources

NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
LENGTHS = {"short": [5, 9, 3], "long": [20, 7, 26]}


@NORMS
@pytest.mark.parametrize("lengths", ["short", "long"])
def test_engine_logits_equal_the_models(norm_first: bool, lengths: str, tiny_model) -> None:
    model = tiny_model(seed=0, dropout=0.0, norm_first=norm_first).eval()
    engine = Engine(model)
    src = random_sources(LENGTHS[lengths], seed=2)  # (B, S)
    tgt = torch.randint(4, 40, (src.size(0), 7), generator=torch.Generator().manual_seed(3))
    src_mask = padding_mask(src, SPECIAL.pad)
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # (B, S, D)
        engine.int8 = True  # its encoder code, on the model's float layers
        torch.testing.assert_close(engine.encode(src, src_mask), memory, atol=1e-5, rtol=0.0)
        full = model.decode(tgt, memory, src_mask)  # (B, T, V) teacher-forced
        caches = [StepKVCache() for _ in model.decoder.layers]
        for i in range(tgt.size(1)):
            step = engine.step(tgt[:, i : i + 1], memory, src_mask, caches, offset=i)
            torch.testing.assert_close(step[:, 0], full[:, i], atol=1e-5, rtol=0.0)
        with pytest.raises(ValueError, match="one new token"):
            engine.step(tgt[:, :2], memory, src_mask, caches, offset=0)


@NORMS
@pytest.mark.parametrize("beam", [1, 4])
def test_engine_step_searches_find_the_models_hypotheses(norm_first: bool, beam: int, tiny_model):
    model = tiny_model(seed=1, **{**SEARCH_MODEL, "norm_first": norm_first}).eval()
    src = random_sources([6, 19, 2, 11], seed=4)
    cfg = SearchConfig(beam_size=beam, nbest=beam, max_len_a=1.5, max_len_b=6)
    search = greedy_search if beam == 1 else beam_search
    want = search(model, src, SPECIAL, cfg).hypotheses
    got = search(StepEngine(model), src, SPECIAL, cfg).hypotheses
    assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in want]
    got_scores = torch.tensor([h.score for n in got for h in n])
    want_scores = torch.tensor([h.score for n in want for h in n])
    torch.testing.assert_close(got_scores, want_scores, atol=1e-4, rtol=0.0)
    assert len({len(n[0].tokens) for n in want}) > 1  # not a degenerate model


def test_engine_leaves_the_model_as_it_was(tiny_model) -> None:
    model = tiny_model(seed=0)
    modules_before = [type(m) for m in model.modules()]
    weights = {name: t.clone() for name, t in model.state_dict().items()}
    model.train()
    engine = Engine(model, quantize="int8")
    assert engine.training and model.training  # the engine follows the model's mode
    assert [type(m) for m in model.modules()] == modules_before
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name


def test_engine_refuses_what_it_cannot_do(tiny_model) -> None:
    with pytest.raises(ValueError, match="'none' or 'int8'"):
        Engine(tiny_model(seed=0), quantize="int4")


def test_pack_flag_values_parse_into_groups() -> None:
    assert Packing.parse("auto") is None
    assert Packing.parse("off") == Packing()
    assert Packing.parse("all") == Packing(True, True, True, True)
    assert Packing.parse("generator,encoder") == Packing(generator=True, encoder=True)
    with pytest.raises(ValueError, match="unknown decoders; use auto, off, all"):
        Packing.parse("generator,decoders")


@pytest.mark.skipif(not packing.packing_runs(), reason="torch built without oneDNN's packed linear")
def test_packing_is_chosen_by_timing_and_remembered(tmp_path, monkeypatch) -> None:
    """A group is packed where its packed matmuls took less than `PAYS` of the unpacked ones'
    time; the choice is stored under the CPU, torch, threads and shapes and read, not timed,
    the next time; other shapes are timed again."""
    timed = []

    def fake_time(shapes, bf16=False, budget_s=0.1):  # (unpacked, packed) s by the out width
        timed.append(shapes)
        return {48: (1.0, 0.5), 16: (1.0, 0.96)}.get(shapes[0][2], (1.0, 2.0))

    monkeypatch.setattr(packing, "time_group", fake_time)
    monkeypatch.setattr(packing, "bf16_packing_runs", lambda: False)
    cache = tmp_path / "packing.json"
    got = packing.choose(16, 64, 48, cache)  # generator out 48: pays; decoder (48 = 3D): pays
    assert got == Packing(generator=True, decoder=True, encoder=True)
    assert len(timed) == 3  # generator, decoder, encoder (no bf16 on this CPU)
    assert packing.choose(16, 64, 48, cache) == got and len(timed) == 3  # read, not timed
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["packed"] == {"generator": True, "decoder": True, "encoder": True}
    assert packing.choose(16, 64, 16, cache) == Packing(decoder=True, encoder=True)
    assert len(timed) == 6  # other shapes: timed; 0.96 of the time is noise, not a gain


@pytest.mark.skipif(not packing.packing_runs(), reason="torch built without oneDNN's packed linear")
def test_timing_leaves_the_global_rng_alone(tmp_path) -> None:
    """A run that times the choice and a resumed one that reads it must draw the same random
    numbers afterwards (resume == uninterrupted)."""
    torch.manual_seed(5)
    packing.choose(16, 32, 40, tmp_path / "packing.json")
    after_timing = torch.rand(3)
    torch.manual_seed(5)
    packing.choose(16, 32, 40, tmp_path / "packing.json")  # read from the cache
    assert torch.equal(torch.rand(3), after_timing)


@pytest.mark.skipif(not packing.packing_runs(), reason="torch built without oneDNN's packed linear")
def test_timing_a_group_stays_within_its_budget() -> None:
    """The real timer on a model's shapes: positive medians, within the budget's quarter (plus
    the warm-up and one last pair of passes, at these sizes well under a second)."""
    shapes = packing.layer_shapes(32, 64, 100)
    start = time.perf_counter()
    plain, packed = packing.time_group(shapes["decoder"])
    assert plain > 0 and packed > 0
    assert time.perf_counter() - start < 1.0


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@NORMS
def test_packed_engine_computes_the_models_logits(norm_first: bool, tiny_model) -> None:
    """Packed, the engine's decoder linear layers and output projection run on oneDNN's
    pre-packed weights, every search on the one-token step: the model's logits up to
    float rounding, teacher-forced and one token at a time, and the model's hypotheses; under
    bf16 autocast a packed layer gives autocast's result."""
    model = tiny_model(seed=1, **{**SEARCH_MODEL, "norm_first": norm_first}).eval()
    engine = Engine(model, pack=True)
    linears = [engine.generator, *(m for d in engine.decoder_linears for m in d.values())]
    assert engine.packed and all(isinstance(m, PackedLinear) for m in linears)
    assert all(isinstance(c, StepKVCache) for c in engine.new_caches())
    src = random_sources(LENGTHS["long"], seed=2)
    tgt = torch.randint(4, 40, (src.size(0), 5), generator=torch.Generator().manual_seed(3))
    src_mask = padding_mask(src, SPECIAL.pad)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)  # (B, T, V)
        torch.testing.assert_close(engine.decode(tgt, memory, src_mask), full, atol=1e-5, rtol=0)
        caches = engine.new_caches()
        for i in range(tgt.size(1)):
            step = engine.decode(tgt[:, i : i + 1], memory, src_mask, caches, offset=i)
            torch.testing.assert_close(step[:, 0], full[:, i], atol=1e-5, rtol=0.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = torch.randn(3, model.cfg.d_model)
            got = engine.generator(hidden)
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got, model.generator(hidden))
    src = random_sources([6, 19, 2, 11], seed=4)
    cfg = SearchConfig(beam_size=4, nbest=4, max_len_a=1.5, max_len_b=6)
    want = beam_search(model, src, SPECIAL, cfg).hypotheses
    got = beam_search(engine, src, SPECIAL, cfg).hypotheses
    assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in want]
    assert len({len(n[0].tokens) for n in want}) > 1  # not a degenerate model


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("fp32", [True, False], ids=["fp32-packed", "bf16-only"])
def test_packed_layer_under_bf16_autocast_gives_autocasts_result(fp32: bool) -> None:
    """Under bf16 autocast a packed layer computes on its bf16 copy what autocast's `F.linear`
    computes (the same bf16 operands in oneDNN's matmul; the bias added before the one
    rounding to bf16, where autocast may round twice: one bf16 step apart at most), for
    float32 and bf16 inputs and any row count; the copy is made at the first bf16 call, never
    in float32."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    packed = PackedLinear(linear, fp32=fp32)
    with torch.no_grad():
        x = torch.randn(5, 7, 48)
        torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=0.0)
        assert packed.bf16 is None  # float32 made no bf16 copy
        for rows in (x[0, :1], x[0], x, x.bfloat16()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got, want = packed(rows), linear(rows)
            assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
            torch.testing.assert_close(got, want, atol=1e-3, rtol=2**-7)  # one bf16 step
        assert (packed.bf16 is not None) == packed.packs_bf16 == bf16_packing_runs()
        with torch.autocast("cpu", dtype=torch.float16):  # not bf16: the layer's own
            assert torch.equal(packed(x), linear(x))


@pytest.mark.skipif(not bf16_packing_runs(), reason="oneDNN has no bf16 on this CPU")
@pytest.mark.parametrize("beam", [1, 4])
def test_bf16_packed_engine_searches_the_models_scores(beam: int, tiny_model) -> None:
    """Under bf16 autocast a packed engine runs its own encoder and one-token step on the bf16
    copies (`bf16_packed`, `own_decoder`): the model's memory and logits under autocast, up to
    bf16 rounding, teacher-forced one token at a time; its searches' hypotheses carry the
    log-probabilities the model gives them (teacher-forced, under autocast)."""
    model = tiny_model(seed=1, **SEARCH_MODEL).eval()
    engine = Engine(model, pack=True)
    src = random_sources(LENGTHS["long"], seed=2)
    tgt = torch.randint(4, 40, (src.size(0), 5), generator=torch.Generator().manual_seed(3))
    src_mask = padding_mask(src, SPECIAL.pad)
    assert not engine.bf16_packed  # outside autocast
    cfg = SearchConfig(beam_size=beam, nbest=beam, max_len_a=1.5, max_len_b=6)
    search = greedy_search if beam == 1 else beam_search
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert engine.bf16_packed and engine.own_decoder
        memory = model.encode(src, src_mask)
        torch.testing.assert_close(engine.encode(src, src_mask), memory, atol=0.05, rtol=0.02)
        assert all(m.bf16 is not None for d in engine.encoder_linears for m in d.values())
        full = model.decode(tgt, memory, src_mask).float()  # (B, T, V)
        caches = engine.new_caches()
        assert all(isinstance(c, StepKVCache) for c in caches)
        for i in range(tgt.size(1)):
            step = engine.decode(tgt[:, i : i + 1], memory, src_mask, caches, offset=i)
            torch.testing.assert_close(step[:, 0].float(), full[:, i], atol=0.05, rtol=0.02)
        src = random_sources([6, 19, 2, 11], seed=4)
        found = search(engine, src, SPECIAL, cfg).hypotheses
        hyps = [(j, h) for j, n in enumerate(found) for h in n]
        sources = [[int(t) for t in src[j] if t > SPECIAL.eos] for j, _ in hyps]
        scored = score_batch(model, sources, [h.tokens for _, h in hyps], SPECIAL, cfg)
    got = torch.tensor([h.log_prob for _, h in hyps])
    want = torch.tensor([s.log_prob for s in scored])
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.01)
    assert len({len(n[0].tokens) for n in found}) > 1  # not a degenerate model


def test_the_caches_decide_the_decoder_path_whatever_the_autocast(tiny_model) -> None:
    """Under bf16 autocast a packed engine's own decoder runs (`own_decoder`), outside it the
    model's may: caches made in one state and decoded in the other take their own path (the
    model's `KVCache` the model's layers) with the same logits as in the state that made
    them."""
    model = tiny_model(seed=1, **SEARCH_MODEL).eval()
    engine = Engine(model, pack=Packing(generator=True, bf16=True))  # the model's own decoder
    src = random_sources(LENGTHS["short"], seed=2)
    src_mask = padding_mask(src, SPECIAL.pad)
    tgt = torch.full((src.size(0), 1), 2)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        outside = engine.new_caches()
        want = engine.decode(tgt, memory, src_mask, engine.new_caches(), offset=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inside = engine.new_caches()
            got = engine.decode(tgt, memory, src_mask, outside, offset=0)  # no AttributeError
            want_inside = engine.decode(tgt, memory, src_mask, engine.new_caches(), offset=0)
        got_inside = engine.decode(tgt, memory, src_mask, inside, offset=0)
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.02)
    torch.testing.assert_close(got_inside.float(), want_inside.float(), atol=0.05, rtol=0.02)
    assert type(outside[0]) is not type(inside[0]) or not engine.pack_bf16


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_the_engine_packs_the_groups_chosen(tiny_model, monkeypatch) -> None:
    """pack=None packs what `packing.choose` says for the model's shapes: the output projection
    alone keeps the model's layers; packed decoder layers put searches on the one-token step;
    a packed encoder encodes on its packed copies, the model's memory up to float rounding;
    int8 and pack=False pack nothing."""
    model = tiny_model(seed=0).eval()
    asked = []
    choice = Packing(generator=True)
    monkeypatch.setattr(
        engine_module, "choose", lambda *shape, cache=None: asked.append(shape) or choice
    )
    narrow = Engine(model)
    assert asked == [(model.cfg.d_model, model.cfg.d_ff, model.cfg.tgt_vocab_size)]
    assert narrow.packed and not narrow.own_decoder
    assert not any(isinstance(c, StepKVCache) for c in narrow.new_caches())  # the model's
    choice = Packing(decoder=True, encoder=True)
    wide = Engine(model)
    assert not wide.packed and wide.own_decoder
    assert isinstance(wide.decoder_linears[0]["cross_q"], PackedLinear)
    assert isinstance(wide.encoder_linears[0]["ff1"], PackedLinear)
    src = random_sources(LENGTHS["long"], seed=2)
    with torch.no_grad():
        torch.testing.assert_close(wide.encode(src), model.encode(src), atol=1e-5, rtol=1e-4)
    for engine in (Engine(model, quantize="int8"), Engine(model, pack=False)):
        assert not engine.packed
        assert not any(isinstance(m, PackedLinear) for m in engine.modules())
    assert len(asked) == 2  # int8 and pack=False time nothing
    with pytest.raises(ValueError, match="not with int8"):
        Engine(model, quantize="int8", pack=True)
