"""Ensembles in greedy and beam search: one member == the model alone, identical copies == one
copy, and two different models score each step by their averaged log-probabilities."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.nn import Module

from attnmt.decoding.ensemble import Ensemble
from attnmt.decoding.search import SearchConfig, beam_search, greedy_search
from tests.helpers_decoding import (
    SEARCH_MODEL,
    SPECIAL,
    UncachedModel,
    random_sources,
    single_thread,
)
from tests.test_search import assert_same_results

BOS, EOS = SPECIAL.bos, SPECIAL.eos
SEARCHES = [(greedy_search, SearchConfig(beam_size=1)), (beam_search, SearchConfig(beam_size=4))]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


@pytest.fixture(scope="module")
def model_a(tiny_model) -> torch.nn.Module:  # noqa: ANN001
    return tiny_model(seed=0, **SEARCH_MODEL)


@pytest.fixture(scope="module")
def model_b(tiny_model) -> torch.nn.Module:  # noqa: ANN001
    """Another size: wider, deeper decoder, other weights."""
    return tiny_model(seed=1, d_model=48, d_ff=96, n_decoder_layers=3, **SEARCH_MODEL)


def as_tuples(result) -> list:  # noqa: ANN001
    return [[(h.tokens, h.score, h.log_prob) for h in nbest] for nbest in result.hypotheses]


@pytest.mark.parametrize(("search", "cfg"), SEARCHES)
def test_ensemble_of_one_is_the_model(search, cfg, model_a) -> None:  # noqa: ANN001
    """Bit-identical: same tokens, same scores, same log-probabilities."""
    src_ids = random_sources([5, 9, 2, 12], seed=3)
    cfg = SearchConfig(beam_size=cfg.beam_size, nbest=min(cfg.beam_size, 3))
    alone = search(model_a, src_ids, SPECIAL, cfg)
    ensemble = search(Ensemble([model_a]), src_ids, SPECIAL, cfg)
    assert as_tuples(ensemble) == as_tuples(alone)


@pytest.mark.parametrize(("search", "cfg"), SEARCHES)
def test_two_identical_copies_are_one(search, cfg, model_a) -> None:  # noqa: ANN001
    src_ids = random_sources([5, 9, 2, 12], seed=4)
    one = search(model_a, src_ids, SPECIAL, cfg).hypotheses
    two = search(Ensemble([model_a, model_a]), src_ids, SPECIAL, cfg).hypotheses
    assert_same_results(two, one)


def test_one_step_is_the_mean_of_log_probs(model_a: Module, model_b: Module) -> None:
    """By hand: the first token's score is the members' mean log-probability, renormalised
    (search normalises what `decode` returns), and EOS is then forced by a budget of 1."""
    src_ids = random_sources([6], seed=7)
    bos = torch.tensor([[BOS]])
    lp_a = torch.log_softmax(model_a(src_ids, bos)[0, 0].float(), dim=-1)  # (V,)
    lp_b = torch.log_softmax(model_b(src_ids, bos)[0, 0].float(), dim=-1)
    mean = (lp_a + lp_b) / 2
    step = mean - mean.logsumexp(dim=-1)  # what search scores
    assert mean.logsumexp(dim=-1).abs() > 1e-4, "the members should disagree"
    allowed = step.clone()
    allowed[[SPECIAL.pad, BOS, EOS]] = float("-inf")  # never generated first
    token = int(allowed.argmax())

    cfg = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=1, length_penalty=0.0)
    (nbest,) = greedy_search(Ensemble([model_a, model_b]), src_ids, SPECIAL, cfg).hypotheses
    assert nbest[0].tokens == [token]

    tgt_in = torch.tensor([[BOS, token]])
    lp_a2 = torch.log_softmax(model_a(src_ids, tgt_in)[0, 1].float(), dim=-1)
    lp_b2 = torch.log_softmax(model_b(src_ids, tgt_in)[0, 1].float(), dim=-1)
    mean2 = (lp_a2 + lp_b2) / 2
    expected = step[token] + mean2[EOS] - mean2.logsumexp(dim=-1)
    assert nbest[0].log_prob == pytest.approx(expected.item(), abs=1e-5)


def test_beam_scores_are_the_ensembles_teacher_forced_log_probs(
    model_a: Module, model_b: Module
) -> None:
    """Every step of every hypothesis: log_softmax of the members' mean log-probabilities."""
    src_ids = random_sources([6], seed=8)
    ensemble = Ensemble([model_a, model_b])
    result = beam_search(ensemble, src_ids, SPECIAL, SearchConfig(beam_size=3, nbest=3))
    for hyp in result.hypotheses[0]:
        tgt_in = torch.tensor([[BOS] + hyp.tokens])
        tgt_out = torch.tensor(hyp.tokens + [EOS])
        members = [torch.log_softmax(m(src_ids, tgt_in)[0].float(), -1) for m in (model_a, model_b)]
        lprobs = torch.log_softmax((members[0] + members[1]) / 2, dim=-1)  # (T, V)
        expected = lprobs.gather(1, tgt_out.unsqueeze(1)).sum().item()
        assert hyp.log_prob == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_every_members_cache_follows_the_beams(
    model_a: Module, model_b: Module, beam_size: int
) -> None:
    """Cached ensemble == ensemble of cache-free members (beams re-ranked, sentences pruned)."""
    src_ids = random_sources([4, 11, 7], seed=5)
    search = greedy_search if beam_size == 1 else beam_search
    cfg = SearchConfig(beam_size=beam_size, nbest=beam_size)
    cached = search(Ensemble([model_a, model_b]), src_ids, SPECIAL, cfg).hypotheses
    uncached = Ensemble([UncachedModel(model_a), UncachedModel(model_b)])
    assert_same_results(cached, search(uncached, src_ids, SPECIAL, cfg).hypotheses)


def test_ensemble_is_a_module(model_a: Module, model_b: Module) -> None:
    ensemble = Ensemble([model_a, model_b])
    ensemble.train()
    assert model_a.training and model_b.training
    ensemble.eval()
    n_params = sum(p.numel() for p in ensemble.parameters())
    assert n_params == model_a.num_parameters() + model_b.num_parameters()
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])
