"""Plan first, then execute: ``build_plan(spec)`` is pure and serialisable; only ``execute`` has side effects."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from distlaunch.agent.rankenv import SCRATCH_MARK, rank_vars
from distlaunch.contract.env import contract_env
from distlaunch.contract.layout import Layout, LayoutSpec, groups, resolve_layout, tp_group_across_nodes
from distlaunch.contract.plan import View, rank_device
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.decisions import Decisions
from distlaunch.launcher.planning.hostfile import HostSlots

# by name: ..._TOKEN, API_KEY, ..._SECRET, any PASS (PASSWORD, PASSWD, PASSPHRASE), ..._PAT, CREDENTIALS
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASS|CREDENTIAL|(^|_)PAT$|(^|_)AUTH", re.IGNORECASE)
# by value: the password of a URL (scheme://user:password@host), and well-known token prefixes
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]*:)(?P<password>[^/\s@]+)(?=@)", re.IGNORECASE)
_TOKEN_VALUE = re.compile(r"^(hf_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abp]-|sk-|AKIA)[A-Za-z0-9_\-]{8,}")
MASK = "***"


class Spares(BaseModel):
    """``--nnodes MIN:MAX``: the hosts waiting to take a failed host's place (hostfile order), and the fewest hosts
    the job goes on with (launcher/elastic/healing.py)."""

    min_nodes: int
    hosts: list[HostSlots] = Field(default_factory=list)


class LaunchSpec(BaseModel):
    """Everything build_plan needs, already resolved (hosts filtered, port chosen, job id drawn)."""

    hosts: list[HostSlots]
    command: list[str]  # what every rank runs, e.g. [python, train.py, --lr, 3e-4]
    parallel: LayoutSpec = LayoutSpec()
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: Literal["gloo", "nccl", "auto"] = "gloo"  # auto: the hosts decide at start (``decisions`` None)
    env: dict[str, str] = Field(default_factory=dict)  # user --env, forwarded variables
    job_id: str
    addresses: dict[str, str] = Field(default_factory=dict)  # host → address others reach it by
    local_hosts: list[str] = Field(default_factory=list)  # hosts that are this machine: no SSH
    workdir: str = ""  # where every host's ranks start ("": the launcher's working directory)
    agent_python: str = ""  # the interpreter that runs the agent on remote hosts
    local_python: str = ""  # ... and on this machine (the launcher's own)
    max_restarts: int = 0  # TORCHELASTIC_MAX_RESTARTS
    spares: Spares | None = None  # --nnodes MIN:MAX with a hostfile
    decisions: Decisions | None = None  # what the hosts decided; None: not known before they are contacted
    cpu_bind: str = "auto"  # --cpu-bind, applied by each host's agent from its own inventory (placement.py)
    preload: list[str] = Field(default_factory=list)  # imported once per host, its ranks forked (agent/warm.py)


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
    local: bool = False  # this machine: ranks start as child processes, no SSH
    workdir: str = ""  # where the ranks start
    agent_python: str = ""  # the interpreter that runs this host's agent
    ranks: list[RankPlan]


class LaunchPlan(BaseModel):
    """The whole job: who runs what, where, with which environment. Serialised by ``--dry-run --json``.
    A ``contract.plan.Plan``: the dry-run draws it as a row per host."""

    view: ClassVar[View] = "hosts"
    job_id: str
    world_size: int
    nnodes: int
    master_addr: str
    master_port: int
    backend: str
    parallel: Layout
    nodes: list[NodePlan]
    groups: dict[str, list[list[int]]]
    spares: Spares | None = None  # --nnodes MIN:MAX: who replaces a failed host (None: a job without spares)
    decisions: Decisions | None = None  # backend, -n auto|gpu, GPU memory; None: the hosts decide at start
    cpu_bind: str = "auto"  # each host's agent binds its ranks by it, from its own inventory (placement.py)
    preload: list[str] = Field(default_factory=list)  # each host imports these once and forks its ranks

    def masked(self) -> LaunchPlan:
        """A copy safe to print: secret-looking env values are hidden (``mask_env``)."""
        copy = self.model_copy(deep=True)
        for node in copy.nodes:
            for rank in node.ranks:
                rank.env = mask_env(rank.env)
        return copy


def mask_value(name: str, value: str) -> str:
    """``value`` safe to print: hidden when the name or the value looks like a secret; a URL keeps all
    but its password (``https://user:***@host/``)."""
    if _SECRET.search(name) or _TOKEN_VALUE.match(value):
        return MASK
    return _URL_PASSWORD.sub(lambda m: m["head"] + MASK, value)


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Hide the values of variables that look like secrets, by name or by value."""
    return {k: mask_value(k, v) for k, v in env.items()}


def rank_env(
    spec: LaunchSpec, parallel: Layout, world_size: int, node_rank: int, rank: int, local_rank: int, host: HostSlots
) -> dict[str, str]:
    """The torchrun-compatible environment of one rank, plus distlaunch's own variables, plus the files its agent
    gives it (in the agent's scratch folder, ``<scratch>``: made on the host when the agent starts)."""
    env = dict(spec.env)
    env.update(
        contract_env(
            master_addr=spec.master_addr,
            master_port=spec.master_port,
            world_size=world_size,
            rank=rank,
            local_rank=local_rank,
            local_world_size=host.nslots,
            node_rank=node_rank,
            nnodes=len(spec.hosts),
            job_id=spec.job_id,
            parallel=parallel,
            backend=spec.backend,
            max_restarts=spec.max_restarts,
        )
    )
    if spec.backend == "nccl":
        # Slots name GPUs: every rank of a node sees the node's GPUs, LOCAL_RANK picks one (as torchrun).
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in host.slots)
    env.update(rank_vars(rank, spec.command, SCRATCH_MARK))
    return env


def host_layout(spec: LayoutSpec, hosts: list[HostSlots]) -> Layout:
    """The layout over hosts' slots in hostfile order; a tensor-parallel group must stay inside one host,
    or per-layer all-reduces would cross the network."""
    host_of_rank = [h.host for h in hosts for _ in h.slots]
    layout = resolve_layout(
        spec, len(host_of_rank), lambda n: f"{n} ranks (-n {n} on one host, or hostfile slots adding up to {n})"
    )
    group = tp_group_across_nodes(layout, host_of_rank.__getitem__)
    if group is not None:
        spanned = ", ".join(dict.fromkeys(host_of_rank[r] for r in group))
        raise UsageError(
            f"tp={layout.tp}: tensor-parallel group of ranks {group[0]}..{group[-1]} spans hosts {spanned}",
            f"give every host a multiple of {layout.tp} processes, or lower tp to fit inside one host",
        )
    return layout


def build_plan(spec: LaunchSpec) -> LaunchPlan:
    """Lay ranks out over hosts in hostfile order and attach each one's environment and command."""
    world_size = sum(h.nslots for h in spec.hosts)
    parallel = host_layout(spec.parallel, spec.hosts)
    nodes, rank = [], 0
    for node_rank, host in enumerate(spec.hosts):
        ranks = []
        for local_rank in range(host.nslots):
            device = rank_device(spec.backend, local_rank)
            env = rank_env(spec, parallel, world_size, node_rank, rank, local_rank, host)
            ranks.append(RankPlan(rank=rank, local_rank=local_rank, device=device, env=env, argv=list(spec.command)))
            rank += 1
        nodes.append(
            NodePlan(
                host=host.host,
                address=spec.addresses.get(host.host, host.host),
                node_rank=node_rank,
                local=host.host in spec.local_hosts,
                workdir=spec.workdir,
                agent_python=spec.local_python if host.host in spec.local_hosts else spec.agent_python,
                ranks=ranks,
            )
        )
    return LaunchPlan(
        job_id=spec.job_id,
        world_size=world_size,
        nnodes=len(nodes),
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        backend=spec.backend,
        parallel=parallel,
        nodes=nodes,
        groups=groups(parallel),
        spares=spec.spares,
        decisions=spec.decisions,
        cpu_bind=spec.cpu_bind,
        preload=spec.preload,
    )
