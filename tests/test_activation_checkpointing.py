"""`trainer.activation_checkpointing`: each encoder/decoder layer is recomputed in the backward
pass (torch.utils.checkpoint, use_reentrant=False). Same gradients, fewer saved activations."""

from __future__ import annotations

import pytest
import torch

from attnmt.checkpoint import load_checkpoint
from attnmt.training.loop import fit
from tests.conftest import VOCAB, make_tiny_model
from tests.train_helpers import toy_cfg


def _set(model: torch.nn.Module, on: bool) -> None:
    model.encoder.checkpoint_activations = model.decoder.checkpoint_activations = on


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    tgt = torch.randint(4, VOCAB, (3, 5), generator=g)
    src[0, 5:] = 0  # padding
    return src, tgt


def _grads(model: torch.nn.Module, on: bool) -> dict[str, torch.Tensor]:
    _set(model, on)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)  # the same dropout draws for both settings
    src, tgt = _batch()
    model(src, tgt).float().logsumexp(-1).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("norm_first", [False, True])
def test_same_gradients_with_and_without(norm_first):
    # Dropout everywhere: the recomputation must draw the same masks (the RNG is restored).
    model = make_tiny_model(
        seed=0, norm_first=norm_first, dropout=0.3, attn_dropout=0.2, act_dropout=0.2
    ).train()
    plain, recomputed = _grads(model, False), _grads(model, True)
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_keeps_fewer_activations_for_the_backward():
    def saved_bytes(on: bool) -> int:
        model = make_tiny_model(seed=0).train()
        _set(model, on)
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            src, tgt = _batch()
            model(src, tgt)
        return total

    assert saved_bytes(True) < 0.6 * saved_bytes(False)


def test_training_with_it_equals_training_without(tmp_path):
    """Through fit(): 6 updates with dropout give the same weights either way."""
    common = ("trainer.max_steps=6", "trainer.eval_every=6", "model.dropout=0.2")
    fit(toy_cfg(tmp_path, *common), tmp_path / "plain")
    fit(toy_cfg(tmp_path, *common, "trainer.activation_checkpointing=true"), tmp_path / "ckpt")
    a = load_checkpoint(tmp_path / "plain" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "ckpt" / "checkpoints" / "last.pt")["model"]
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, atol=1e-5, rtol=1e-4, msg=name)
