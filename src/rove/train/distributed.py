"""Data-parallel plumbing: the same code path for 1 process and for N under ``torchrun``.

``torchrun --nproc_per_node=N`` sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT``; :func:`init_distributed` reads them and starts a process group (NCCL on
CUDA, gloo on CPU) only when ``WORLD_SIZE > 1``. Without them it describes a single process and
every collective below is a no-op, so the training loop never branches on "distributed or not".

If a process group already exists (a caller set it up), it is used and left running.

Two ways to spread a model over the ranks (``TrainConfig.parallel``): ``"ddp"`` keeps a full
replica per rank and all-reduces gradients; ``"fsdp"`` (FSDP2, ``fully_shard``) shards
parameters, gradients and optimizer state, so a rank holds ``1 / world_size`` of them plus one
block's gathered weights at a time: the option for models that do not fit one GPU. Checkpoints
are full (unsharded) either way, gathered through :func:`unsharded_copy`, so a run can resume
under the other strategy or another world size's layout.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rove.model import GPT
from rove.precision import resolve_device

PARALLEL = ("ddp", "fsdp")

__all__ = [
    "DistInfo",
    "all_gather_objects",
    "all_reduce_mean",
    "barrier",
    "init_distributed",
    "load_optimizer_state",
    "shard_fsdp",
    "shutdown_distributed",
    "unsharded_copy",
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
    dev = torch.device(resolve_device(device))
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


def shard_fsdp(model: GPT, info: DistInfo) -> GPT:
    """Shard ``model`` in place with FSDP2 over all ranks (no-op for one process).

    Each transformer block is its own unit (its weights are gathered just before it runs and
    freed after), the root holds the rest: embeddings, the tied LM head, the final norm. Call
    it after ``model.to(device)`` and before building the optimizer, which must see the
    sharded parameters.
    """
    if not info.distributed:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(info.device.type, (info.world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


ModelT = TypeVar("ModelT", bound=torch.nn.Module)
Twin = Callable[[], tuple[ModelT, torch.optim.Optimizer]]  # a fresh model and its optimizer


def unsharded_copy(
    model: ModelT, optimizer: torch.optim.Optimizer, make_twin: Twin[ModelT], info: DistInfo
) -> tuple[ModelT, torch.optim.Optimizer]:
    """A plain copy of a sharded ``model`` and ``optimizer`` holding their full states, for
    writing a checkpoint; ``(model, optimizer)`` themselves when not sharded.

    ``make_twin()`` builds an unsharded CPU model of the same architecture and its optimizer.
    A collective: every rank must call it. Only rank 0 builds the copy (the others get the
    originals back and must not save them).
    """
    if not _is_sharded(model):
        return model, optimizer
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full tensors on rank 0
    model_state = get_model_state_dict(model, options=opts)
    optim_state = get_optimizer_state_dict(model, optimizer, options=opts)
    if not info.is_main:
        return model, optimizer
    twin, twin_opt = make_twin()
    twin.load_state_dict(model_state)
    set_optimizer_state_dict(
        twin, twin_opt, optim_state, options=StateDictOptions(full_state_dict=True)
    )
    return twin, twin_opt


def load_optimizer_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    make_twin: Twin[torch.nn.Module],
) -> None:
    """Load a checkpoint's (full, index-keyed) optimizer ``state`` into ``optimizer``.

    For a sharded model the state goes through an unsharded twin (``make_twin()``: a CPU model
    and its optimizer, as for :func:`unsharded_copy`), whose name-keyed full state
    ``set_optimizer_state_dict`` then shards onto this rank.
    """
    if not _is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    twin, twin_opt = make_twin()
    twin_opt.load_state_dict(state)
    full = get_optimizer_state_dict(twin, twin_opt, options=StateDictOptions(full_state_dict=True))
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


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
