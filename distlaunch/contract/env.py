"""The per-rank environment: torchrun's variables plus distlaunch's own, written here for every backend."""

from __future__ import annotations

import os
from collections.abc import Mapping

from distlaunch.contract.layout import Layout
from distlaunch.errors import UsageError

JOB_ID_VAR = "DISTLAUNCH_JOB_ID"  # every process of a job carries it: ranks, agents, what they start


def error_file(job_id: str, rank: int) -> str:
    """Where a rank's ``@record`` writes its exception (TORCHELASTIC_ERROR_FILE); read back when the rank fails."""
    return f"/tmp/distlaunch-{job_id}-rank{rank}-error.json"


def contract_env(
    *,
    master_addr: str,
    master_port: int,
    world_size: int,
    rank: int,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    nnodes: int,
    job_id: str,
    parallel: Layout,
    backend: str,
    restart_count: int = 0,
    max_restarts: int = 0,
) -> dict[str, str]:
    """The one writer of the per-rank contract, shared by every backend (local, SSH, srun step).

    It is torchrun's full set (so ``torch.distributed.is_torchelastic_launched()`` is True and torchrun-aware
    libraries trust RANK/WORLD_SIZE), plus distlaunch's own DISTLAUNCH_* variables.
    """
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(nnodes),
        "NNODES": str(nnodes),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "TORCHELASTIC_RUN_ID": job_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_ERROR_FILE": error_file(job_id, rank),
        "TORCHELASTIC_USE_AGENT_STORE": "False",  # ranks build their own store from MASTER_ADDR/MASTER_PORT
        JOB_ID_VAR: job_id,
        "DISTLAUNCH_PARALLEL": str(parallel),
        "DISTLAUNCH_BACKEND": backend,
        "DISTLAUNCH_RESTART_COUNT": str(restart_count),
    }


def is_contract_key(name: str) -> bool:
    """A variable distlaunch writes for every rank (``contract_env``): a user's value would be replaced."""
    return name in _CONTRACT_KEYS


_CONTRACT_FIX = {"MASTER_ADDR": "use --master-addr ADDR", "MASTER_PORT": "use --master-port PORT"}


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options into a dict, values kept byte for byte."""
    env = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not key or not key.isascii() or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise UsageError(
                f"--env {pair!r} is not KEY=VALUE or NAME", "write --env NAME=value (NAME: letters, digits, _)"
            )
        if is_contract_key(key):
            raise UsageError(
                f"--env {key}: distlaunch sets {key} for every rank itself, so this value would be replaced",
                _CONTRACT_FIX.get(key, "leave it out: the hostfile, -n and --parallel set the ranks' layout"),
            )
        if not eq:  # mpirun's -x NAME: forward this launcher's value
            if key not in os.environ:
                raise UsageError(
                    f"--env {key}: {key} is not set here, so there is nothing to forward", f"write --env {key}=value"
                )
            value = os.environ[key]
        env[key] = value
    return env


def launcher_defaults(backend: str, ranks_per_host: int, environ: Mapping[str, str]) -> dict[str, str]:
    """What distlaunch adds to every rank unless the user's environment already says it (as torchrun)."""
    defaults = {}
    if ranks_per_host > 1:
        defaults["OMP_NUM_THREADS"] = "1"  # N ranks each starting one thread per core oversubscribe the host
    defaults["PYTHONUNBUFFERED"] = "1"  # live logs: ranks' prints reach the launcher (or srun) as they happen
    if backend == "nccl":
        defaults["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"  # a hung collective aborts the rank
    return {name: value for name, value in defaults.items() if name not in environ}


_CONTRACT_KEYS = frozenset(
    contract_env(
        master_addr="", master_port=0, world_size=1, rank=0, local_rank=0, local_world_size=1, node_rank=0,
        nnodes=1, job_id="", parallel=Layout(dp=1, tp=1, pp=1), backend="",
    )
)  # fmt: skip
