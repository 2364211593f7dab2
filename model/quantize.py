"""Dynamic int8 quantization of a trained Transformer for CPU inference (`torch.ao`).

Every `nn.Linear` (attention projections, feed-forward, the output projection) gets int8
weights, quantized once, per output channel; activations are quantized on the fly, per
batch, and the matmuls run in int8 with float32 results (`torch.ao.nn.quantized.dynamic.Linear`).
Embeddings, LayerNorm, softmax and the search stay float32.

- Cross-attention's fused `in_proj` is split first (`MultiHeadAttention.split_in_proj`):
  cross-attention projects its slices separately, and a slice is no module to swap.
- A tied output projection keeps working: it becomes its own int8 copy of the embedding
  table, while the embedding lookups keep the float32 table.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from model.transformer import Transformer


def quantize_dynamic_int8(model: Transformer, inplace: bool = False) -> Transformer:
    """The model with int8 linear layers (CPU only; eval mode; not trainable).

    Raises:
        ValueError: the model is not on the CPU (torch's dynamic int8 kernels are CPU kernels).
    """
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(
            f"int8 dynamic quantization runs on the CPU only, the model is on {device}"
        )
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    for layer in model.decoder.layers:
        layer.cross_attn.split_in_proj()
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():  # torch.ao's deprecation notices (torchao is its successor)
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            model, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True
        )
