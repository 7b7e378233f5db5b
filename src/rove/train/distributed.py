"""Data-parallel plumbing: the same code path for 1 process and for N under ``torchrun``.

``torchrun --nproc_per_node=N`` sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT``; :func:`init_distributed` reads them and starts a process group (NCCL on
CUDA, gloo on CPU) only when ``WORLD_SIZE > 1``. Without them it describes a single process and
every collective below is a no-op, so the training loop never branches on "distributed or not".

If a process group already exists (a caller set it up), it is used and left running.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "DistInfo",
    "all_gather_objects",
    "all_reduce_mean",
    "barrier",
    "init_distributed",
    "shutdown_distributed",
    "wrap_ddp",
]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: its ranks, the world size and its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    owns_group: bool  # this module started the process group and must destroy it

    @property
    def is_main(self) -> bool:
        """Rank 0 writes files, logs and shows the progress bar."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an int, got {value!r}") from None


def _pick_device(device: str, local_rank: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but CUDA is not available")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    return dev


def init_distributed(device: str = "auto") -> DistInfo:
    """Read the torchrun environment, pick the device and start the process group if needed.

    ``device`` is "auto" (CUDA if available, else CPU), "cpu" or "cuda"; under torchrun each
    process takes ``cuda:<LOCAL_RANK>``.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"invalid torchrun environment: RANK={rank}, WORLD_SIZE={world_size}")
    dev = _pick_device(device, local_rank)
    owns = False
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        owns = True
    if dist.is_initialized() and dist.get_world_size() != world_size:
        raise ValueError(
            f"process group has {dist.get_world_size()} ranks but WORLD_SIZE={world_size}"
        )
    return DistInfo(rank, local_rank, world_size, dev, owns)


def shutdown_distributed(info: DistInfo) -> None:
    """Destroy the process group if :func:`init_distributed` created it."""
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wrap_ddp(model: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """``model`` wrapped in DDP when distributed, else unchanged."""
    if not info.distributed:
        return model
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Mean of ``value`` over ranks (sum then divide: gloo has no AVG)."""
    if not info.distributed:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / info.world_size


def all_gather_objects(obj: object, info: DistInfo) -> list:
    """``obj`` of every rank, in rank order (a one-element list when not distributed)."""
    if not info.distributed:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()
