"""Collate (padding, target shift) and the token-budget sampler (budget, sharding, seeding)."""

from __future__ import annotations

from collections import Counter

import datasets
import numpy as np
import pytest
import torch

from attnmt.data.batching import (
    Batch,
    BatchIterator,
    TokenBatchSampler,
    collate,
    encode_source_batch,
    length_ladder,
    pad_rows,
    token_lengths,
)
from attnmt.data.errors import DataError
from attnmt.data.tokenizer import SpecialIds

SPECIAL = SpecialIds()
ODD_SPECIAL = SpecialIds(pad=3, unk=2, bos=0, eos=1)


@pytest.fixture(scope="module")
def lengths() -> tuple[np.ndarray, np.ndarray]:
    """Skewed lengths like a real corpus, plus two examples longer than the budget."""
    rng = np.random.default_rng(0)
    src = rng.integers(1, 60, size=997)
    tgt = np.clip(src + rng.integers(-5, 6, size=997), 0, None)
    src[10], tgt[500] = 300, 260
    return src, tgt


def epoch_batches(sampler: TokenBatchSampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


def cost(batch: list[int], src: np.ndarray, tgt: np.ndarray) -> int:
    """B * max(S, T) with S, T counting the eos/bos each row gets."""
    return len(batch) * max(int(src[batch].max()) + 1, int(tgt[batch].max()) + 1)


# --- collate ----------------------------------------------------------------------------------


@pytest.mark.parametrize("special", [SPECIAL, ODD_SPECIAL])
def test_collate_pads_and_shifts_the_target(special: SpecialIds) -> None:
    pad, bos, eos = special.pad, special.bos, special.eos
    batch = collate([[7, 8, 9], [10]], [[11, 12], [13, 14, 15, 16]], special, indices=[5, 2])
    assert batch.src_ids.tolist() == [[7, 8, 9, eos], [10, eos, pad, pad]]
    assert batch.tgt_in.tolist() == [[bos, 11, 12, pad, pad], [bos, 13, 14, 15, 16]]
    assert batch.tgt_out.tolist() == [[11, 12, eos, pad, pad], [13, 14, 15, 16, eos]]
    assert batch.src_mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (6, 8)
    assert batch.indices == [5, 2] and len(batch) == 2
    assert batch.src_ids.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    # Teacher forcing: the decoder input is the output shifted right by one.
    assert torch.equal(batch.tgt_in[:, 1:3], batch.tgt_out[:, :2])


def test_collate_handles_empty_sequences_and_default_indices() -> None:
    batch = collate([[], [4]], [[], []], SPECIAL)
    assert batch.src_ids.tolist() == [[SPECIAL.eos, SPECIAL.pad], [4, SPECIAL.eos]]
    assert batch.tgt_in.tolist() == [[SPECIAL.bos], [SPECIAL.bos]]
    assert batch.tgt_out.tolist() == [[SPECIAL.eos], [SPECIAL.eos]]
    assert batch.indices == [0, 1]


def test_encode_source_batch_matches_collate() -> None:
    src = [[5, 6], [7, 8, 9, 10]]
    for special in (SPECIAL, ODD_SPECIAL):
        expected = collate(src, [[1], [1]], special).src_ids
        assert torch.equal(encode_source_batch(src, special), expected)


def test_pad_rows_adds_prefix_and_suffix_then_pads() -> None:
    rows = [[5, 6], [], [7, 8, 9]]
    assert pad_rows(rows, 0).tolist() == [[5, 6, 0], [0, 0, 0], [7, 8, 9]]
    got = pad_rows(rows, 0, prefix=[2], suffix=[3])  # (B, 1 + 3 + 1)
    assert got.tolist() == [[2, 5, 6, 3, 0], [2, 3, 0, 0, 0], [2, 7, 8, 9, 3]]
    assert got.dtype == torch.long and pad_rows([], 0, prefix=[2]).shape == (0, 1)


def test_batch_to_device_keeps_everything() -> None:
    batch = collate([[5, 6]], [[7]], ODD_SPECIAL, indices=[3])
    moved = batch.to("cpu", non_blocking=True)
    assert isinstance(moved, Batch) and moved.indices == [3] and moved.pad_id == ODD_SPECIAL.pad
    assert torch.equal(moved.src_mask, batch.src_mask)


# --- the sampler ------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [64, 256, 1000])
def test_token_budget_is_never_exceeded(lengths: tuple, max_tokens: int) -> None:
    src, tgt = lengths
    sampler = TokenBatchSampler(src, tgt, max_tokens, seed=1)
    batches = list(sampler)
    for batch in batches:
        # Only a single example longer than the budget may exceed it, alone in its batch.
        assert cost(batch, src, tgt) <= max_tokens or len(batch) == 1
    assert sorted(i for b in batches for i in b) == list(range(len(src)))
    too_long = {i for i in range(len(src)) if max(src[i], tgt[i]) + 1 > max_tokens}
    assert all([i] in batches for i in too_long)


def test_collated_batches_respect_the_budget(lengths: tuple) -> None:
    src, tgt = lengths
    rows = {"src_ids": [[4] * n for n in src], "tgt_ids": [[5] * n for n in tgt]}
    ds = datasets.Dataset.from_dict({**rows, "src_len": src, "tgt_len": tgt})
    sampler = TokenBatchSampler(*token_lengths(ds), 512)
    for batch in BatchIterator(ds, SPECIAL, sampler):
        padded = len(batch) * max(batch.src_ids.size(1), batch.tgt_in.size(1))
        assert padded <= 512 or len(batch) == 1
        assert batch.n_tgt_tokens == int((batch.tgt_out != SPECIAL.pad).sum())


def test_padding_stats_report_waste(lengths: tuple) -> None:
    src, tgt = lengths
    stats = TokenBatchSampler(src, tgt, 512).padding_stats()
    assert stats["tokens"] == int(src.sum() + tgt.sum()) + 2 * len(src)
    assert stats["padded"] >= stats["tokens"]
    assert stats["waste"] == pytest.approx(1 - stats["tokens"] / stats["padded"])
    # Length bucketing keeps padding low; random batches of this corpus waste far more.
    assert 0 <= stats["waste"] < 0.2


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_ranks_get_equal_batches_and_cover_every_pair_once(lengths: tuple, world_size: int) -> None:
    src, tgt = lengths
    n_single = len(epoch_batches(TokenBatchSampler(src, tgt, 320, seed=4), 3))
    assert n_single % world_size != 0  # so that the split-to-divisible path runs
    seen: Counter[int] = Counter()
    per_rank = []
    for rank in range(world_size):
        sampler = TokenBatchSampler(src, tgt, 320, seed=4, rank=rank, world_size=world_size)
        batches = epoch_batches(sampler, 3)
        assert len(batches) == len(sampler)
        per_rank.append(len(batches))
        seen.update(i for batch in batches for i in batch)
        assert all(cost(b, src, tgt) <= 320 or len(b) == 1 for b in batches)
    assert len(set(per_rank)) == 1
    assert per_rank[0] * world_size == n_single + (-n_single % world_size)
    assert seen == Counter(range(len(src)))  # no pair lost, none duplicated


def test_tiny_split_is_split_down_to_world_size() -> None:
    shards = [
        list(TokenBatchSampler([3, 3, 3], [3, 3, 3], 1000, rank=r, world_size=3)) for r in range(3)
    ]
    assert sorted(i for shard in shards for batch in shard for i in batch) == [0, 1, 2]
    assert [len(shard) for shard in shards] == [1, 1, 1]


def test_too_few_pairs_for_the_ranks_is_a_data_error() -> None:
    with pytest.raises(DataError, match="2 ranks"):
        len(TokenBatchSampler([4], [4], 100, world_size=2))


def test_same_seed_and_epoch_give_the_same_batches(lengths: tuple) -> None:
    src, tgt = lengths
    a = TokenBatchSampler(src, tgt, 256, seed=7)
    b = TokenBatchSampler(src, tgt, 256, seed=7)
    first = epoch_batches(a, 0)
    assert epoch_batches(b, 0) == first
    second = epoch_batches(a, 1)
    assert second != first
    assert sorted(map(sorted, second)) != sorted(map(sorted, first))  # not just reordered
    assert epoch_batches(a, 0) == first  # going back reproduces the epoch
    assert epoch_batches(TokenBatchSampler(src, tgt, 256, seed=8), 0) != first


def test_no_shuffle_is_fixed_and_length_sorted(lengths: tuple) -> None:
    src, tgt = lengths
    sampler = TokenBatchSampler(src, tgt, 256, shuffle=False)
    first = epoch_batches(sampler, 0)
    assert epoch_batches(sampler, 5) == first
    flat = [i for batch in first for i in batch]
    assert list(src[flat]) == sorted(src)


def test_batch_iterator_reads_rows_per_batch_on_each_rank() -> None:
    src_ids = [[10 + i] * (1 + i % 7) for i in range(40)]
    tgt_ids = [[100 + i] * (1 + i % 5) for i in range(40)]
    ds = datasets.Dataset.from_dict(
        {
            "src": [str(i) for i in range(40)],
            "tgt": [str(i) for i in range(40)],
            "src_ids": src_ids,
            "tgt_ids": tgt_ids,
            "src_len": [len(s) for s in src_ids],
            "tgt_len": [len(t) for t in tgt_ids],
        }
    )
    seen = []
    for rank in range(2):
        sampler = TokenBatchSampler(ds["src_len"], ds["tgt_len"], 24, rank=rank, world_size=2)
        iterator = BatchIterator(ds, ODD_SPECIAL, sampler)
        batches = list(iterator)
        assert len(batches) == len(iterator) == len(sampler)
        for batch in batches:
            for row, index in enumerate(batch.indices):
                n = len(src_ids[index])
                assert batch.src_ids[row, :n].tolist() == src_ids[index]
                assert batch.src_ids[row, n] == ODD_SPECIAL.eos
                assert batch.tgt_out[row, : len(tgt_ids[index])].tolist() == tgt_ids[index]
            seen.extend(batch.indices)
    assert sorted(seen) == list(range(40))


# --- length buckets (bucket_growth) -----------------------------------------------------------


def test_length_ladder_grows_by_the_ratio_and_covers_the_longest() -> None:
    assert length_ladder(1.1, 20).tolist() == [8, 9, 10, 11, 13, 15, 17, 19, 21]
    assert length_ladder(1.5, 8).tolist() == [8]
    assert length_ladder(2.0, 70).tolist() == [8, 16, 32, 64, 128]


@pytest.mark.parametrize("world_size", [1, 3])
def test_buckets_give_few_shapes_within_the_budget_and_every_pair_once(
    lengths: tuple, world_size: int
) -> None:
    src, tgt = lengths
    rows = {"src_ids": [[4] * n for n in src], "tgt_ids": [[5] * n for n in tgt]}
    ds = datasets.Dataset.from_dict({**rows, "src_len": src, "tgt_len": tgt})
    exact = TokenBatchSampler(src, tgt, 1024, seed=3).padding_stats()
    seen, shapes = [], set()
    for rank in range(world_size):
        sampler = TokenBatchSampler(
            src, tgt, 1024, seed=3, bucket_growth=1.1, rank=rank, world_size=world_size
        )
        ladder = set(sampler.ladder.tolist())
        for batch in BatchIterator(ds, SPECIAL, sampler):
            B, S, T = len(batch), batch.src_ids.size(1), batch.tgt_in.size(1)
            shapes.add((B, S, T))
            assert S in ladder and T in ladder  # each side padded to a rung
            assert B * max(S, T) <= 1024 or B == 1  # the budget counts the padding
            assert batch.n_tgt_tokens == int((batch.tgt_out != SPECIAL.pad).sum())
            seen += batch.indices
    assert sorted(seen) == list(range(len(src)))  # every pair once, over all ranks
    bucketed = TokenBatchSampler(src, tgt, 1024, seed=3, bucket_growth=1.1).padding_stats()
    if world_size == 1:  # padding_stats counts the shapes the batches have
        assert bucketed["shapes"] == len(shapes)
    # Before: about a shape per batch; after: a few per rung, for a little more padding.
    assert exact["shapes"] > 2 * bucketed["shapes"]
    assert bucketed["waste"] < exact["waste"] + 0.15


def test_bucket_rows_are_a_multiple_of_8_but_for_one_tail_batch(lengths: tuple) -> None:
    src, tgt = lengths
    sampler = TokenBatchSampler(src, tgt, 2048, seed=0, bucket_growth=1.2)
    sizes = [len(b) for b in sampler]
    small = [n for n in sizes if n % 8 and n >= 8]
    too_long = int((np.maximum(src, tgt) + 1 > 2048 // 8).sum())  # rows < 8 at these rungs
    assert len(small) <= 1 + too_long, sizes


def test_bucket_growth_must_be_above_one() -> None:
    with pytest.raises(ValueError, match="bucket_growth"):
        TokenBatchSampler([3], [3], 100, bucket_growth=0.9)


def test_a_wider_padding_changes_no_loss_or_gradient(tmp_path) -> None:
    """Padding a batch to a rung's widths is invisible to the model: the same loss and
    gradients (dropout off), so buckets change shapes, not what is learned."""
    from attnmt.training.kernels import label_smoothed_cross_entropy
    from tests.train_helpers import toy

    run = toy(tmp_path, "model.dropout=0.0")
    rows = run.data.train[list(range(6))]
    special, model = run.data.tokenizer.special, run.trainee.model.train()
    results = []
    for widths in [(0, 0), (40, 33)]:
        batch = collate(rows["src_ids"], rows["tgt_ids"], special, widths=widths)
        model.zero_grad()
        out = label_smoothed_cross_entropy(
            model(batch.src_ids, batch.tgt_in), batch.tgt_out, special.pad, 0.1
        )
        out.loss.backward()
        results.append((out.loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert rows and max(map(len, rows["src_ids"])) + 1 < 40
    (loss, grads), (wide_loss, wide_grads) = results
    torch.testing.assert_close(wide_loss, loss, rtol=1e-5, atol=1e-5)
    for grad, wide in zip(grads, wide_grads, strict=True):
        torch.testing.assert_close(wide, grad, rtol=1e-4, atol=1e-6)
