"""Greedy and beam search: hand-computed beams on a scripted model, and properties on a tiny
random Transformer (greedy == beam 1, batched == one by one, cached == uncached)."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

import pytest
import torch

from attnmt.decoding.search import (
    SearchConfig,
    beam_search,
    greedy_search,
    length_penalty_divisor,
    max_lengths,
    topk,
)
from tests.helpers_decoding import (
    SEARCH_MODEL,
    SPECIAL,
    ScriptedModel,
    UncachedModel,
    random_sources,
    single_thread,
)

PAD, BOS, EOS, A, B, C = SPECIAL.pad, SPECIAL.bos, SPECIAL.eos, 4, 5, 6
V = 8


def source(first: int, length: int = 3) -> torch.Tensor:
    """One source row (1, length + 1) whose first id names the sentence for ScriptedModel."""
    return torch.tensor([[first] + [A] * (length - 1) + [EOS]])


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


@pytest.fixture(scope="module")
def tiny(tiny_model) -> torch.nn.Module:  # noqa: ANN001
    return tiny_model(seed=0, **SEARCH_MODEL)


# --------------------------------------------------------------------------- scripted model

# Greedy takes A (0.6) and then EOS (0.4): p = 0.24. Beam 2 also keeps B, and B EOS has
# p = 0.4 * 0.9 = 0.36, the best hypothesis.
GARDEN_PATH = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS: 0.4, C: 0.35, B: 0.25},
    (B,): {EOS: 0.9, A: 0.1},
}

# [B] has p = 0.4 * 0.85 = 0.34, [A, B] has p = 0.6 * 0.9 * 0.6 = 0.324: raw log-prob prefers
# the short one, any length normalisation prefers [A, B].
SHORT_OR_LONG = {
    (): {A: 0.6, B: 0.4},
    (B,): {EOS: 0.85, C: 0.1, A: 0.05},
    (A,): {B: 0.9, C: 0.1},
    (A, B): {EOS: 0.6, C: 0.4},
    (A, C): {EOS: 1.0},
}


def test_beam_finds_what_greedy_misses() -> None:
    model = ScriptedModel(V, GARDEN_PATH)
    greedy = greedy_search(model, source(A), SPECIAL, SearchConfig(length_penalty=0.0))
    assert greedy.best_tokens() == [[A]]
    assert greedy.hypotheses[0][0].log_prob == pytest.approx(math.log(0.24), abs=1e-5)

    cfg = SearchConfig(beam_size=2, length_penalty=0.0, nbest=2)
    beam = beam_search(model, source(A), SPECIAL, cfg)
    ((best, second),) = beam.hypotheses
    assert (best.tokens, second.tokens) == ([B], [A])
    assert best.score == pytest.approx(math.log(0.36), abs=1e-5)
    assert second.score == pytest.approx(math.log(0.24), abs=1e-5)


@pytest.mark.parametrize(
    ("alpha", "lp_type", "winner"),
    [(0.0, "fairseq", [B]), (1.0, "fairseq", [A, B]), (1.0, "gnmt", [A, B])],
)
def test_length_penalty_changes_the_winner(alpha: float, lp_type: str, winner: list[int]) -> None:
    model = ScriptedModel(V, SHORT_OR_LONG)
    cfg = SearchConfig(beam_size=2, length_penalty=alpha, nbest=2, lp_type=lp_type)
    result = beam_search(model, source(A), SPECIAL, cfg)
    hyps = {tuple(h.tokens): h for h in result.hypotheses[0]}
    assert set(hyps) == {(B,), (A, B)}
    assert result.hypotheses[0][0].tokens == winner
    long_lp = math.log(0.6 * 0.9 * 0.6)  # three tokens, EOS included
    assert hyps[(A, B)].log_prob == pytest.approx(long_lp, abs=1e-5)
    assert hyps[(A, B)].score == pytest.approx(
        long_lp / length_penalty_divisor(3, alpha, lp_type), abs=1e-5
    )
    assert hyps[(B,)].score == pytest.approx(
        math.log(0.4 * 0.85) / length_penalty_divisor(2, alpha, lp_type), abs=1e-5
    )


# A model that would rather say nothing: EOS first has p = 0.9.
EOS_FIRST = {(): {EOS: 0.9, A: 0.06, B: 0.04}, (A,): {EOS: 0.7, C: 0.3}, (B,): {EOS: 0.99}}


@pytest.mark.parametrize("beam_size", [1, 3])
def test_eos_is_never_the_first_token(beam_size: int) -> None:
    """Minimum length 1 (fairseq's min_len): EOS is masked at step 0, not renormalised away."""
    model = ScriptedModel(V, EOS_FIRST)
    search = greedy_search if beam_size == 1 else beam_search
    cfg = SearchConfig(beam_size=beam_size, nbest=beam_size, length_penalty=0.0)
    (nbest,) = search(model, source(A), SPECIAL, cfg).hypotheses
    assert all(len(h.tokens) >= 1 for h in nbest)
    assert nbest[0].tokens == [A]  # p = 0.06 * 0.7 = 0.042 beats [B]: 0.04 * 0.99
    assert nbest[0].log_prob == pytest.approx(math.log(0.06 * 0.7), abs=1e-5)
    if beam_size > 1:
        assert [h.tokens for h in nbest[:2]] == [[A], [B]]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_zero_length_budget_still_ends_at_once(beam_size: int) -> None:
    """The length limit wins over the minimum length: budget 0 forces EOS at step 0."""
    model = ScriptedModel(V, EOS_FIRST)
    search = greedy_search if beam_size == 1 else beam_search
    cfg = SearchConfig(beam_size=beam_size, max_len_a=0.0, max_len_b=0)
    (nbest,) = search(model, source(A), SPECIAL, cfg).hypotheses
    assert nbest[0].tokens == []
    assert nbest[0].log_prob == pytest.approx(math.log(0.9), abs=1e-5)


def test_length_penalty_formulas() -> None:
    assert length_penalty_divisor(4, 0.5, "fairseq") == pytest.approx(2.0)
    assert length_penalty_divisor(7, 1.0, "gnmt") == pytest.approx(2.0)
    assert length_penalty_divisor(9, 0.0, "gnmt") == 1.0
    with pytest.raises(ValueError, match="lp_type"):
        length_penalty_divisor(3, 1.0, "nope")  # type: ignore[arg-type]


def test_pad_and_bos_are_never_generated() -> None:
    script = {(): {PAD: 0.5, BOS: 0.3, A: 0.19}, (A,): {PAD: 0.6, BOS: 0.3, EOS: 0.09}}
    model = ScriptedModel(V, script)
    for result in (
        greedy_search(model, source(A), SPECIAL, SearchConfig()),
        beam_search(
            model, source(A), SPECIAL, SearchConfig(beam_size=3, length_penalty=0.0, nbest=3)
        ),
    ):
        assert result.hypotheses[0][0].tokens == [A]
        for hyp in result.hypotheses[0]:
            assert PAD not in hyp.tokens and BOS not in hyp.tokens


@pytest.mark.parametrize("beam_size", [1, 3])
def test_max_len_is_per_sentence_and_eos_is_forced(beam_size: int) -> None:
    """With EOS nearly impossible, every hypothesis is exactly int(a * src_len + b) long."""
    model = ScriptedModel(V, {}, default={EOS: 1e-6})  # EOS never wins until it is forced
    src_ids = torch.cat([source(A, 2), source(B, 9)[:, :3]])  # lengths 2 and 9 -> padded
    src_ids = torch.nn.functional.pad(src_ids, (0, 7), value=PAD)
    src_ids[1] = source(B, 9)[0]
    assert max_lengths(src_ids, SPECIAL, 0.5, 2).tolist() == [3, 6]
    search = greedy_search if beam_size == 1 else beam_search
    cfg = SearchConfig(beam_size=beam_size, nbest=beam_size, max_len_a=0.5, max_len_b=2)
    result = search(model, src_ids, SPECIAL, cfg)
    for nbest, budget in zip(result.hypotheses, [3, 6], strict=True):
        assert {len(h.tokens) for h in nbest} == {budget}
        assert len({tuple(h.tokens) for h in nbest}) == len(nbest) == beam_size
        assert all(EOS not in h.tokens for h in nbest)
    # the short sentence left the batch after its budget: fewer rows, one token per step
    assert model.rows_per_step[-1] < model.rows_per_step[1]
    assert model.offsets == list(range(7))


def test_sentence_stops_after_beam_size_finished() -> None:
    """fairseq's rule: done once it holds K finished hypotheses, even if longer ones are live."""
    model = ScriptedModel(V, GARDEN_PATH)
    beam_search(model, source(A), SPECIAL, SearchConfig(beam_size=2, length_penalty=0.0))
    assert len(model.rows_per_step) == 2  # BOS step, then both beams end in EOS


def test_search_config_validates() -> None:
    assert SearchConfig().beam_size == 5
    with pytest.raises(ValueError, match="nbest"):
        SearchConfig(beam_size=2, nbest=3)
    with pytest.raises(ValueError, match="lp_type"):
        SearchConfig(lp_type="nope")  # type: ignore[arg-type]


# ------------------------------------------------------------------ tiny random Transformer


def assert_same_results(got: list, expected: list) -> None:
    assert [[h.tokens for h in nbest] for nbest in got] == [
        [h.tokens for h in nbest] for nbest in expected
    ]
    got_scores = torch.tensor([[h.score for h in nbest] for nbest in got])
    expected_scores = torch.tensor([[h.score for h in nbest] for nbest in expected])
    torch.testing.assert_close(got_scores, expected_scores, atol=1e-4, rtol=0)


def test_greedy_equals_beam_one(tiny: torch.nn.Module) -> None:
    src_ids = random_sources([5, 9, 2, 7, 12, 3], seed=3)
    greedy = greedy_search(tiny, src_ids, SPECIAL, SearchConfig())
    beam = beam_search(tiny, src_ids, SPECIAL, SearchConfig(beam_size=1))
    assert_same_results(greedy.hypotheses, beam.hypotheses)
    lengths = {len(hyp.tokens) for hyp in (nbest[0] for nbest in greedy.hypotheses)}
    assert len(lengths) > 1, "the test model should not be degenerate"


@pytest.mark.parametrize("beam_size", [1, 4])
def test_batched_equals_one_by_one(tiny: torch.nn.Module, beam_size: int) -> None:
    src_ids = random_sources([2, 25, 6, 14], seed=4)  # very different lengths in one batch
    search = greedy_search if beam_size == 1 else beam_search
    cfg = SearchConfig(beam_size=beam_size, nbest=min(beam_size, 2))
    batched = search(tiny, src_ids, SPECIAL, cfg).hypotheses
    alone = []
    for row in src_ids:
        row = row[: int(row.ne(PAD).sum())].unsqueeze(0)  # (1, own length): no padding
        alone += search(tiny, row, SPECIAL, cfg).hypotheses
    assert_same_results(batched, alone)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_cached_equals_uncached(tiny: torch.nn.Module, beam_size: int) -> None:
    src_ids = random_sources([4, 11, 7], seed=5)
    search = greedy_search if beam_size == 1 else beam_search
    cfg = SearchConfig(beam_size=beam_size, nbest=beam_size)
    cached = search(tiny, src_ids, SPECIAL, cfg).hypotheses
    uncached = search(UncachedModel(tiny), src_ids, SPECIAL, cfg).hypotheses
    assert_same_results(cached, uncached)


def test_nbest_sorted_distinct_and_within_budget(tiny: torch.nn.Module) -> None:
    src_ids = random_sources([3, 8, 15], seed=6)
    budgets = max_lengths(src_ids, SPECIAL, 1.2, 10).tolist()
    result = beam_search(tiny, src_ids, SPECIAL, SearchConfig(beam_size=5, nbest=5))
    for nbest, budget in zip(result.hypotheses, budgets, strict=True):
        assert len(nbest) == 5
        scores = [h.score for h in nbest]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in nbest}) == 5
        for hyp in nbest:
            assert len(hyp.tokens) <= budget
            assert not {PAD, BOS, EOS} & set(hyp.tokens)
            assert hyp.score == pytest.approx(hyp.log_prob / (len(hyp.tokens) + 1), abs=1e-6)


def test_beam_scores_match_teacher_forced_log_probs(tiny: torch.nn.Module) -> None:
    """Each hypothesis's log_prob is the full-pass log-probability of [tokens, EOS]."""
    src_ids = random_sources([6], seed=7)
    for hyp in beam_search(tiny, src_ids, SPECIAL, SearchConfig(beam_size=3, nbest=3)).hypotheses[
        0
    ]:
        tgt_in = torch.tensor([[BOS] + hyp.tokens])
        tgt_out = torch.tensor(hyp.tokens + [EOS])
        lprobs = torch.log_softmax(tiny(src_ids, tgt_in)[0].float(), dim=-1)  # (T, V)
        expected = lprobs.gather(1, tgt_out.unsqueeze(1)).sum().item()
        assert hyp.log_prob == pytest.approx(expected, abs=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu(tiny: torch.nn.Module) -> None:
    src_ids = random_sources([3, 17, 8], seed=8)
    cfg = SearchConfig(beam_size=4, nbest=2)
    cpu = beam_search(tiny, src_ids, SPECIAL, cfg).hypotheses
    gpu_model = copy.deepcopy(tiny).cuda()
    gpu = beam_search(gpu_model, src_ids.cuda(), SPECIAL, cfg).hypotheses
    assert_same_results(gpu, cpu)
    greedy_gpu = greedy_search(gpu_model, src_ids.cuda(), SPECIAL, cfg).hypotheses
    assert_same_results(greedy_gpu, greedy_search(tiny, src_ids, SPECIAL, cfg).hypotheses)


# ----------------------------------------------------------------------- chunked top-k


@pytest.mark.parametrize("k", [1, 2, 10])
@pytest.mark.parametrize("vocab", [8000, 64 * 7, 32 * 9, 1000])  # chunks of 64, 64, 32, none
def test_topk_equals_torch_topk(vocab: int, k: int) -> None:
    """Distinct values: the same values and indices as torch.topk, sorted, with -inf entries
    (masked tokens) and rows whose best values crowd into one chunk."""
    gen = torch.Generator().manual_seed(vocab + k)
    x = torch.randn(33, vocab, generator=gen)
    x[:, :3] = float("-inf")  # pad, bos, eos masked as search does
    x[0, 64:74] += 100.0  # row 0: its whole top 10 inside one chunk
    x[1, -1] = 50.0  # row 1: the best value in the last position
    got_values, got_idx = topk(x, k)
    want_values, want_idx = x.topk(k, dim=-1)
    assert torch.equal(got_values, want_values)
    assert torch.equal(got_idx, want_idx)


def test_topk_with_ties_returns_distinct_positions_of_the_top_values() -> None:
    x = torch.zeros(4, 640)
    x[:, ::7] = 1.0  # 92 tied maxima per row, in many chunks
    x[2] = 3.0  # a constant row
    values, idx = topk(x, 10)
    assert torch.equal(values, x.topk(10, dim=-1).values)
    assert all(len(set(row.tolist())) == 10 for row in idx)  # no position twice
    assert torch.equal(x.gather(1, idx), values)
