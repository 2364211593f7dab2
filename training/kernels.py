"""The two hand-written kernels training uses, each behind a plain function call and each
checked against the formula it replaces (tests/test_dropout.py, tests/test_loss.py).

- `dropout(x, p, training)` (Srivastava et al. 2014) with a cheap random mask on the CPU.
  `F.dropout` on the CPU draws one Bernoulli sample per element, a visible share of the `tiny`
  model's bf16 training step under torch.profiler (docs/benchmarks.md, "The loss and dropout
  kernels"). Here one 32-bit draw of the same generator
  (`torch.manual_seed` seeds it) gives two elements 15 random bits each, and an element is dropped
  when its bits are below round(p * 2^15): the rate is p to within 2^-16, and the kept elements are
  scaled by exactly 1 / (1 - that rate), so the expectation is the input's, as in `F.dropout`.
  It is faster than `F.dropout` on the CPU (the figure: that section). Elsewhere (CUDA, under `torch.compile`) this is `F.dropout`, whose kernels are
  fused already.
  The model holds plain `nn.Dropout` modules (inference never needs this file); training
  swaps them for `Dropout` below with `use_fast_dropout`, where it builds the model.
- `label_smoothed_cross_entropy` (Szegedy et al. 2016; paper sec. 5.4) that ignores padding,
  with a hand-written backward (see `_SmoothedCrossEntropy`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_BITS = 15  # random bits per element: int32 `random_()` draws 31, split over two int16 halves
_LEVELS = 1 << _BITS


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element with probability p (to 2^-16) and scale the rest by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    if p >= 1.0 or x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    n_drop = round(p * _LEVELS)  # an element is dropped when its 15 bits are below this
    n = x.numel()
    bits = torch.empty((n + 1) // 2, dtype=torch.int32).random_()  # 31 random bits each
    bits = bits.view(torch.int16)[:n].bitwise_and_(_LEVELS - 1)  # (n,) uniform in [0, 2^15)
    mask = bits.ge_(n_drop).view(x.shape).to(x.dtype)  # 1 = kept
    return x * mask.mul_(_LEVELS / (_LEVELS - n_drop))


class Dropout(nn.Dropout):
    """`nn.Dropout` with the CPU mask above; no parameters, so checkpoints are unchanged."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"  # never in place


def use_fast_dropout(model: nn.Module) -> nn.Module:
    """Replace every `nn.Dropout` in `model` by `Dropout` of the same rate, in place; returns
    `model`. Dropout has no parameters or buffers: the state dict is unchanged. The masks are
    drawn in the same order from the same generator, so a run is the same with either module
    wherever `dropout` falls back to `F.dropout` (CUDA, `torch.compile`)."""
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, Dropout(child.p))
    return model


# ------------------------------------------------------------------- the training loss


class LossOutput(NamedTuple):
    loss: Tensor  # summed label-smoothed loss over non-pad tokens (the training objective)
    nll: Tensor  # summed negative log-likelihood over non-pad tokens (for perplexity)


def label_smoothed_cross_entropy(
    logits: Tensor, tgt_out: Tensor, pad_id: int, smoothing: float
) -> LossOutput:
    """Sum over non-pad positions of (1 - eps) * nll + eps * mean_v(-log p_v).

    The target distribution puts 1 - eps on the gold token and eps / V on every token (the
    convention of `F.cross_entropy(label_smoothing=eps)`). Sums, not means: the caller divides
    by the token count of the whole update, so gradient accumulation equals one big batch.
    Nothing is read back to the host: the token count comes from the batch (`n_tgt_tokens`).

    Shape:
        logits: (..., V), any float dtype (the log-softmax is float32); tgt_out: (...).
    """
    V = logits.size(-1)
    loss, nll = _SmoothedCrossEntropy.apply(
        logits.reshape(-1, V), tgt_out.reshape(-1), pad_id, smoothing
    )
    return LossOutput(loss, nll)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """The loss above with a hand-written backward, d loss / d logits = (p - q) at non-pad rows
    (p = softmax, q the smoothed target), computed a block of rows at a time in float32 and
    written in the logits' dtype.

    Why not plain autograd through log_softmax + gather + mean (the formula): that keeps an
    (N, V) float32 log-probability tensor and makes several passes over it in the backward, and
    on the CPU every fresh (N, V) float32 tensor (64 MB for a 2,048-token batch and an 8k
    vocabulary) also costs its page faults. Blocks of `_BLOCK_ELEMENTS` stay in the allocator's
    cache, and only the logits (bf16 under autocast) and three numbers per row are saved.
    Forward + backward on (64, 32, 8000) bf16 logits, 2 threads: 53 ms against 151 ms for the
    formula (docs/benchmarks.md); the results agree (tests/test_loss.py).
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, pad_id: int, eps: float):  # noqa: D102
        keep = target.ne(pad_id)  # (N,)
        target = target.masked_fill(~keep, 0).unsqueeze(1)  # (N, 1), pad rows point at 0
        lse = logits.new_empty(logits.size(0), dtype=torch.float32)  # log sum_v exp(logit_v)
        mean = torch.empty_like(lse)  # mean_v logit_v
        for rows in _blocks(logits):
            block = logits[rows].float()
            torch.logsumexp(block, dim=-1, out=lse[rows])
            torch.mean(block, dim=-1, out=mean[rows])
        gold = logits.gather(1, target).squeeze(1).float()  # (N,)
        nll = torch.where(keep, lse - gold, 0.0).sum()  # -log p_y
        smooth = torch.where(keep, lse - mean, 0.0).sum()  # mean_v -log p_v
        ctx.save_for_backward(logits, lse, target, keep)
        ctx.eps = eps
        ctx.mark_non_differentiable(nll)
        return (1.0 - eps) * nll + eps * smooth, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor):  # noqa: D102
        logits, lse, target, keep = ctx.saved_tensors
        eps, V = ctx.eps, logits.size(-1)
        scale = (grad_loss * keep).unsqueeze(1)  # (N, 1): 0 at pad rows
        gold_step = torch.full_like(scale, eps - 1.0)  # q puts 1 - eps more on the gold token
        grad = torch.empty_like(logits)
        for rows in _blocks(logits):
            block = logits[rows].to(torch.float32, copy=True)  # a copy even if float32
            block.sub_(lse[rows].unsqueeze(1)).exp_()  # p
            block.sub_(eps / V).scatter_add_(1, target[rows], gold_step[rows])  # p - q
            grad[rows] = block.mul_(scale[rows])
        return grad, None, None, None


_BLOCK_ELEMENTS = 1 << 20  # float32 elements per block of rows on the CPU (4 MB)


def _blocks(logits: Tensor) -> list[slice]:
    """Row slices of `logits` (N, V): blocks of about `_BLOCK_ELEMENTS` on the CPU, one block
    elsewhere (a GPU's caching allocator reuses big tensors, and fewer kernels are better)."""
    N, V = logits.shape
    rows = max(1, _BLOCK_ELEMENTS // V) if logits.device.type == "cpu" else max(N, 1)
    return [slice(start, start + rows) for start in range(0, N, rows)]
