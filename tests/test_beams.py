"""Beam search with continuous batching (`engine.beams`): a slot freed by a finished sentence
takes the next sentence at once. Its n-best lists equal batch-by-batch `beam_search`'s (tokens
exactly, scores to float rounding) through refills, slots emptying, budgets, length penalties
and n-best; `BeamStream` takes sentences between its steps with the same outputs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from attnmt.data.batching import encode_source_batch
from attnmt.decoding.search import SearchConfig, beam_search
from attnmt.decoding.translator import Translator
from attnmt.engine import Engine
from attnmt.engine.beams import BeamStream, continuous_beam_search
from attnmt.engine.packing import bf16_packing_runs
from attnmt.engine.requests import RequestStream
from tests.helpers_decoding import SEARCH_MODEL, SPECIAL, StepEngine, single_thread
from tests.test_continuous import feed_between_steps, sources
from tests.test_search import assert_same_results


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def beam_batch_by_batch(model: torch.nn.Module, src: list[list[int]], cfg: SearchConfig) -> list:
    """`beam_search` on consecutive batches of `cfg.batch_size`, on the same one-token step."""
    step = StepEngine(model.model, pack=False)
    for same in ("generator", "encoder_linears", "decoder_linears", "pack_bf16"):
        setattr(step, same, getattr(model, same))
    found = []
    for start in range(0, len(src), cfg.batch_size):
        ids = encode_source_batch(src[start : start + cfg.batch_size], SPECIAL)
        found += beam_search(step, ids, SPECIAL, cfg).hypotheses
    return found


@pytest.mark.parametrize(
    "norm_first, nbest, length_penalty, budget",
    [(True, 1, 1.0, 8), (False, 3, 0.6, 8), (False, 2, 1.2, 0), (True, 1, 1.0, 2)],
)
def test_continuous_beams_equal_batch_by_batch(
    tiny_model,
    norm_first: bool,
    nbest: int,
    length_penalty: float,
    budget: int,  # noqa: ANN001
) -> None:
    engine = Engine(tiny_model(seed=0, **{**SEARCH_MODEL, "norm_first": norm_first})).eval()
    src = sources(30, seed=7)  # unsorted: later sentences are longer than the first slots'
    cfg = SearchConfig(
        beam_size=4, nbest=nbest, batch_size=3, max_len_a=1.5 if budget else 0.0,
        max_len_b=budget, length_penalty=length_penalty,
    )  # fmt: skip
    done: list[int] = []
    got = continuous_beam_search(engine, src, SPECIAL, cfg, progress=done.append)
    assert_same_results(got, beam_batch_by_batch(engine, src, cfg))
    assert sum(done) == len(src) and all(1 <= len(found) <= nbest for found in got)


@pytest.mark.parametrize("pack", [False, True], ids=["autocast", "bf16-packed"])
def test_continuous_beams_equal_batch_by_batch_under_bf16_autocast(pack: bool, tiny_model) -> None:  # noqa: ANN001
    """Under CPU autocast (the caches and biases in bf16; packed: the layers on bf16 copies)
    the same n-best lists as batch by batch, and not float32's (bf16 reached the search)."""
    if pack and not bf16_packing_runs():
        pytest.skip("oneDNN has no bf16 on this CPU")
    engine = Engine(tiny_model(seed=0, **SEARCH_MODEL), pack=pack).eval()
    src = sources(12, seed=9)
    cfg = SearchConfig(beam_size=3, nbest=2, batch_size=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = continuous_beam_search(engine, src, SPECIAL, cfg)
        expected = beam_batch_by_batch(engine, src, cfg)
    assert_same_results(got, expected)
    float32 = continuous_beam_search(engine, src, SPECIAL, cfg)
    assert [[h.score for h in n] for n in got] != [[h.score for h in n] for n in float32]


def test_stream_takes_sentences_between_steps_with_the_same_outputs(tiny_model) -> None:  # noqa: ANN001
    """Sentences added while others run (slots free, slots full, after every slot emptied)
    get what each gets alone; `step` reports each once, by the index `add` gave."""
    engine = Engine(tiny_model(seed=0, **SEARCH_MODEL)).eval()
    src = sources(20, seed=11)
    cfg = SearchConfig(beam_size=3, nbest=2, batch_size=3, max_len_a=1.5, max_len_b=8)
    stream = BeamStream(engine, SPECIAL, cfg)
    arrivals = {0: [0], 1: [1, 2], 3: list(range(3, 8)), 6: [8]}  # step -> sentences added
    got = feed_between_steps(stream, src, arrivals, then=4)
    alone = [beam_batch_by_batch(engine, [ids], cfg)[0] for ids in src]
    assert_same_results([got[i] for i in range(len(src))], alone)
    assert stream.step() == []  # nothing live: no step


def test_request_stream_answers_beam_requests_as_translator(tokenizer, model) -> None:  # noqa: ANN001
    """serve.py's stream for beam requests (`RequestStream.open`): each request's n-best
    texts and scores are `Translator.translate_nbest`'s (batch by batch), empty lines too,
    requests joining between steps; greedy options open a greedy stream, sampling none."""
    engine = Engine(model).eval()
    cfg = SearchConfig(beam_size=3, nbest=2, batch_size=2)
    stream = RequestStream.open(engine, tokenizer, cfg)
    assert stream is not None and isinstance(stream.search, BeamStream)
    requests = [["a b c", "", "d e f g h"], ["b a"], ["c c c c", "a"]]
    handles = [stream.add(requests[0])]
    answers: dict[int, list] = {}
    while stream.live:
        answers.update(stream.step())
        if len(handles) < len(requests):
            handles.append(stream.add(requests[len(handles)]))
    for handle, sentences in zip(handles, requests, strict=True):
        expected = Translator(engine, tokenizer, cfg).translate_nbest(sentences)
        got = answers[handle]
        assert [[t for t, _ in n] for n in got] == [[h.text for h in n] for n in expected]
        scores = [s for n in got for _, s in n]
        assert scores == pytest.approx([h.score for n in expected for h in n], abs=1e-4)
    greedy = RequestStream.open(engine, tokenizer, SearchConfig(beam_size=1))
    assert greedy is not None and not isinstance(greedy.search, BeamStream)
    assert RequestStream.open(engine, tokenizer, SearchConfig(sampling=True)) is None


@pytest.mark.parametrize("beam", [1, 3])
def test_request_stream_cancel_drops_a_request_and_keeps_the_others(
    tokenizer, model, beam: int
) -> None:  # noqa: ANN001
    """`RequestStream.cancel` between steps (serve.py's model thread, for a request whose
    client has gone): its sentences leave the search, `step` never answers it, and the
    other requests get what they get without it."""
    engine = Engine(model).eval()
    cfg = SearchConfig(beam_size=beam, batch_size=4, max_len_a=2.0, max_len_b=20)
    requests = [["a b c", "", "d e f g h"], ["b a c c a b", "c a", "a a b"], ["c c c c"]]

    def answers(cancel: bool) -> dict[int, list]:
        stream = RequestStream.open(engine, tokenizer, cfg)
        handles = [stream.add(sentences) for sentences in requests[:2]]
        got = dict(stream.step())
        if cancel:
            stream.cancel([handles[1]])
            assert stream.live == 1 and stream.sentences == 2  # the first request's two
            # the second's first two were on rows (4 of them), its third queued
        handles.append(stream.add(requests[2]))
        while stream.live:
            got.update(stream.step())
        return got

    kept, everything = answers(cancel=True), answers(cancel=False)
    assert sorted(kept) == [0, 2] and sorted(everything) == [0, 1, 2]
    for handle in (0, 2):
        texts = [[t for t, _ in n] for n in kept[handle]]
        assert texts == [[t for t, _ in n] for n in everything[handle]]
        scores = [s for n in kept[handle] for _, s in n]
        assert scores == pytest.approx([s for n in everything[handle] for _, s in n], abs=1e-4)
