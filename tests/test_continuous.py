"""Greedy search with continuous batching (`engine.continuous`): a row freed by a finished
sentence takes the next sentence at once. Its outputs equal batch-by-batch `greedy_search`'s
(tokens exactly, scores to float rounding), through refills, a source longer than any before,
histories past the cache's first capacity, budgets and the minimum length; `Translator` takes
it for greedy search and reports progress as sentences finish. `GreedyStream` (serve.py's)
takes sentences between its steps with the same outputs, rows emptying and refilling."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from attnmt.data.batching import encode_source_batch
from attnmt.decoding.search import SearchConfig, greedy_search
from attnmt.engine import Engine
from attnmt.engine.beams import BeamStream
from attnmt.engine.cache import WIDTH_STEP, SlotCache, SlotStep, width
from attnmt.engine.continuous import GreedyStream, continuous_greedy_search
from attnmt.engine.packing import bf16_packing_runs
from tests.helpers_decoding import SEARCH_MODEL, SPECIAL, StepEngine, single_thread
from tests.test_search import assert_same_results


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def sources(n: int, seed: int, max_len: int = 20) -> list[list[int]]:
    """`n` id lists (no specials) of random lengths 1..max_len, in no particular order."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n,), generator=gen).tolist()
    return [torch.randint(4, 40, (k,), generator=gen).tolist() for k in lengths]


def batch_by_batch(model: torch.nn.Module, src: list[list[int]], cfg: SearchConfig) -> list:
    """`greedy_search` on consecutive batches of `cfg.batch_size`: what continuous batching
    replaces, on the same one-token step kernel (so the same tokens, also in bf16)."""
    step = StepEngine(model.model, pack=False)
    for same in ("generator", "encoder_linears", "decoder_linears", "pack_bf16"):
        setattr(step, same, getattr(model, same))  # the same layers, their hooks included
    found = []
    for start in range(0, len(src), cfg.batch_size):
        ids = encode_source_batch(src[start : start + cfg.batch_size], SPECIAL)
        found += greedy_search(step, ids, SPECIAL, cfg).hypotheses
    return found


@pytest.mark.parametrize("norm_first", [True, False])
def test_continuous_equals_batch_by_batch(tiny_model, norm_first: bool) -> None:  # noqa: ANN001
    engine = Engine(tiny_model(seed=0, **{**SEARCH_MODEL, "norm_first": norm_first})).eval()
    src = sources(30, seed=7)  # unsorted: later sentences are longer than the first rows'
    assert max(map(len, src[4:])) > max(map(len, src[:4]))  # the cross K/V buffers widen
    cfg = SearchConfig(batch_size=4, max_len_a=1.5, max_len_b=8)
    done: list[int] = []
    got = continuous_greedy_search(engine, src, SPECIAL, cfg, progress=done.append)
    expected = batch_by_batch(engine, src, cfg)
    assert_same_results(got, expected)
    assert sum(done) == len(src) and len(done) > 1
    lengths = [len(nbest[0].tokens) for nbest in got]
    assert len(set(lengths)) > 3, "the test model should not be degenerate"
    assert max(lengths) > 16  # a history past the self-attention cache's first capacity


@pytest.mark.parametrize("budget", [0, 2])
def test_budget_forces_eos(tiny_model, budget: int) -> None:  # noqa: ANN001
    engine = Engine(tiny_model(seed=1, **SEARCH_MODEL)).eval()
    src = sources(9, seed=2)
    cfg = SearchConfig(batch_size=3, max_len_a=0.0, max_len_b=budget)
    got = continuous_greedy_search(engine, src, SPECIAL, cfg)
    assert_same_results(got, batch_by_batch(engine, src, cfg))
    assert {len(nbest[0].tokens) for nbest in got} == {budget}


def test_eos_is_never_the_first_token(tiny_model) -> None:  # noqa: ANN001
    """A model that always prefers EOS still generates one token first (minimum length 1)."""
    engine = Engine(tiny_model(seed=2, **SEARCH_MODEL)).eval()

    def prefer_eos(module, inputs, logits):  # noqa: ANN001, ANN202
        logits = logits.clone()
        logits[..., SPECIAL.eos] += 100.0
        return logits

    handle = engine.generator.register_forward_hook(prefer_eos)
    try:
        src = sources(7, seed=3)
        got = continuous_greedy_search(engine, src, SPECIAL, SearchConfig(batch_size=2))
        assert_same_results(got, batch_by_batch(engine, src, SearchConfig(batch_size=2)))
    finally:
        handle.remove()
    assert all(len(nbest[0].tokens) == 1 for nbest in got)


def test_fewer_sentences_than_rows_and_none(tiny_model) -> None:  # noqa: ANN001
    engine = Engine(tiny_model(seed=0, **SEARCH_MODEL)).eval()
    src = sources(3, seed=4)
    cfg = SearchConfig(batch_size=64)
    expected = batch_by_batch(engine, src, cfg)
    assert_same_results(continuous_greedy_search(engine, src, SPECIAL, cfg), expected)
    assert continuous_greedy_search(engine, [], SPECIAL, cfg) == []


@pytest.mark.parametrize("pack", [False, True], ids=["autocast", "bf16-packed"])
def test_continuous_equals_batch_by_batch_under_bf16_autocast(pack: bool, tiny_model) -> None:  # noqa: ANN001
    """Under CPU autocast the caches and score biases take the projections' dtype (bf16), on
    autocast's own layers or packed (`Engine.bf16_packed`, where oneDNN has bf16: the linear
    layers on bf16 copies); either way, what batch by batch search finds."""
    if pack and not bf16_packing_runs():
        pytest.skip("oneDNN has no bf16 on this CPU")
    engine = Engine(tiny_model(seed=0, **SEARCH_MODEL), pack=pack).eval()
    src = sources(12, seed=9)
    cfg = SearchConfig(batch_size=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = continuous_greedy_search(engine, src, SPECIAL, cfg)
        expected = batch_by_batch(engine, src, cfg)
    assert_same_results(got, expected)
    if pack:  # bf16 reached it
        assert engine.generator.bf16 is not None
        assert all(m.bf16 is not None for d in engine.decoder_linears for m in d.values())
    else:
        float32 = continuous_greedy_search(engine, src, SPECIAL, cfg)
        assert [n[0].tokens for n in got] != [n[0].tokens for n in float32]  # bf16 reached it


def test_stream_takes_sentences_between_steps_with_the_same_outputs(tiny_model) -> None:  # noqa: ANN001
    """Sentences added while others run (rows free, rows full, after every row emptied) get
    what each gets alone; `step` reports each once, by the index `add` gave."""
    engine = Engine(tiny_model(seed=0, **SEARCH_MODEL)).eval()
    src = sources(24, seed=11)
    cfg = SearchConfig(batch_size=4, max_len_a=1.5, max_len_b=8)
    stream = GreedyStream(engine, SPECIAL, cfg)
    arrivals = {0: [0], 1: [1, 2], 3: list(range(3, 9)), 6: [9]}  # step -> sentences added
    got = feed_between_steps(stream, src, arrivals, then=5)
    alone = [batch_by_batch(engine, [ids], cfg)[0] for ids in src]
    assert_same_results([[got[i]] for i in range(len(src))], alone)
    assert stream.step() == []  # nothing live: no step


@pytest.mark.parametrize("beam", [1, 3])
def test_stream_cancel_drops_a_requests_sentences_and_keeps_the_others_outputs(
    tiny_model,
    beam: int,  # noqa: ANN001
) -> None:
    """`cancel` between two steps drops sentences on rows and queued: the
    live rows shrink to the others', `step` never reports the dropped, and every other
    sentence (also one added after the cancel) gets what it gets without the cancel."""
    engine = Engine(tiny_model(seed=0, **SEARCH_MODEL)).eval()
    src = sources(10, seed=5)
    cfg = SearchConfig(beam_size=beam, batch_size=4, max_len_a=1.5, max_len_b=8)

    def run(cancel: bool) -> tuple[dict[int, object], list[int]]:
        stream = GreedyStream(engine, SPECIAL, cfg) if beam == 1 else BeamStream(engine, SPECIAL, cfg)  # fmt: skip
        stream.add(src[:2])  # the request that stays
        gone = list(stream.add(src[2:8]))  # the request whose client leaves
        got: dict[int, object] = {}
        for _ in range(2):
            got.update(stream.step())
        rows = stream.rows if beam == 1 else stream.beams
        on_rows = [sentence.index for sentence in rows.sentences]
        assert {2, 3} <= set(on_rows) and not got  # the gone request on rows and queued
        if cancel:
            assert stream.cancel(gone) == 6 and stream.live == 2
            assert [sentence.index for sentence in rows.sentences] == [0, 1]
        assert list(stream.add(src[8:])) == [8, 9]  # a request after the cancel
        while stream.live:
            got.update(stream.step())
        return got, on_rows

    kept, _ = run(cancel=True)
    everything, _ = run(cancel=False)
    assert sorted(kept) == [0, 1, 8, 9]
    nbest = (lambda found: [found]) if beam == 1 else (lambda found: found)
    assert_same_results([nbest(kept[i]) for i in kept], [nbest(everything[i]) for i in kept])


@pytest.mark.parametrize("beam", [1, 3])
def test_stream_cancel_of_a_first_row_moves_the_live_rows_behind_it(
    tiny_model,
    beam: int,  # noqa: ANN001
) -> None:
    """A cancelled sentence on the first row leaves a hole that the last live row moves into
    (its caches copied in place, under inference mode as `step`'s): the moved rows decode on
    to what they get without the cancel."""
    engine = Engine(tiny_model(seed=0, **SEARCH_MODEL)).eval()
    src = sources(6, seed=11)
    cfg = SearchConfig(beam_size=beam, batch_size=4, max_len_a=1.5, max_len_b=8)

    def run(cancel: bool) -> dict[int, object]:
        stream = GreedyStream(engine, SPECIAL, cfg) if beam == 1 else BeamStream(engine, SPECIAL, cfg)  # fmt: skip
        stream.add(src)
        got = dict(stream.step())
        rows = stream.rows if beam == 1 else stream.beams
        first = rows.sentences[0].index
        if cancel:
            assert stream.cancel([first]) == 1 and len(rows.sentences) == 3
            assert first not in [sentence.index for sentence in rows.sentences]
        while stream.live:
            got.update(stream.step())
        return got

    kept, everything = run(cancel=True), run(cancel=False)
    assert len(kept) == 5 and set(kept) < set(everything)
    nbest = (lambda found: [found]) if beam == 1 else (lambda found: found)
    assert_same_results([nbest(kept[i]) for i in kept], [nbest(everything[i]) for i in kept])


def feed_between_steps(
    stream: GreedyStream | BeamStream,
    src: list[list[int]],
    arrivals: dict[int, list[int]],
    then: int,
) -> dict[int, object]:
    """Add `src` to `stream` between its steps: at step t the sentences `arrivals[t]`, and once
    the stream has emptied, the next `then` at once; step until every one is reported. What
    `step` reported of each, by index (each once, by the index `add` gave)."""
    got: dict[int, object] = {}
    steps, added, emptied = 0, 0, False
    while added < len(src) or stream.live:
        if steps in arrivals or (emptied and added < len(src)):
            new = arrivals.get(steps, list(range(added, min(added + then, len(src)))))
            assert list(stream.add([src[i] for i in new])) == new
            added, emptied = new[-1] + 1, False
        for index, found in stream.step():
            assert index not in got
            got[index] = found
        emptied |= stream.live == 0
        steps += 1
    assert sorted(got) == list(range(len(src)))
    return got


def test_slot_cache_steps_read_whole_buffers_in_rounded_widths() -> None:
    """A step reads rows 0..n-1 of each buffer whole (contiguous: oneDNN's bmm copies a
    narrower slice first) in widths rounded up to `WIDTH_STEP`; resizing keeps live rows'
    histories and sources, also when the widths shrink."""
    H, Dh = 2, 3
    cache = SlotCache(rows=3, n_heads=H, d_head=Dh, src_len=5, like=torch.zeros(1))
    ks = [torch.randn(H, S, Dh) for S in (5, 11)]
    for row, k in enumerate(ks):
        cache.load(row, k, -k)

    def step(positions: list[int], src_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        n, end = len(positions), width(max(positions) + 1)
        bias = torch.zeros(n * H, 1, end)
        cache.start_step(SlotStep(torch.arange(n), torch.tensor(positions), end, width(src_len), bias, bias))  # fmt: skip
        new = torch.stack([torch.full((H, 1, Dh), float(p)) for p in positions])
        return cache.append(new, new)

    history = []
    for t in range(10):  # row 0 at position t, row 1 at t + 3 (from 3): widths 8, then 16
        k, v = step([t, t + 3], 11)
        history.append(k)
        assert k.shape == (2, H, width(t + 4), Dh) and k.is_contiguous() and v.is_contiguous()
        assert cache.cross_k.shape == (2, H, 16, Dh) and cache.cross_k.is_contiguous()
    assert k[0, :, :10, 0].eq(torch.arange(10.0)).all() and k[1, :, 3:13, 0].eq(torch.arange(3.0, 13.0)).all()  # fmt: skip
    k, _ = step([10], 5)  # row 1 gone: both widths shrink, row 0 keeps its past and source
    assert k.shape == (1, H, 16, Dh) and cache.cross_k.shape == (1, H, 8, Dh)
    assert k[0, :, :11, 0].eq(torch.arange(11.0)).all()
    assert torch.equal(cache.cross_k[0, :, :5], ks[0]) and cache.cross_k[0, :, 5:].eq(0).all()
    assert WIDTH_STEP == 8 and [width(n) for n in (1, 8, 9)] == [8, 8, 16]


def test_gather_encodes_arrivals_together_and_waits_at_most_gather_steps(tiny_model) -> None:  # noqa: ANN001
    """`gather=2`: a sentence added alone while rows run waits for a second one (encoded
    together), or at most 2 steps; with no row running it starts at once; outputs unchanged."""
    engine = Engine(tiny_model(seed=0, **SEARCH_MODEL)).eval()
    batches: list[int] = []
    encode = engine.encode
    engine.encode = lambda src, mask=None: batches.append(src.size(0)) or encode(src, mask)  # type: ignore[method-assign]
    src = sources(5, seed=11, max_len=6)
    cfg = SearchConfig(batch_size=4, max_len_a=0.0, max_len_b=30)
    stream = GreedyStream(engine, SPECIAL, cfg, gather=2)
    got: dict[int, list] = {}

    def step() -> None:
        got.update((index, [hyp]) for index, hyp in stream.step())

    stream.add([src[0]])
    step()  # nothing ran: encoded at once
    assert batches == [1]
    stream.add([src[1]])
    step()
    stream.add([src[2]])
    step()  # the second arrival joins the first: encoded together
    assert batches == [1, 2]
    stream.add([src[3]])
    for _ in range(2):
        step()
        assert batches == [1, 2]  # waited 1, then 2 steps
    step()  # waited its 2 steps: encoded alone
    assert batches == [1, 2, 1]
    stream.add([src[4]])
    while stream.live:
        step()
    assert batches == [1, 2, 1, 1]  # the last one waited alone after the others finished
    assert_same_results([got[i] for i in range(len(src))], [batch_by_batch(engine, [s], cfg)[0] for s in src])  # fmt: skip
