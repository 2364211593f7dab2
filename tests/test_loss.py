"""training/kernels.py: label-smoothed cross-entropy against its formula, padding ignored."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnmt.training.kernels import label_smoothed_cross_entropy

PAD = 0


def _reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[float, float]:
    """Sum over non-pad positions of -sum_v q(v) log p(v), q = (1 - eps) one-hot + eps / V."""
    loss = nll = 0.0
    V = logits.size(-1)
    for b in range(target.size(0)):
        for t in range(target.size(1)):
            y = int(target[b, t])
            if y == PAD:
                continue
            log_p = [
                x - math.log(sum(math.exp(v) for v in logits[b, t].tolist()))
                for x in logits[b, t].tolist()
            ]
            q = [eps / V + (1 - eps if v == y else 0.0) for v in range(V)]
            loss -= sum(qv * lp for qv, lp in zip(q, log_p, strict=True))
            nll -= log_p[y]
    return loss, nll


def test_matches_the_formula_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    target = torch.tensor([[4, 2, 6, 0, 0], [1, 1, 3, 5, 2], [6, 0, 0, 0, 0]])
    for eps in (0.0, 0.1, 0.3):
        out = label_smoothed_cross_entropy(logits, target, PAD, eps)
        loss, nll = _reference(logits, target, eps)
        assert math.isclose(out.loss.item(), loss, rel_tol=1e-6), eps
        assert math.isclose(out.nll.item(), nll, rel_tol=1e-6)


def test_zero_smoothing_is_summed_cross_entropy():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 9)
    target = torch.tensor([[3, 8, 1, 0], [2, 2, 0, 0]])
    out = label_smoothed_cross_entropy(logits, target, PAD, 0.0)
    expected = F.cross_entropy(
        logits.view(-1, 9), target.view(-1), ignore_index=PAD, reduction="sum"
    )
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(out.nll, expected)


def test_pad_positions_change_nothing():
    """Whatever the logits at pad positions are, loss and gradient elsewhere are the same."""
    torch.manual_seed(2)
    logits = torch.randn(1, 4, 6, requires_grad=True)
    target = torch.tensor([[5, 3, 0, 0]])
    other = logits.detach().clone()
    other[0, 2:] = torch.randn(2, 6) * 100
    other.requires_grad_(True)
    a = label_smoothed_cross_entropy(logits, target, PAD, 0.1)
    b = label_smoothed_cross_entropy(other, target, PAD, 0.1)
    torch.testing.assert_close(a.loss, b.loss)
    a.loss.backward()
    b.loss.backward()
    torch.testing.assert_close(logits.grad[0, :2], other.grad[0, :2])
    assert not logits.grad[0, 2:].any() and not other.grad[0, 2:].any()


def _formula(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    """The loss written with plain autograd ops (what autograd differentiates for reference)."""
    log_p = F.log_softmax(logits, dim=-1)
    keep = target.ne(PAD)
    nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -log_p.mean(dim=-1)
    return ((1 - eps) * nll + eps * smooth).masked_fill(~keep, 0.0).sum()


def test_gradient_equals_autograd_of_the_formula_across_row_blocks(monkeypatch):
    """The hand-written backward is d loss / d logits of the formula, also when the rows are
    cut into blocks (a block boundary inside the batch, and a last block that is short)."""
    import attnmt.training.kernels as loss_module

    monkeypatch.setattr(loss_module, "_BLOCK_ELEMENTS", 3 * 11)  # 3 rows of 11 per block
    torch.manual_seed(3)
    logits = torch.randn(2, 5, 11, requires_grad=True)  # 10 rows: blocks of 3, 3, 3, 1
    target = torch.tensor([[4, 2, 10, 0, 0], [1, 1, 3, 5, 0]])
    scale = 0.37  # the caller's 1 / tokens: the incoming gradient is not 1
    out = label_smoothed_cross_entropy(logits, target, PAD, 0.1)
    (out.loss * scale).backward()
    reference = logits.detach().clone().requires_grad_(True)
    expected = _formula(reference, target, 0.1)
    (expected * scale).backward()
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(logits.grad, reference.grad)


def test_bf16_logits_get_a_bf16_gradient_close_to_float32():
    torch.manual_seed(4)
    logits = torch.randn(3, 7, 50)
    target = torch.randint(1, 50, (3, 7))
    low = logits.to(torch.bfloat16).requires_grad_(True)
    out = label_smoothed_cross_entropy(low, target, PAD, 0.1)
    out.loss.backward()
    full = low.detach().float().requires_grad_(True)  # the same numbers in float32
    expected = _formula(full, target, 0.1)
    expected.backward()
    assert low.grad.dtype == torch.bfloat16
    torch.testing.assert_close(out.loss, expected)  # float32 arithmetic on bf16 inputs
    torch.testing.assert_close(low.grad.float(), full.grad, atol=2e-3, rtol=1e-2)


def test_backward_twice_accumulates_the_same_gradient():
    """Nothing saved for the backward is overwritten by it (retain_graph works)."""
    logits = torch.randn(1, 3, 5, requires_grad=True)
    out = label_smoothed_cross_entropy(logits, torch.tensor([[1, 2, 0]]), PAD, 0.1)
    out.loss.backward(retain_graph=True)
    once = logits.grad.clone()
    out.loss.backward()
    torch.testing.assert_close(logits.grad, 2 * once)
