"""Process group start-up from the torchrun env contract, and the one (pp, dp, tp) DeviceMesh.

Ranks are laid out tp fastest, then dp, then pp: ``rank = pp_i*(dp*tp) + dp_i*tp + tp_i``. Tensor
parallel groups (the chattiest: two all-reduces per block) are consecutive ranks, so they land
on one node; the launcher's ``--dry-run`` plan prints these same groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from distlaunch.contract.layout import Layout, mesh_shape
from distlaunch.errors import UsageError
from distlaunch.readable import plural


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, read from the torchrun-compatible environment."""

    rank: int
    world_size: int
    local_rank: int
    launched: bool  # False: no RANK/WORLD_SIZE, a plain single-process run
    backend: str | None = None  # DISTLAUNCH_BACKEND, the launcher's choice; None under torchrun
    local_world_size: int = 1  # the ranks on this host; 1 where the launcher does not say

    @property
    def host_share(self) -> tuple[int, int]:
        """(this rank's part, parts) of work the ranks of one host split between them: (0, 1), the whole,
        where the launcher's LOCAL_RANK and LOCAL_WORLD_SIZE do not fit together."""
        if 0 <= self.local_rank < self.local_world_size:
            return self.local_rank, self.local_world_size
        return 0, 1


def read_env(environ: dict[str, str] | None = None) -> DistEnv:
    """RANK, WORLD_SIZE, LOCAL_RANK (and MASTER_ADDR/PORT when launched), or a single process."""
    env = os.environ if environ is None else environ
    backend = env.get("DISTLAUNCH_BACKEND") or None
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return DistEnv(rank=0, world_size=1, local_rank=0, launched=False, backend=backend)
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise UsageError(
            f"incomplete launch environment: {', '.join(missing)} not set",
            "start the engine with `distlaunch run` or torchrun, or set none of RANK/WORLD_SIZE",
        )
    try:
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", env["RANK"]))
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", 1))
    except ValueError:
        raise UsageError(
            f"RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE must be integers, got RANK={env['RANK']!r} "
            f"WORLD_SIZE={env['WORLD_SIZE']!r} LOCAL_RANK={env.get('LOCAL_RANK')!r} "
            f"LOCAL_WORLD_SIZE={env.get('LOCAL_WORLD_SIZE')!r}",
            "check the launcher's environment",
        ) from None
    if not 0 <= rank < world_size:
        raise UsageError(f"RANK={rank} outside WORLD_SIZE={world_size}", "RANK must be in [0, WORLD_SIZE)")
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        launched=True,
        backend=backend,
        local_world_size=local_world_size,
    )


def pick_device(local_rank: int, backend: str | None = None) -> torch.device:
    """The launcher's backend decides, so the plan it printed is what runs: gloo trains on the CPU
    (also where GPUs exist), nccl on ``cuda:LOCAL_RANK``. Without one (torchrun, a plain process):
    ``cuda:LOCAL_RANK`` when GPUs exist, else the CPU."""
    if backend == "gloo":
        return torch.device("cpu")
    if torch.cuda.is_available():
        index = gpu_of(local_rank, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if backend == "nccl":
        raise UsageError(
            f"the job's backend is nccl, but torch {torch.__version__} sees no CUDA GPU on this host",
            "launch with --backend gloo to train on the CPU, or install a CUDA build of torch where the GPUs are",
        )
    return torch.device("cpu")


def gpu_of(local_rank: int, visible: int, cuda_visible_devices: str | None) -> int:
    """The GPU of a rank: its LOCAL_RANK, or one clear line when this host shows fewer GPUs (CUDA's own
    'invalid device ordinal' would come from every rank past the last GPU, as a traceback)."""
    if local_rank < visible:
        return local_rank
    shown = f" (CUDA_VISIBLE_DEVICES={cuda_visible_devices})" if cuda_visible_devices is not None else ""
    raise UsageError(
        f"LOCAL_RANK {local_rank} has no GPU: this host shows {plural(visible, 'GPU')}{shown}, one per rank",
        f"start at most {plural(visible, 'rank')} per host (-n {visible}, or the hostfile's slots), make more GPUs "
        "visible, or launch with --backend gloo to train on the CPU",
    )


def init_process_group(env: DistEnv, device: torch.device) -> None:
    """nccl on GPUs, gloo on CPUs; a one-rank in-memory group for a plain single-process run."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if env.launched:
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size)
    else:
        # the same code path as a launched job, without needing MASTER_ADDR/PORT
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def build_mesh(layout: Layout, device: torch.device) -> DeviceMesh:
    """The job's DeviceMesh: the launch contract's rank grid (tp fastest, then dp, then pp), its dims named after
    the axes (``mesh['tp']`` etc.), so the groups a plan prints are the groups used."""
    shape = mesh_shape(layout)
    return init_device_mesh(device.type, tuple(shape.values()), mesh_dim_names=tuple(shape))
