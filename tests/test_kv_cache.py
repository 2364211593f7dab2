"""The KV caches' row moves (the model's `KVCache`, and the engine's `StepKVCache`, which moves
the source-mask bias too) and cross-attention keys/values shared by a sentence's beams, in the
model and in the engine's one-token step.

Legend: B sentences, K beams, N = B * K rows, S src len, T tgt len, H heads, Dh head dim.
"""

from __future__ import annotations

import pytest
import torch

from attnmt.engine import Engine
from attnmt.engine.cache import StepKVCache
from attnmt.model import KVCache, padding_mask
from tests.test_transformer import PAD, padded_source, random_ids


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_reorder_beams_moves_self_attention_only_and_reorder_moves_sentences() -> None:
    self_k, cross_k = torch.randn(4, 2, 3, 5), torch.randn(2, 2, 6, 5)
    cache = KVCache(self_k, self_k.clone(), cross_k, cross_k.clone())
    cache.reorder_beams(torch.tensor([1, 1, 3, 2]))  # beams re-ranked within 2 sentences
    torch.testing.assert_close(cache.self_k, self_k[[1, 1, 3, 2]], atol=0.0, rtol=0.0)
    assert cache.cross_k is cross_k  # shared by the beams, untouched
    cache.reorder(torch.tensor([2, 3]), sentences=torch.tensor([1]))  # sentence 0 pruned
    torch.testing.assert_close(cache.self_k, self_k[[3, 2]], atol=0.0, rtol=0.0)
    torch.testing.assert_close(cache.cross_k, cross_k[[1]], atol=0.0, rtol=0.0)


def test_reorder_moves_the_source_mask_bias_with_the_sentences() -> None:
    tensors = [torch.randn(3, 2, 4, 5) for _ in range(4)]
    cache = StepKVCache()
    cache.self_k, cache.self_v, cache.cross_k, cache.cross_v = tensors
    tensors.append(torch.randn(3, 2, 1, 5))
    cache.cross_bias = tensors[-1]  # the source-mask bias that the engine's step keeps
    index = torch.tensor([1, 1, 0])
    cache.reorder(index)
    names = ("self_k", "self_v", "cross_k", "cross_v", "cross_bias")
    for name, before in zip(names, tensors, strict=True):
        torch.testing.assert_close(getattr(cache, name), before[index], atol=0.0, rtol=0.0)
    empty = StepKVCache()
    empty.reorder(index)  # nothing cached yet: a no-op, not an error
    assert empty.self_k is None


@pytest.mark.parametrize("use_engine", [False, True], ids=["model", "engine-step"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_beams_sharing_cross_kv_equal_replicated_memory(
    norm_first: bool, use_engine: bool, tiny_model
) -> None:
    """K rows per sentence against its one memory row == the memory copied K times."""
    model = tiny_model(norm_first=norm_first).eval()
    engine = Engine(model)
    src, K = padded_source(), 3
    src_mask = padding_mask(src, PAD)
    tgt = random_ids(3 * K, 6)  # (N, T): rows 3b .. 3b + 2 belong to sentence b
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # (B, S, D)
        copied, copied_mask = memory.repeat_interleave(K, 0), src_mask.repeat_interleave(K, 0)
        full = model.decode(tgt, copied, copied_mask)  # (N, T, V), one memory row per row
        shared_full = model.decode(tgt, memory, src_mask)  # teacher-forced, shared
        torch.testing.assert_close(shared_full, full, atol=1e-5, rtol=0.0)
        caches = [StepKVCache() for _ in model.decoder.layers] if use_engine else model.new_caches()
        decode = engine.step if use_engine else model.decode
        for i in range(tgt.size(1)):
            step = decode(tgt[:, i : i + 1], memory, src_mask, caches, i)
            torch.testing.assert_close(step[:, 0], full[:, i], atol=1e-5, rtol=0.0)
        assert caches[0].cross_k.size(0) == 3 and caches[0].self_k.size(0) == 3 * K
        with pytest.raises(ValueError, match="split evenly"):
            model.decode(tgt[:4, :1], memory, src_mask)
