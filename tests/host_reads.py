"""`HostReads`: every read of a device value on the host, for the tests that training updates
make none (on a GPU the host waits for the device at each)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

T = torch.Tensor
# Python-level reads of a tensor's value or copies to the host: on CUDA each one waits for the GPU.
PY_READS = {
    T.item, T.tolist, T.__bool__, T.__float__, T.__int__, T.__index__, T.numpy, T.cpu,
}  # fmt: skip
# Operators that read device memory on the host inside C++ (CUDA syncs), besides those tagged
# as having a data-dependent output or output shape.
SYNC_OPS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
}
SYNC_TAGS = {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output}
INDEX_OPS = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default}


class _PyReads(TorchFunctionMode):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in PY_READS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


class _SyncOps(TorchDispatchMode):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNC_OPS or SYNC_TAGS & set(func.tags) or _bool_mask_index(func, args):
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def _bool_mask_index(func, args) -> bool:
    if func not in INDEX_OPS or len(args) < 2:
        return False
    return any(isinstance(i, T) and i.dtype == torch.bool for i in (args[1] or []) if i is not None)


class HostReads:
    """Records every read of a tensor's value on the host in its block, Python-level
    (`PY_READS`) or inside an operator (`SYNC_OPS`, `SYNC_TAGS`, boolean-mask indexing):
    `with HostReads() as reads: ...; reads.calls`."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._modes = (_PyReads(self.calls), _SyncOps(self.calls))

    def __enter__(self) -> HostReads:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
