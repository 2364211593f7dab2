"""torchrun / DistributedDataParallel plumbing: one process per device, NCCL or gloo."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.errors import UserError

log = logging.getLogger(__name__)


class DeviceError(UserError):
    """Asked for a device this machine does not have."""


@dataclass
class DistContext:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def pick_device(requested: str, local_rank: int = 0) -> torch.device:
    """`auto` -> CUDA when present, else CPU; `cuda` without a GPU is an error."""
    if requested not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"trainer.device={requested} is not one of auto|cpu|cuda")
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "trainer.device=cuda but no CUDA GPU is visible to PyTorch "
            f"(torch {torch.__version__}); use trainer.device=cpu or auto"
        )
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def setup(requested_device: str) -> DistContext:
    """Initialise the process group when launched by torchrun (WORLD_SIZE > 1)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(requested_device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
    rank = dist.get_rank() if dist.is_initialized() else 0
    return DistContext(rank, world_size, device)


def all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    """Sum a few scalars over ranks (float64 so token counts stay exact)."""
    if not ctx.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.tolist()


def broadcast_object(obj: object, ctx: DistContext) -> object:
    """Rank 0's value of `obj` on every rank."""
    if not ctx.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def teardown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
