"""Plan first, then execute: ``build_plan(spec)`` is pure and serialisable; only ``execute`` has side effects."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from distlaunch.launcher.hostfile import HostSlots
from distlaunch.launcher.parallel import Parallel, ParallelSpec, check_tp_within_hosts, groups, resolve_parallel

_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MASK = "***"


class LaunchSpec(BaseModel):
    """Everything build_plan needs, already resolved (hosts filtered, port chosen, job id drawn)."""

    hosts: list[HostSlots]
    command: list[str]  # what every rank runs, e.g. [python, train.py, --lr, 3e-4]
    parallel: ParallelSpec = ParallelSpec()
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: Literal["gloo", "nccl"] = "gloo"
    env: dict[str, str] = Field(default_factory=dict)  # user --env, forwarded variables
    job_id: str
    addresses: dict[str, str] = Field(default_factory=dict)  # host → address others reach it by


class RankPlan(BaseModel):
    rank: int
    local_rank: int
    device: str
    env: dict[str, str]
    argv: list[str]


class NodePlan(BaseModel):
    host: str
    address: str
    node_rank: int
    ranks: list[RankPlan]


class LaunchPlan(BaseModel):
    """The whole job: who runs what, where, with which environment. Serialised by ``--dry-run --json``."""

    job_id: str
    world_size: int
    nnodes: int
    master_addr: str
    master_port: int
    backend: str
    parallel: Parallel
    nodes: list[NodePlan]
    groups: dict[str, list[list[int]]]

    def masked(self) -> "LaunchPlan":
        """A copy safe to print: values of env names with TOKEN, KEY, SECRET or PASSWORD are hidden."""
        copy = self.model_copy(deep=True)
        for node in copy.nodes:
            for rank in node.ranks:
                rank.env = mask_env(rank.env)
        return copy


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Hide the values of variables whose names look like secrets."""
    return {k: (MASK if _SECRET.search(k) else v) for k, v in env.items()}


def rank_env(spec: LaunchSpec, parallel: Parallel, world_size: int, node_rank: int, rank: int, local_rank: int,
             host: HostSlots) -> dict[str, str]:
    """The torchrun-compatible environment of one rank, plus distlaunch's own variables."""
    env = dict(spec.env)
    env.update({
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(host.nslots),
        "NODE_RANK": str(node_rank),
        "GROUP_RANK": str(node_rank),
        "NNODES": str(len(spec.hosts)),
        "DISTLAUNCH_JOB_ID": spec.job_id,
        "DISTLAUNCH_PARALLEL": str(parallel),
        "DISTLAUNCH_BACKEND": spec.backend,
        "DISTLAUNCH_RESTART_COUNT": "0",
    })
    if spec.backend == "nccl":
        # Slots name GPUs: every rank of a node sees the node's GPUs, LOCAL_RANK picks one (as torchrun).
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in host.slots)
    return env


def build_plan(spec: LaunchSpec) -> LaunchPlan:
    """Lay ranks out over hosts in hostfile order and attach each one's environment and command."""
    world_size = sum(h.nslots for h in spec.hosts)
    parallel = resolve_parallel(spec.parallel, world_size)
    host_of_rank = [h.host for h in spec.hosts for _ in h.slots]
    check_tp_within_hosts(parallel, host_of_rank)
    nodes, rank = [], 0
    for node_rank, host in enumerate(spec.hosts):
        ranks = []
        for local_rank in range(host.nslots):
            device = f"cuda:{local_rank}" if spec.backend == "nccl" else "cpu"
            env = rank_env(spec, parallel, world_size, node_rank, rank, local_rank, host)
            ranks.append(RankPlan(rank=rank, local_rank=local_rank, device=device, env=env, argv=list(spec.command)))
            rank += 1
        nodes.append(NodePlan(host=host.host, address=spec.addresses.get(host.host, host.host), node_rank=node_rank, ranks=ranks))
    return LaunchPlan(job_id=spec.job_id, world_size=world_size, nnodes=len(nodes), master_addr=spec.master_addr,
                      master_port=spec.master_port, backend=spec.backend, parallel=parallel, nodes=nodes,
                      groups=groups(parallel))
