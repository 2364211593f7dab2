"""The whole encoder-decoder: KV-cached decoding, parameter counts, learning, attention maps,
config validation, dropout.

Legend: B batch, S src len, T tgt len, V vocab.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnmt.model import (
    DecoderLayer,
    EncoderLayer,
    KVCache,
    ModelConfig,
    Transformer,
    padding_mask,
)

PAD = 0
VOCAB = 40


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def random_ids(*shape: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, shape)  # never the pad id


def padded_source() -> torch.Tensor:
    """(3, 7) source ids; the rows have 7, 4 and 2 real tokens, so the masks matter."""
    src = random_ids(3, 7)
    src[1, 4:] = PAD
    src[2, 2:] = PAD
    return src


# ------------------------------------------------------------------- cached decoding

NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])


@NORMS
def test_cached_decoding_equals_full_pass(norm_first: bool, tiny_model) -> None:
    model = tiny_model(norm_first=norm_first)
    src, tgt = padded_source(), random_ids(3, 8)
    src_mask = padding_mask(src, PAD)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)  # (B, T, V) teacher-forced
        caches = model.new_caches()
        for i in range(tgt.size(1)):
            step = model.decode(tgt[:, i : i + 1], memory, src_mask, caches, offset=i)  # (B, 1, V)
            torch.testing.assert_close(step[:, 0], full[:, i], atol=1e-5, rtol=0.0)
    assert caches[0].self_k.shape == (3, 2, 8, 16)  # (B, H, t, Dh): grew one step at a time
    assert caches[0].cross_k.shape == (3, 2, 7, 16)  # (B, H, S, Dh): computed once
    torch.testing.assert_close(model(src, tgt), full, atol=1e-6, rtol=0.0)


@NORMS
def test_cached_decoding_after_beam_reorder(norm_first: bool, tiny_model) -> None:
    model = tiny_model(norm_first=norm_first)
    src, tgt = padded_source(), random_ids(3, 4)
    src_mask = padding_mask(src, PAD)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        caches = model.new_caches()
        for i in range(tgt.size(1)):
            model.decode(tgt[:, i : i + 1], memory, src_mask, caches, offset=i)

        # Beams re-ranked: a permutation with a duplicate (row 0 dropped, row 2 twice).
        index = torch.tensor([2, 1, 2, 0])
        for cache in caches:
            cache.reorder(index)
        memory, src_mask = memory[index], src_mask[index]
        # The two copies of row 2 continue with different tokens, as two beams would.
        cont = random_ids(4, 5)
        cont[0, 0], cont[2, 0] = 5, 6
        new_tgt = torch.cat([tgt[index], cont], dim=1)  # (4, 9) the re-indexed prefixes + more
        full = model.decode(new_tgt, memory, src_mask)  # uncached reference
        for i in range(tgt.size(1), new_tgt.size(1)):
            step = model.decode(new_tgt[:, i : i + 1], memory, src_mask, caches, offset=i)
            torch.testing.assert_close(step[:, 0], full[:, i], atol=1e-5, rtol=0.0)
    assert not torch.allclose(full[0, 4:], full[2, 4:], atol=1e-3)  # the copies did diverge


def test_kv_cache_reorder_indexes_every_tensor() -> None:
    tensors = [torch.randn(3, 2, 4, 5) for _ in range(4)]
    cache = KVCache(*tensors)
    index = torch.tensor([1, 1, 0])
    cache.reorder(index)
    names = ("self_k", "self_v", "cross_k", "cross_v")
    for name, before in zip(names, tensors, strict=True):
        torch.testing.assert_close(getattr(cache, name), before[index], atol=0.0, rtol=0.0)
    empty = KVCache()
    empty.reorder(index)  # nothing cached yet: a no-op, not an error
    assert empty.self_k is None


@NORMS
@pytest.mark.parametrize("chunk", [2, 3])
def test_several_tokens_at_once_on_a_cache(norm_first: bool, chunk: int, tiny_model) -> None:
    # T > 1 new tokens on a non-empty cache need the right-aligned causal mask.
    model = tiny_model(norm_first=norm_first)
    src, tgt = padded_source(), random_ids(3, 9)
    src_mask = padding_mask(src, PAD)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        caches = model.new_caches()
        first = model.decode(tgt[:, :chunk], memory, src_mask, caches)  # chunk tokens, empty cache
        torch.testing.assert_close(first, full[:, :chunk], atol=1e-5, rtol=0.0)
        i = chunk
        while i < tgt.size(1):  # then chunk at a time: (T=chunk) queries over (i+chunk) keys
            step = model.decode(tgt[:, i : i + chunk], memory, src_mask, caches, offset=i)
            torch.testing.assert_close(step, full[:, i : i + chunk], atol=1e-5, rtol=0.0)
            i += chunk


# ----------------------------------------------------------------- parameter counts


def expected_parameters(cfg: ModelConfig) -> int:
    """Analytic count: embeddings + encoder + decoder (+ untied/unshared tables, final norms)."""
    D, F_, V = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size
    attn = 4 * D * D + 4 * D  # q, k, v, out projections with biases
    ffn = 2 * D * F_ + F_ + D  # two linear layers with biases
    norm = 2 * D  # LayerNorm gain and bias
    total = V * D  # the shared embedding, also the output projection when tied
    total += cfg.n_encoder_layers * (attn + ffn + 2 * norm)
    total += cfg.n_decoder_layers * (2 * attn + ffn + 3 * norm)
    if not cfg.share_embeddings:
        total += cfg.src_vocab_size * D  # a separate source table
    if not cfg.tie_output:
        total += V * D  # the generator has no bias
    if cfg.norm_first:
        total += 2 * norm  # the final LayerNorm of each stack
    return total


def meta_model(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):  # shapes only, no memory and no init time
        return Transformer(cfg)


def paper_config(size: str) -> ModelConfig:
    shape = {
        "base": dict(d_model=512, n_heads=8, d_ff=2048),
        "big": dict(d_model=1024, n_heads=16, d_ff=4096),
    }
    return ModelConfig(src_vocab_size=37000, tgt_vocab_size=37000, **shape[size])


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_output": False}, {"share_embeddings": False, "src_vocab_size": 50},
     {"norm_first": True}, {"n_encoder_layers": 3, "n_decoder_layers": 1}],
    ids=["tied", "untied", "separate-src", "pre-norm", "3+1-layers"],
)  # fmt: skip
def test_parameter_count_matches_formula(overrides: dict, tiny_config) -> None:
    cfg = tiny_config(**overrides)
    model = Transformer(cfg)
    assert model.num_parameters() == expected_parameters(cfg)
    if cfg.tie_output:  # tied weights are one tensor, counted once
        assert model.generator.weight is model.tgt_embed.weight
    if cfg.share_embeddings:
        assert model.src_embed is model.tgt_embed


def test_paper_base_and_big_parameter_counts() -> None:
    base, big = paper_config("base"), paper_config("big")
    n_base, n_big = meta_model(base).num_parameters(), meta_model(big).num_parameters()
    assert n_base == expected_parameters(base) == 63_082_496
    assert n_big == expected_parameters(big) == 214_245_376
    # Table 3 of the paper: big 213M. Our count is within 0.6%.
    assert abs(n_big - 213e6) / 213e6 < 0.02
    # Table 3 says base has 65M, but that is not reachable with the architecture the paper
    # states (512 / 8 heads / 2048 / 6+6, a shared 37k vocabulary, tied output): the formula
    # gives 63.08M. The same formula gives 214.2M for big, matching its 213M, so the base
    # entry is the odd one (65M would need a ~41k vocabulary; separate source/target tables
    # would give 82M). Hence only 3% here.
    assert abs(n_base - 65e6) / 65e6 < 0.03


# ------------------------------------------------------------------------- learning


def test_loss_drops_on_one_repeated_batch(tiny_config) -> None:
    model = Transformer(tiny_config(dropout=0.0)).train()
    src, tgt = padded_source(), random_ids(3, 9)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(100):  # plenty: the loss ends below 1% of its start
        logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt_out.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0], (losses[0], losses[-1])


def test_gradients_reach_every_parameter(tiny_config) -> None:
    model = Transformer(
        tiny_config(norm_first=True, tie_output=False, share_embeddings=False)
    ).train()
    src, tgt = padded_source(), random_ids(3, 6)
    model(src, tgt).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    for embed in (model.src_embed, model.tgt_embed):  # padding_idx: the pad row never moves
        assert torch.all(embed.weight.grad[PAD] == 0)


# -------------------------------------------------------------------- attention maps


def test_attention_maps_shapes_and_rows(tiny_config) -> None:
    cfg = tiny_config(n_encoder_layers=3, n_decoder_layers=2)
    model = Transformer(cfg).eval()
    src, tgt = padded_source(), random_ids(3, 5)  # B=3, S=7, T=5
    maps = model.attention_maps(src, tgt)
    assert len(maps.encoder_self) == 3 and len(maps.decoder_self) == 2 and len(maps.cross) == 2
    assert all(w.shape == (3, 2, 7, 7) for w in maps.encoder_self)
    assert all(w.shape == (3, 2, 5, 5) for w in maps.decoder_self)
    assert all(w.shape == (3, 2, 5, 7) for w in maps.cross)
    real = padding_mask(src, PAD)[:, None, None, :]  # (B, 1, 1, S)
    for weights in maps.cross + maps.encoder_self:
        torch.testing.assert_close(
            weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0.0
        )
        assert torch.all(weights.masked_select(~real.expand_as(weights)) == 0)  # pads get 0
        assert torch.all(weights.masked_select(real.expand_as(weights)) > 0)


# ------------------------------------------------------------------------- config


def test_config_rejects_heads_that_do_not_divide_d_model(tiny_config) -> None:
    with pytest.raises(ValueError, match="divisible"):
        tiny_config(d_model=30, n_heads=4)


def test_config_rejects_shared_embeddings_with_two_vocabularies(tiny_config) -> None:
    with pytest.raises(ValueError, match="share_embeddings"):
        tiny_config(src_vocab_size=40, tgt_vocab_size=50)
    cfg = tiny_config(src_vocab_size=40, tgt_vocab_size=50, share_embeddings=False)
    model = Transformer(cfg)
    assert model.src_embed.num_embeddings == 40 and model.generator.out_features == 50


def test_config_d_head(tiny_config) -> None:
    assert tiny_config(d_model=32, n_heads=4).d_head == 8


# ------------------------------------------------------------------------- dropout


@pytest.mark.parametrize("which", ["dropout", "attn_dropout", "act_dropout"])
def test_dropout_is_active_in_train_mode_and_off_in_eval(which: str, tiny_config) -> None:
    zero = dict(dropout=0.0, attn_dropout=0.0, act_dropout=0.0)
    model = Transformer(tiny_config(**{**zero, which: 0.3}))
    src, tgt = padded_source(), random_ids(3, 5)
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt), atol=1e-4)
    model.eval()
    torch.testing.assert_close(model(src, tgt), model(src, tgt), atol=0.0, rtol=0.0)
    # eval with dropout p equals the same weights with p = 0
    reference = Transformer(tiny_config(**zero)).eval()
    reference.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(src, tgt), reference(src, tgt), atol=1e-6, rtol=0.0)


@pytest.mark.parametrize("layer_cls", [EncoderLayer, DecoderLayer])
@NORMS
def test_dropout_hits_the_sublayer_output_not_the_residual(
    layer_cls, norm_first: bool, tiny_config
) -> None:
    # Sec. 5.4: dropout on each sublayer's output, before the residual add. With p = 1 every
    # sublayer is dropped, so only the residual path (and post-norm's LayerNorms) remains.
    layer = layer_cls(tiny_config(dropout=1.0, norm_first=norm_first)).train()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 6, 32)
    mask = torch.ones(2, 1, 1, 6 if layer_cls is DecoderLayer else 5, dtype=torch.bool)
    out = layer(x, memory, mask).hidden if layer_cls is DecoderLayer else layer(x, mask).hidden
    expected = x
    if not norm_first:  # LayerNorm after each residual add; LayerNorm(LayerNorm(x)) ~ LayerNorm(x)
        expected = F.layer_norm(x, (32,))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0.0)


@pytest.mark.parametrize("d_ff", [64, 96], ids=["d_ff=2D", "d_ff=3D"])
def test_xavier_init_uses_each_matrix_full_shape(d_ff: int, tiny_config) -> None:
    # Only the fused q|k|v projection is initialised as three (D, D) blocks; every other
    # Linear is one Xavier-uniform matrix, bound sqrt(6 / (fan_in + fan_out)). A d_ff of
    # exactly 3 * d_model must not be mistaken for a fused projection.
    model = Transformer(tiny_config(d_ff=d_ff, tie_output=False))
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            rows, cols = module.weight.shape
            fan = (cols + cols) if name.endswith("in_proj") else (rows + cols)
            bound = (6 / fan) ** 0.5
            assert module.weight.abs().max() <= bound + 1e-6, name
            assert module.weight.abs().max() > 0.9 * bound, name  # not a smaller init either


def test_embedding_pad_row_starts_at_zero(tiny_config) -> None:
    model = Transformer(tiny_config(share_embeddings=False))
    assert torch.all(model.src_embed.weight[PAD] == 0)
    assert torch.all(model.tgt_embed.weight[PAD] == 0)
