"""Where each rank runs on its host's CPUs (``--cpu-bind``): the one rule, applied on the host that runs the rank
from that host's own inventory (hostprobe.py), by its agent, or under srun by the task itself.

- ``auto`` (the default): a rank with a GPU gets the CPUs of its GPU's NUMA node, a rank without one an equal
  share of the usable CPUs (as ``cores``), as torchrun's ``--numa-binding`` does.
- ``none``: every rank keeps every CPU it would have had.
- ``numa``: the GPU's NUMA node; without GPUs the NUMA nodes shared out by local rank.
- ``cores``: an equal, disjoint share of the usable CPUs per local rank.
- a list: each local rank's CPUs, ``:`` between ranks, each in the kernel's CPU list syntax (``0-3:4-7``).

The usable CPUs are those the binding process itself may run on (what a taskset, a container or a Slurm step
left it): a binding is always inside them, never over them. Standard library only: the agent imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from distlaunch.errors import UsageError
from distlaunch.hostprobe import format_cpulist, parse_cpulist

POLICIES = ("auto", "none", "numa", "cores")
DEFAULT = "auto"
LIST_HINT = "write one CPU list per local rank, ':' between ranks, e.g. --cpu-bind 0-3:4-7"
# Slurm's own binding (srun --cpu-bind, or the cluster's TaskPlugin default): SLURM_CPU_BIND_TYPE names it
_SLURM_UNBOUND = re.compile(r"^(none|quiet|verbose|,)*$")
_CPU_LIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")  # the kernel's syntax, strictly: 0-3,8


def parse_cpu_bind(text: str) -> str | list[list[int]]:
    """``--cpu-bind``: a policy name, or the per-local-rank CPU lists (bad syntax: a usage error)."""
    text = text.strip()
    if text in POLICIES:
        return text
    sets = [parse_cpulist(part) if _CPU_LIST.fullmatch(part.strip()) else None for part in text.split(":")]
    if not text or any(not cpus for cpus in sets):
        raise UsageError(f"--cpu-bind {text!r} is not none, numa, cores or a list of CPU sets", LIST_HINT)
    return sets


def check_sets(text: str, local_ranks: int, usable: list[int] | None) -> None:
    """A ``--cpu-bind`` list must give a set to each of the ``local_ranks`` ranks of a host, inside the CPUs its
    ranks may use (``usable``; None: not known here, only the count is checked). The error's message ends where
    the host's name may follow (" on node2")."""
    sets = parse_cpu_bind(text)
    if isinstance(sets, str):
        return
    if len(sets) < local_ranks:
        raise UsageError(
            f"--cpu-bind {text} gives {_sets(len(sets))} for {local_ranks} ranks",
            f"give one CPU list per local rank ({local_ranks}), ':' between them",
        )
    if usable is None:
        return
    absent = sorted(set().union(*sets[:local_ranks]) - set(usable))
    if absent:
        raise UsageError(
            f"--cpu-bind {text} names CPU {format_cpulist(absent)}, outside the usable CPUs {format_cpulist(usable)}",
            "name CPUs of that host (distlaunch hosts lists them), inside any taskset the launch runs under",
        )
    if len(sets) > max(len(usable), 1):
        raise UsageError(
            f"--cpu-bind {text} gives {_sets(len(sets))}, more than the {len(usable)} usable CPU{'' if len(usable) == 1 else 's'}",
            f"give at most one set per CPU ({format_cpulist(usable)})",
        )


def _sets(count: int) -> str:
    return f"{count} CPU set" + ("" if count == 1 else "s")


def usable_cpus(inventory: Mapping) -> list[int]:
    """The CPUs the probing process may run on (its affinity), as the inventory says."""
    return parse_cpulist(inventory.get("affinity") or "") or []


def node_cpus(inventory: Mapping, usable: list[int]) -> list[list[int]]:
    """Each NUMA node's usable CPUs, by node id; a node with none usable is left out."""
    nodes = []
    for node in sorted(inventory.get("numa_nodes") or [], key=lambda n: n.get("id", 0)):
        cpus = [c for c in parse_cpulist(node.get("cpus") or "") or [] if c in usable]
        if cpus:
            nodes.append(cpus)
    return nodes


def gpu_node_cpus(inventory: Mapping, gpu: int, usable: list[int]) -> list[int]:
    """The usable CPUs of GPU ``gpu``'s NUMA node; empty where its node is unknown."""
    found = next((g for g in inventory.get("gpus") or [] if g.get("index") == gpu), None)
    node = None if found is None else found.get("numa_node")
    entry = next((n for n in inventory.get("numa_nodes") or [] if n.get("id") == node), None)
    cpus = parse_cpulist(entry.get("cpus") or "") if entry else None
    return [c for c in cpus or [] if c in usable]


def share(cpus: list[int], local_rank: int, local_ranks: int) -> list[int]:
    """Local rank ``local_rank``'s equal, disjoint part of ``cpus``; with more ranks than CPUs, one CPU each, in turn."""
    if len(cpus) < local_ranks:
        return [cpus[local_rank % len(cpus)]]
    return cpus[local_rank * len(cpus) // local_ranks : (local_rank + 1) * len(cpus) // local_ranks]


def rank_gpu(env: Mapping[str, str], local_rank: int, inventory: Mapping) -> int | None:
    """The GPU a rank uses: under NCCL, on a host with GPUs, the ``local_rank``-th of CUDA_VISIBLE_DEVICES (as
    torchrun's ranks pick theirs), else that index; None for a rank without a GPU."""
    if env.get("DISTLAUNCH_BACKEND") != "nccl" or not inventory.get("gpus"):
        return None
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible:
        return local_rank
    chosen = visible[local_rank % len(visible)]
    return int(chosen) if chosen.isdigit() else None


def rank_cpus(
    policy: str, inventory: Mapping, local_rank: int, local_ranks: int, gpu: int | None = None
) -> list[int] | None:
    """The CPUs a rank is bound to under ``policy`` (``--cpu-bind``'s text) on the host of ``inventory``, whose
    usable CPUs it never leaves; None: it is left as it is (``none``, or the CPUs are unknown)."""
    usable = usable_cpus(inventory)
    rule = parse_cpu_bind(policy)
    if rule == "none" or not usable:
        return None
    if isinstance(rule, list):
        check_sets(policy, local_ranks, usable)
        return rule[local_rank]
    near = gpu_node_cpus(inventory, gpu, usable) if gpu is not None else []
    if rule in ("auto", "numa") and near:
        return near
    if rule == "numa":
        nodes = node_cpus(inventory, usable) or [usable]
        return nodes[local_rank * len(nodes) // local_ranks]
    return share(usable, local_rank, local_ranks)


def slurm_bound(environ: Mapping[str, str]) -> bool:
    """Slurm bound this task already (srun --cpu-bind, or the cluster's default): that binding is kept."""
    kind = environ.get("SLURM_CPU_BIND_TYPE")
    return kind is not None and not _SLURM_UNBOUND.match(kind.strip())


def describe(policy: str) -> str:
    """Where the policy puts a rank, in words, for the plan."""
    rule = parse_cpu_bind(policy)
    if isinstance(rule, list):
        sets = [format_cpulist(cpus) for cpus in rule]
        return f"local rank 0 on CPUs {sets[0]}" + "".join(f", {i} on {cpus}" for i, cpus in enumerate(sets) if i)
    return {
        "auto": "its GPU's NUMA node, else an equal share of the host's CPUs",
        "none": "every CPU of the host (no binding)",
        "numa": "a NUMA node: its GPU's, else one by local rank",
        "cores": "an equal share of the host's CPUs",
    }[rule]
