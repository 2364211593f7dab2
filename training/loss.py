"""Label-smoothed cross-entropy that ignores padding (Szegedy et al. 2016; paper sec. 5.4)."""

from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


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
        logits: (B, T, V); tgt_out: (B, T).
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V), float32 even under bf16
    nll = -log_probs.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -log_probs.mean(dim=-1)  # (B, T)
    keep = tgt_out.ne(pad_id)  # (B, T)
    nll = nll.masked_fill(~keep, 0.0).sum()
    smooth = smooth.masked_fill(~keep, 0.0).sum()
    loss = (1.0 - smoothing) * nll + smoothing * smooth
    return LossOutput(loss, nll.detach())
