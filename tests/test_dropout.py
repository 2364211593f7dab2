"""training/kernels.py: the CPU dropout is dropout (rate, scale, gradient, seeding, modes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnmt.model import Transformer
from attnmt.training.kernels import Dropout, dropout, use_fast_dropout


@pytest.mark.parametrize("p", [0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rate_and_expectation(p, dtype):
    """The dropped fraction is p within 5 standard errors, and kept elements are scaled so
    that the mean is unchanged."""
    torch.manual_seed(0)
    n = 1_000_001  # odd: the last int32 draw is split over one element only
    x = torch.ones(n, dtype=dtype)
    y = dropout(x, p)
    dropped = (y == 0).double().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / n) ** 0.5
    kept = y[y != 0].float()
    n_drop = round(p * 2**15)
    scale = torch.tensor(2**15 / (2**15 - n_drop), dtype=dtype).float()
    assert torch.equal(kept, scale.expand_as(kept))  # one scale for every kept element


def test_masks_are_not_correlated_between_neighbours():
    """The two elements that share one 32-bit draw are dropped independently."""
    torch.manual_seed(1)
    y = dropout(torch.ones(400_000), 0.5)
    drop = (y == 0).double().view(-1, 2)
    both = (drop[:, 0] * drop[:, 1]).mean().item()
    assert abs(both - 0.25) < 5 * (0.25 * 0.75 / drop.size(0)) ** 0.5


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.2)
    g = torch.randn_like(y)
    y.backward(g)
    factor = torch.where(y != 0, y / x.detach(), 0.0)  # the mask times the scale
    torch.testing.assert_close(x.grad, g * factor)


def test_seeded_like_the_rest_of_torch():
    """`torch.manual_seed` fixes the masks (resumed runs replay the same dropout)."""
    x = torch.ones(1000)
    torch.manual_seed(7)
    a = dropout(x, 0.1)
    torch.manual_seed(7)
    b = dropout(x, 0.1)
    assert torch.equal(a, b) and not torch.equal(a, dropout(x, 0.1))


def test_modes_and_edges():
    x = torch.randn(10, 10)
    module = Dropout(0.5)
    assert module.eval()(x) is x  # eval: the input itself
    assert dropout(x, 0.0) is x
    assert not dropout(x, 1.0).any()  # p = 1: everything dropped (F.dropout's answer)
    assert "p=0.5" in repr(module)
    with pytest.raises(ValueError, match="between 0 and 1"):
        Dropout(1.5)


def test_non_cpu_tensors_use_torch_dropout():
    """Elsewhere the fused F.dropout runs (checked on the meta device: shapes only)."""
    x = torch.empty(4, 8, device="meta")
    y = dropout(x, 0.1)
    assert y.device.type == "meta" and y.shape == x.shape


def test_use_fast_dropout_swaps_every_dropout_of_the_model(tiny_config):
    """Training's swap reaches all four dropouts of the model (sublayer outputs, embeddings +
    positions, attention weights, after the FFN activation), keeps their rates, and leaves the
    weights, and so the checkpoints, as they were."""
    model = Transformer(tiny_config(dropout=0.1, attn_dropout=0.2, act_dropout=0.3))
    rates = {name: m.p for name, m in model.named_modules() if isinstance(m, nn.Dropout)}
    assert set(rates.values()) == {0.1, 0.2, 0.3}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert use_fast_dropout(model) is model
    swapped = {
        name: (type(m), m.p) for name, m in model.named_modules() if isinstance(m, nn.Dropout)
    }
    assert swapped == {name: (Dropout, p) for name, p in rates.items()}
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    src, tgt = torch.randint(1, 40, (2, 5)), torch.randint(1, 40, (2, 4))
    model.train()
    torch.manual_seed(3)
    a = model(src, tgt)
    torch.manual_seed(3)
    assert torch.equal(a, model(src, tgt))  # seeded: the same masks
    model.eval()
    assert not torch.equal(a, model(src, tgt))  # ... which eval does not apply
