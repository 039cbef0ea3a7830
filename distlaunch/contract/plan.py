"""What every backend's plan answers, whatever else it holds: what ``--dry-run`` draws and ``--json`` dumps.

Each backend plans a type of its own (the hosts' ``LaunchPlan``, an srun task's ``SlurmRank``, ...); the commands
read a plan through ``Plan`` only, never through its type, so a new backend's plan is drawn and dumped as it is.
Every member is read-only here: a plan's own fields (or properties) answer them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

from distlaunch.contract.layout import Layout

View = Literal["hosts", "task"]
"""How the dry-run draws a plan: ``hosts``, a row per host with its ranks and then the process groups; ``task``,
the one rank this process becomes (an srun task: Slurm placed the others, so there are no hosts to draw)."""


def rank_device(backend: str, local_rank: int) -> str:
    """The device a rank computes on: its node's GPU ``cuda:LOCAL_RANK`` under nccl, the CPU under gloo; ``auto``
    while the backend is (its host decides at start)."""
    if backend == "auto":
        return "auto"
    return f"cuda:{local_rank}" if backend == "nccl" else "cpu"


class PlannedRank(Protocol):
    """One rank of a plan: its numbers, its device, the environment it starts with and what it runs."""

    @property
    def rank(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def argv(self) -> Sequence[str]: ...


class PlannedHost(Protocol):
    """A host a plan names."""

    @property
    def host(self) -> str: ...


class PlannedNode(PlannedHost, Protocol):
    """A host or node where a plan starts ranks, with how it is reached and where its ranks start."""

    @property
    def address(self) -> str: ...  # how the others reach it (the host's name where they are the same)
    @property
    def node_rank(self) -> int: ...
    @property
    def workdir(self) -> str: ...  # "": the launcher's working directory
    @property
    def agent_python(self) -> str: ...  # "": no agent (the task is the rank)
    @property
    def ranks(self) -> Sequence[PlannedRank]: ...


class PlannedSpares(Protocol):
    """Hosts that wait to replace a failed one, and the fewest hosts the job goes on with."""

    @property
    def min_nodes(self) -> int: ...
    @property
    def hosts(self) -> Sequence[PlannedHost]: ...


class Plan(Protocol):
    """What would start, as a backend planned it: the job, its layout, its hosts or nodes and their ranks."""

    @property
    def job_id(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def nnodes(self) -> int: ...  # the hosts or nodes the job spans: ``nodes`` may hold only this one's part
    @property
    def master_addr(self) -> str: ...
    @property
    def master_port(self) -> int: ...
    @property
    def backend(self) -> str: ...  # the ranks' process-group backend: gloo or nccl; auto: the hosts decide at start
    @property
    def parallel(self) -> Layout: ...
    @property
    def groups(self) -> Mapping[str, Sequence[Sequence[int]]]: ...  # each axis' process groups (tp, dp, pp)
    @property
    def nodes(self) -> Sequence[PlannedNode]: ...  # where this plan starts ranks, in node order
    @property
    def spares(self) -> PlannedSpares | None: ...  # None: a job without spares
    @property
    def cpu_bind(self) -> str: ...  # --cpu-bind: how each host places its ranks on its CPUs (placement.py)
    @property
    def preload(self) -> Sequence[str]: ...  # --preload: what each host imports once before forking its ranks
    @property
    def view(self) -> View: ...

    def masked(self) -> Plan:
        """A copy safe to print: secret-looking environment values hidden."""
        ...

    def model_dump_json(self, *, indent: int | None = None) -> str:
        """The whole plan as JSON (a pydantic model's): what ``--dry-run --json`` prints, masked first."""
        ...
