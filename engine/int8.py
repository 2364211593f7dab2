"""Dynamic int8 quantization of the engine's linear layers, for CPU inference (`torch.ao`).

Every linear layer the engine runs (attention projections, feed-forward, the output
projection) gets int8 weights, quantized once, per output channel; activations are quantized
on the fly, per batch, and the matmuls run in int8 with float32 results
(`torch.ao.nn.quantized.dynamic.Linear`). Embeddings, LayerNorm, softmax and the search stay
float32. The engine quantizes copies, so the model keeps its float32 layers:
- cross-attention's q and k | v slices of the fused `in_proj` become two layers of their own
  (a slice is no module to swap);
- a tied output projection becomes its own int8 copy of the embedding table, while the
  embedding lookups keep the float32 table.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def quantize_linears(modules: nn.Module) -> nn.Module:
    """Swap every `nn.Linear` inside `modules` (in place) for a dynamic int8 linear layer."""
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():  # torch.ao's deprecation notices (torchao is its successor)
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            modules, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True
        )
