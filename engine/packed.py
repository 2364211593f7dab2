"""Linear layers with pre-packed oneDNN weights, for CPU inference.

`F.linear` on the CPU hands float32 matmuls to MKL, which re-lays out (packs) the weight on
every call; oneDNN can pack it once, in the blocked layout its kernels read, which is what
CTranslate2 does with its packed GEMMs. At decoding's shapes (64 and 320 rows, d_model 256,
d_ff 1024, an 8,000-token output projection) on an AVX-512 CPU, 2 threads, the packed matmul
was 1.23-1.77x faster, the output projection most (`benchmarks/bench_decode_ops.py`).

`PackedLinear.from_linear(linear)` shares `linear`'s parameters (so state dicts, tied weights and
exports see the same tensors) and uses the packed weight only when nothing needs a gradient:
training, CUDA and float16 keep `F.linear`. Under CPU bf16 autocast it packs a bf16 copy and
returns bf16, as autocast's `linear` does. The packed copy follows the weight: an in-place
change (`load_state_dict`, an optimizer step) or a new tensor (`.to()`) repacks it at the next
call.

Results equal `F.linear` up to float32 rounding (a different summation order), not bitwise.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear kernels."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def _bf16_packing() -> bool:
    """Whether oneDNN can pack bf16 weights here: it needs AVX-512 (BW, VL, DQ) or
    AVX-NE-CONVERT, and raises on an AVX2-only CPU, where bf16 autocast then takes
    `F.linear`."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Linear):
    """`nn.Linear` whose inference on the CPU runs oneDNN's pre-packed matmul."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self._packed: dict[tuple, tuple[tuple[int, int], Tensor, Tensor | None]] = {}

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        """A `PackedLinear` holding `linear`'s own parameters (shared, not copied)."""
        packed = cls.__new__(cls)
        nn.Module.__init__(packed)
        packed.in_features, packed.out_features = linear.in_features, linear.out_features
        packed.weight, packed.bias = linear.weight, linear.bias
        packed._packed = {}
        packed.train(linear.training)
        return packed

    def _packed_weight(
        self, dtype: torch.dtype, rows: tuple[int, int] | None
    ) -> tuple[Tensor, Tensor | None]:
        """The weight (or its rows `rows`) in oneDNN's blocked layout and the bias (or its
        rows), in `dtype`; made again when the weight changed."""
        weight = self.weight
        # inference tensors (made under inference_mode) have no version counter
        key = (weight.data_ptr(), -1 if weight.is_inference() else weight._version)
        cached = self._packed.get((dtype, rows))
        if cached is None or cached[0] != key:
            part = slice(*rows) if rows is not None else slice(None)
            with torch.no_grad():
                packed = torch.ops.mkldnn._reorder_linear_weight(weight[part].to(dtype))
                bias = None if self.bias is None else self.bias[part].to(dtype)
            cached = (key, packed, bias)
            self._packed[(dtype, rows)] = cached
        return cached[1], cached[2]

    def forward(self, x: Tensor, rows: tuple[int, int] | None = None, relu: bool = False) -> Tensor:
        """`F.linear(x, weight, bias)`, or with rows `start:end` of both when `rows` is given
        (e.g. the query slice of a fused q|k|v projection); `relu=True` applies `F.relu` to
        the result (inside the packed matmul: no second pass over its output)."""
        weight = self.weight
        dtype = (
            torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else weight.dtype
        )
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        if (
            needs_grad
            or x.device.type != "cpu"
            or dtype not in (torch.float32, torch.bfloat16)
            or (dtype == torch.bfloat16 and not _bf16_packing())
        ):
            bias = self.bias
            if rows is not None:
                weight = weight[slice(*rows)]
                bias = None if bias is None else bias[slice(*rows)]
            out = F.linear(x, weight, bias)
            return F.relu(out) if relu else out
        packed, bias = self._packed_weight(dtype, rows)
        if x.dtype != dtype:
            x = x.to(dtype)
        return torch.ops.mkldnn._linear_pointwise(
            x, packed, bias, "relu" if relu else "none", [], ""
        )
