"""Masks, masked softmax, the attention scoring functions (examples/attention_scoring.py),
multi-head attention, and the two behaviours every Transformer must have: the decoder is
causal, and source padding is invisible.

Legend: B batch, T query len, S key len, H heads, Dh head dim. Masks: True = may attend.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from attnmt.model import MultiHeadAttention, causal_mask, masked_softmax


def _load_example(name: str):
    """examples/NAME.py as a module (examples/ is teaching code, not a package)."""
    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"examples_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scoring = _load_example("attention_scoring")
AdditiveAttention = scoring.AdditiveAttention
DotProductAttention = scoring.DotProductAttention
lengths_to_mask = scoring.lengths_to_mask
masked_softmax_lengths = scoring.masked_softmax_lengths

PAD = 0
VOCAB = 40


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def random_ids(*shape: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, shape)  # never the pad id


# ------------------------------------------------------------------------ masked softmax


def test_masked_softmax_per_row_lengths_d2l_example() -> None:
    scores = torch.rand(2, 2, 4)
    weights = masked_softmax_lengths(scores, torch.tensor([2, 3]))
    assert torch.all(weights[0, :, 2:] == 0)  # row 0: keys 2, 3 masked, exactly 0
    assert torch.all(weights[1, :, 3:] == 0)  # row 1: key 3 masked
    assert torch.all(weights[0, :, :2] > 0) and torch.all(weights[1, :, :3] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2), atol=1e-6, rtol=0.0)
    # The valid part is the plain softmax over the valid keys only.
    torch.testing.assert_close(weights[0, :, :2], scores[0, :, :2].softmax(-1), atol=1e-6, rtol=0.0)
    torch.testing.assert_close(weights[1, :, :3], scores[1, :, :3].softmax(-1), atol=1e-6, rtol=0.0)


def test_masked_softmax_per_query_lengths_d2l_example() -> None:
    scores = torch.rand(2, 2, 4)
    lens = torch.tensor([[1, 3], [2, 4]])
    weights = masked_softmax_lengths(scores, lens)
    for b in range(2):
        for t in range(2):
            n = lens[b, t].item()
            assert torch.all(weights[b, t, n:] == 0), (b, t)
            torch.testing.assert_close(
                weights[b, t, :n], scores[b, t, :n].softmax(-1), atol=1e-6, rtol=0.0
            )
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2), atol=1e-6, rtol=0.0)


def test_masked_softmax_boolean_mask_with_holes() -> None:
    scores = torch.randn(2, 3, 5)
    mask = torch.tensor([[True, False, True, False, True], [False, True, True, True, False]])
    weights = masked_softmax(scores, mask=mask[:, None, :])  # (B, 1, S) broadcasts over queries
    assert torch.all(weights.masked_select(~mask[:, None, :].expand_as(weights)) == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3), atol=1e-6, rtol=0.0)
    for b in range(2):
        keep = mask[b].nonzero().squeeze(1)
        torch.testing.assert_close(
            weights[b][:, keep], scores[b][:, keep].softmax(-1), atol=1e-6, rtol=0.0
        )


def test_masked_softmax_without_mask_is_softmax() -> None:
    scores = torch.randn(2, 3, 4)
    torch.testing.assert_close(masked_softmax(scores), scores.softmax(-1), atol=0.0, rtol=0.0)


def test_masked_softmax_row_without_valid_key_is_zero_not_nan() -> None:
    scores = torch.randn(3, 2, 4, requires_grad=True)
    weights = masked_softmax_lengths(scores, torch.tensor([0, 2, 4]))
    assert not torch.isnan(weights).any()
    assert torch.all(weights[0] == 0)
    torch.testing.assert_close(weights[1:].sum(-1), torch.ones(2, 2), atol=1e-6, rtol=0.0)
    # The backward pass through the empty row must not poison the gradient either.
    (weights * torch.randn_like(weights)).sum().backward()
    assert torch.isfinite(scores.grad).all()


@pytest.mark.parametrize("per_query", [False, True])
def test_masked_softmax_4d_scores_broadcast_over_heads(per_query: bool) -> None:
    B, H, T, S = 2, 3, 4, 5
    scores = torch.randn(B, H, T, S)
    lens = torch.tensor([[1, 2, 3, 5], [5, 4, 3, 2]]) if per_query else torch.tensor([2, 5])
    weights = masked_softmax_lengths(scores, lens)  # (B, H, T, S)
    assert weights.shape == (B, H, T, S)
    n_keys = lens if per_query else lens[:, None].expand(B, T)
    for b in range(B):
        for t in range(T):
            n = n_keys[b, t].item()
            assert torch.all(weights[b, :, t, n:] == 0), (b, t)
            torch.testing.assert_close(
                weights[b, :, t, :n], scores[b, :, t, :n].softmax(-1), atol=1e-6, rtol=0.0
            )


def test_lengths_to_mask_shapes() -> None:
    assert lengths_to_mask(torch.tensor([1, 3]), 4).tolist() == [
        [[True, False, False, False]],
        [[True, True, True, False]],
    ]
    assert lengths_to_mask(torch.tensor([[1, 2, 3]]), 3).shape == (1, 3, 3)


# ---------------------------------------------------------------------------- causal mask


@pytest.mark.parametrize("n", [1, 2, 5])
def test_causal_mask_is_tril_when_square(n: int) -> None:
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    assert torch.equal(causal_mask(n), tril)
    assert torch.equal(causal_mask(n, n), tril)


def test_causal_mask_is_right_aligned_for_cached_steps() -> None:
    # Two new queries at positions 3 and 4 over 5 keys (3 cached + 2 new).
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(2, 5), expected)
    for T, S in [(1, 4), (3, 7), (4, 4)]:
        # The last T rows of the full square mask: query i sees keys j <= i + (S - T).
        assert torch.equal(causal_mask(T, S), torch.ones(S, S, dtype=torch.bool).tril()[S - T :])
    assert causal_mask(1, 6).all()  # one new token sees the whole cache


# ------------------------------------------------------------- single-head scoring functions


def additive_reference(module: AdditiveAttention, q, k, v, valid_lens) -> torch.Tensor:
    """Bahdanau scores by explicit loops in float64: w_v . tanh(W_q q + W_k k)."""
    W_q, W_k = module.W_q.weight.double(), module.W_k.weight.double()
    w_v = module.w_v.weight.double()[0]
    q, k, v = q.double(), k.double(), v.double()
    B, T = q.size(0), q.size(1)
    out = torch.zeros(B, T, v.size(-1), dtype=torch.float64)
    for b in range(B):
        n = int(valid_lens[b])
        for t in range(T):
            scores = torch.stack(
                [w_v @ torch.tanh(W_q @ q[b, t] + W_k @ k[b, s]) for s in range(n)]
            )
            out[b, t] = scores.softmax(0) @ v[b, :n]
    return out


def dot_reference(q, k, v, valid_lens) -> torch.Tensor:
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(q.size(0), q.size(1), v.size(-1), dtype=torch.float64)
    for b in range(q.size(0)):
        n = int(valid_lens[b])
        for t in range(q.size(1)):
            scores = k[b, :n] @ q[b, t] / math.sqrt(q.size(-1))
            out[b, t] = scores.softmax(0) @ v[b, :n]
    return out


def test_additive_attention_matches_float64_reference_with_different_sizes() -> None:
    attn = AdditiveAttention(key_size=6, query_size=4, n_hidden=8).eval()
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 6), torch.randn(2, 5, 7)
    lens = torch.tensor([2, 5])
    out, weights = attn(q, k, v, valid_lens=lens, need_weights=True)
    assert out.shape == (2, 3, 7) and weights.shape == (2, 3, 5)
    torch.testing.assert_close(
        out.double(), additive_reference(attn, q, k, v, lens), atol=1e-5, rtol=0.0
    )
    assert torch.all(weights[0, :, 2:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3), atol=1e-6, rtol=0.0)


def test_dot_product_attention_matches_float64_reference() -> None:
    attn = DotProductAttention().eval()
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 4)
    lens = torch.tensor([3, 5])
    out, weights = attn(q, k, v, valid_lens=lens, need_weights=True)
    torch.testing.assert_close(out.double(), dot_reference(q, k, v, lens), atol=1e-5, rtol=0.0)
    assert torch.all(weights[0, :, 3:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3), atol=1e-6, rtol=0.0)


@pytest.mark.parametrize("kind", ["additive", "dot"])
def test_identical_keys_give_uniform_weights_over_valid_positions(kind: str) -> None:
    B, T, S, d = 2, 3, 6, 8
    if kind == "additive":
        attn = AdditiveAttention(key_size=d, query_size=5, n_hidden=16).eval()
        q = torch.randn(B, T, 5)
    else:
        attn = DotProductAttention().eval()
        q = torch.randn(B, T, d)
    keys = torch.randn(1, 1, d).expand(B, S, d)  # every key is the same vector
    values = torch.randn(B, S, 4)
    lens = torch.tensor([2, 6])
    out, weights = attn(q, keys, values, valid_lens=lens, need_weights=True)
    for b, n in enumerate(lens.tolist()):
        expected = torch.zeros(T, S)
        expected[:, :n] = 1.0 / n
        torch.testing.assert_close(weights[b], expected, atol=1e-6, rtol=0.0)
        # ... so the output is the mean of the valid values.
        torch.testing.assert_close(out[b], values[b, :n].mean(0).expand(T, -1), atol=1e-5, rtol=0.0)


@pytest.mark.parametrize("kind", ["additive", "dot"])
def test_need_weights_false_returns_none(kind: str) -> None:
    attn = AdditiveAttention(4, 4, 8) if kind == "additive" else DotProductAttention()
    q = torch.randn(1, 2, 4)
    out, weights = attn(q, q, q, valid_lens=torch.tensor([1]))
    assert weights is None and out.shape == (1, 2, 4)


# -------------------------------------------------------------------- multi-head attention

D, H = 16, 2


def mha_reference(
    mha: MultiHeadAttention, query, key_value, key_mask, causal: bool
) -> torch.Tensor:
    """Multi-head attention from `in_proj`/`out_proj` weights, head by head, in float64.

    key_mask: (B, S) bool, True = may attend.
    """
    W, b = mha.in_proj.weight.double(), mha.in_proj.bias.double()
    (W_q, W_k, W_v), (b_q, b_k, b_v) = W.chunk(3), b.chunk(3)
    x, mem = query.double(), key_value.double()
    q, k, v = x @ W_q.T + b_q, mem @ W_k.T + b_k, mem @ W_v.T + b_v  # (B, T|S, D)
    B, T, S, Dh = q.size(0), q.size(1), k.size(1), D // H
    allowed = key_mask[:, None, :].expand(B, T, S).clone()  # (B, T, S)
    if causal:
        allowed &= torch.ones(T, S, dtype=torch.bool).tril(S - T)
    heads = []
    for h in range(H):
        cols = slice(h * Dh, (h + 1) * Dh)
        scores = q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(Dh)  # (B, T, S)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        heads.append(weights @ v[..., cols])  # (B, T, Dh)
    context = torch.cat(heads, dim=-1)  # (B, T, D)
    return context @ mha.out_proj.weight.double().T + mha.out_proj.bias.double()


def make_mha() -> MultiHeadAttention:
    mha = MultiHeadAttention(D, H).eval()
    with torch.no_grad():  # non-zero biases, so a mixed-up bias slice would show
        mha.in_proj.bias.normal_()
        mha.out_proj.bias.normal_()
    return mha


CASES = ["none", "padding", "causal", "padding+causal", "cross+padding"]


def mha_inputs(case: str):
    B, T, S = 2, 5, 7 if case.startswith("cross") else 5
    x = torch.randn(B, T, D)
    key_value = torch.randn(B, S, D) if case.startswith("cross") else None
    key_mask = torch.ones(B, S, dtype=torch.bool)
    if "padding" in case:
        key_mask[0, 3:] = False  # first sentence: 3 real keys
    mask = key_mask[:, None, None, :] if "padding" in case else None  # (B, 1, 1, S)
    return x, key_value, key_mask, mask, "causal" in case


@pytest.mark.parametrize("case", CASES)
def test_mha_fast_path_equals_explicit_path(case: str) -> None:
    mha = make_mha()
    x, key_value, _, mask, causal = mha_inputs(case)
    fast = mha(x, key_value, mask=mask, is_causal=causal, need_weights=False)
    explicit = mha(x, key_value, mask=mask, is_causal=causal, need_weights=True)
    assert fast.weights is None
    assert explicit.weights.shape == (
        2,
        H,
        x.size(1),
        x.size(1) if key_value is None else key_value.size(1),
    )
    torch.testing.assert_close(fast.output, explicit.output, atol=1e-5, rtol=0.0)


@pytest.mark.parametrize("case", CASES)
def test_mha_matches_float64_reference(case: str) -> None:
    mha = make_mha()
    x, key_value, key_mask, mask, causal = mha_inputs(case)
    expected = mha_reference(mha, x, x if key_value is None else key_value, key_mask, causal)
    for need_weights in (False, True):
        out = mha(x, key_value, mask=mask, is_causal=causal, need_weights=need_weights).output
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0.0)


@pytest.mark.parametrize("case", CASES)
def test_mha_bf16_autocast_on_cpu_matches_float64_reference(case: str) -> None:
    """Under bf16 autocast on the CPU, attention takes the explicit path (bf16 matmuls, fp32
    softmax) in training too: same function, bf16 accuracy, and it returns no weights unless
    asked. Relative error ||out - ref|| / ||ref|| of bf16 operands: well under 2e-2."""
    mha = make_mha().train()  # training mode: the path the trainer runs (attn dropout is 0)
    x, key_value, key_mask, mask, causal = mha_inputs(case)
    expected = mha_reference(mha, x, x if key_value is None else key_value, key_mask, causal)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x, key_value, mask=mask, is_causal=causal)
    assert out.weights is None and out.output.dtype == torch.bfloat16
    error = (out.output.double() - expected).norm() / expected.norm()
    assert error < 2e-2, error
    out.output.float().sum().backward()  # and it trains
    assert torch.isfinite(mha.in_proj.weight.grad).all()


def test_mha_bf16_explicit_path_drops_attention_weights_in_training_only() -> None:
    """The explicit path (bf16 on the CPU) applies the module's dropout to the weights: at
    p = 1 every weight is dropped and only `out_proj`'s bias is left; in eval, nothing is."""
    mha = MultiHeadAttention(D, H, dropout=1.0)
    x, _, _, _, _ = mha_inputs("none")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dropped = mha.train()(x).output
        kept = mha.eval()(x).output
    bias = mha.out_proj.bias.to(torch.bfloat16).expand_as(dropped)
    torch.testing.assert_close(dropped, bias, atol=0.0, rtol=0.0)
    assert not torch.equal(kept, bias)


@pytest.mark.parametrize("case", CASES)
def test_mha_weights_rows_sum_to_one_and_masked_keys_get_zero(case: str) -> None:
    mha = make_mha()
    x, key_value, key_mask, mask, causal = mha_inputs(case)
    weights = mha(
        x, key_value, mask=mask, is_causal=causal, need_weights=True
    ).weights  # (B, H, T, S)
    B, _, T, S = weights.shape
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T), atol=1e-6, rtol=0.0)
    allowed = key_mask[:, None, None, :].expand(B, H, T, S)
    if causal:
        allowed = allowed & torch.ones(T, S, dtype=torch.bool).tril()
    assert torch.all(weights.masked_select(~allowed) == 0)
    assert torch.all(weights.masked_select(allowed) > 0)


def test_mha_projections_are_slices_of_in_proj() -> None:
    mha = make_mha()
    x = torch.randn(2, 4, D)
    q, k, v = mha.project_qkv(x)  # (B, H, T, Dh) each
    assert q.shape == (2, H, 4, D // H)
    torch.testing.assert_close(mha.project_q(x), q, atol=1e-6, rtol=0.0)
    k2, v2 = mha.project_kv(x)
    torch.testing.assert_close(k2, k, atol=1e-6, rtol=0.0)
    torch.testing.assert_close(v2, v, atol=1e-6, rtol=0.0)


# ------------------------------------------------------------- the model is causal


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_is_causal(norm_first: bool, tiny_model) -> None:
    model = tiny_model(norm_first=norm_first)
    src, tgt = random_ids(2, 7), random_ids(2, 9)
    logits = model(src, tgt)  # (B, T, V)
    for t in (0, 3, 7):
        changed = tgt.clone()
        changed[:, t + 1 :] = random_ids(2, 8 - t)  # rewrite the future only
        assert not torch.equal(changed[:, t + 1 :], tgt[:, t + 1 :])
        new = model(src, changed)
        torch.testing.assert_close(new[:, : t + 1], logits[:, : t + 1], atol=1e-5, rtol=0.0)
        assert not torch.allclose(
            new[:, t + 1 :], logits[:, t + 1 :], atol=1e-3
        )  # the test can fail


def test_attention_maps_show_no_weight_on_future_tokens(tiny_model) -> None:
    model = tiny_model()
    maps = model.attention_maps(random_ids(2, 6), random_ids(2, 5))
    future = ~torch.ones(5, 5, dtype=torch.bool).tril()
    for weights in maps.decoder_self:  # (B, H, T, T)
        assert torch.all(weights[..., future] == 0)


# ------------------------------------------------------------- padding is invisible


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_extra_source_padding_changes_nothing(norm_first: bool, tiny_model) -> None:
    model = tiny_model(norm_first=norm_first)
    src, tgt = random_ids(2, 6), random_ids(2, 5)
    logits = model(src, tgt)
    padded = torch.cat([src, torch.full((2, 4), PAD)], dim=1)  # (B, S + 4)
    torch.testing.assert_close(model(padded, tgt), logits, atol=1e-5, rtol=0.0)
    # The same extra tokens, unmasked, do change the output: the mask is doing the work.
    not_pad = torch.cat([src, random_ids(2, 4)], dim=1)
    assert not torch.allclose(model(not_pad, tgt), logits, atol=1e-3)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_short_sentence_in_a_batch_equals_it_alone(norm_first: bool, tiny_model) -> None:
    model = tiny_model(norm_first=norm_first)
    short_src, short_tgt = random_ids(1, 3), random_ids(1, 4)
    long_src, long_tgt = random_ids(1, 9), random_ids(1, 8)
    src = torch.cat([torch.cat([short_src, torch.full((1, 6), PAD)], 1), long_src])  # (2, 9)
    tgt = torch.cat([torch.cat([short_tgt, torch.full((1, 4), PAD)], 1), long_tgt])  # (2, 8)
    batched = model(src, tgt)
    torch.testing.assert_close(batched[:1, :4], model(short_src, short_tgt), atol=1e-5, rtol=0.0)
    torch.testing.assert_close(batched[1:], model(long_src, long_tgt), atol=1e-5, rtol=0.0)
