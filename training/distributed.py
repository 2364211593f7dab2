"""torchrun / DistributedDataParallel plumbing: one process per device, NCCL or gloo.

What a rank does, in order (see `training/loop.py::fit`):
1. `setup()` picks the device (`common.runtime.resolve_device`) and forms the process group,
   with an explicit collective timeout (`trainer.dist_timeout`) and, on CUDA, `device_id`.
2. `check_shared_run_dir()`: every rank must see rank 0's run dir (multi-node needs a shared
   filesystem); otherwise every rank stops with one line instead of diverging.
3. Rank 0 prepares the data (SentencePiece, encoded caches) while the others wait for a file,
   not in a collective, so slow preparation can never trip the collective timeout
   (`wait_for_file`, `training/build.py::prepare_data`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from attnmt.common.errors import UserError
from attnmt.common.files import atomic_write
from attnmt.common.runtime import resolve_device

log = logging.getLogger(__name__)


@dataclass
class DistContext:
    rank: int
    world_size: int
    device: torch.device
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def is_main_process() -> bool:
    """Rank 0, or no torchrun at all (readable before the process group exists)."""
    return int(os.environ.get("RANK", "0")) == 0


def setup(requested_device: str, timeout_s: float = 1800.0, tf32: bool = True) -> DistContext:
    """Pick the device and, under torchrun (WORLD_SIZE > 1), form the process group."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(requested_device, "trainer.device", local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # TF32 tensor cores for fp32 matmuls (Ampere+): ~8x the fp32 rate, 10-bit mantissa.
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        log.info("TF32 for fp32 matmuls: %s (trainer.tf32)", "on" if tf32 else "off")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            timeout=timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
            **_elastic_store(world_size, timedelta(seconds=timeout_s)),
        )
    rank = dist.get_rank() if dist.is_initialized() else 0
    return DistContext(rank, world_size, device, local_rank)


def _elastic_store(world_size: int, timeout: timedelta) -> dict:
    """Under torchrun, a store whose keys are private to this restart of the group.

    torchrun's workers share one TCP store across elastic restarts (torch 2.13, c10d
    rendezvous), and the restarted group could read its dead predecessor's addresses: gloo then
    fails with "Connection refused" (seen in 3 of 3 restarts under load here). A prefix per
    restart avoids it; without torchrun, `env://` as usual.
    """
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None or "MASTER_ADDR" not in os.environ:
        return {}
    rank = int(os.environ["RANK"])
    on_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # the agent serves it
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not on_agent and rank == 0,
        timeout=timeout,
        multi_tenant=not on_agent,
    )
    return {
        "store": dist.PrefixStore(f"attnmt/restart_{restart}", store),
        "rank": rank,
        "world_size": world_size,
    }


def all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    """Sum a few scalars over ranks (float64 so token counts stay exact). One host read."""
    if not ctx.enabled:
        return values
    sums = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(sums)
    return sums.tolist()


def all_reduce_(tensor: torch.Tensor, ctx: DistContext, op: str = "sum") -> torch.Tensor:
    """In-place sum (or max) over ranks, staying on the device: no host read."""
    if ctx.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj: object, ctx: DistContext) -> object:
    """Rank 0's value of `obj` on every rank."""
    if not ctx.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: object, ctx: DistContext) -> list[object]:
    """Every rank's `obj`, indexed by rank, on every rank."""
    if not ctx.enabled:
        return [obj]
    out: list[object] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def teardown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def check_shared_run_dir(run_dir: Path, ctx: DistContext) -> None:
    """Fail on every rank, with one line, unless all ranks use one run dir that all can see.

    Rank 0 writes a fresh token into `run_dir/.launch`; every rank reads it back through its
    own path. A node with another `hydra.run.dir`, or a node-local disk, would otherwise train
    on (and resume from) different files.
    """
    if not ctx.enabled:
        return
    token = f"{uuid.uuid4().hex} {socket.gethostname()}"
    if ctx.is_main:
        atomic_write(run_dir / ".launch", token)
    token, rank0_dir = broadcast_object((token, str(run_dir)), ctx)
    try:
        seen = (run_dir / ".launch").read_text(encoding="utf-8")
    except OSError:
        seen = ""
    problems = gather_objects(None if seen == token else socket.gethostname(), ctx)
    bad = [(rank, host) for rank, host in enumerate(problems) if host is not None]
    if bad:
        rank, host = bad[0]
        raise UserError(
            f"rank {rank} (host {host}) cannot see rank 0's run dir {rank0_dir}: training on "
            "several nodes needs one run dir on a filesystem every node shares; pass the same "
            "hydra.run.dir=/shared/path to every node"
        )


class PeerFailed(UserError):
    """Another rank failed while this one waited for it."""


def wait_for_file(path: Path, token: str, failed: Path, poll_s: float = 0.5) -> None:
    """Block until `path` holds `token` (a peer's "done" note for this launch). No collective,
    so no timeout. Raises `PeerFailed` when `failed` holds this launch's token (a peer's error),
    or when torchrun's launcher is gone."""
    launcher = os.getppid()
    while True:
        if _read(path) == token:
            return
        note = _read(failed)
        if note.startswith(f"{token} "):
            raise PeerFailed(note.removeprefix(f"{token} "))
        if "TORCHELASTIC_RUN_ID" in os.environ and os.getppid() != launcher:
            raise PeerFailed(f"the torchrun launcher (PID {launcher}) has exited")
        time.sleep(poll_s)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""
