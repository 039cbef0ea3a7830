"""What the hosts that run the ranks decide for a job, from the inventories they report: the backend under
``--backend auto``, the ranks per host under ``-n auto|gpu``, and the GPU or host memory the planner counts on.

Never the machine that typed the command (a login node, a laptop): where that machine runs ranks itself, it is one
of the hosts and its own inventory speaks for it. One owner for every backend: a launch's preflight, a per-node
launch and an srun task (each on its own host) all decide here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel

from distlaunch.contract.inventory import HostInventory
from distlaunch.contract.options import Nproc
from distlaunch.errors import UsageError
from distlaunch.hostprobe import inventory
from distlaunch.readable import plural

PENDING_BACKEND = "nccl where every host has GPUs, else gloo"  # what --backend auto will decide
# what a CPU rank's memory will be counted from, where the hosts are not read yet (a dry run without --probe)
PENDING_HOST_MEMORY = "from the hosts at start: the smallest MemTotal / ranks of a host (--probe reads it now)"


class Decisions(BaseModel):
    """The hosts' decisions for one job, and whose facts they came from (``source``)."""

    backend: Literal["nccl", "gloo"]
    gpus: dict[str, int]  # host -> its GPUs, as it reported them
    ranks: dict[str, int] = {}  # host -> its ranks, where -n auto|gpu (or no -n on this machine) counts GPUs
    gpu_memory_mib: int | None = None  # the smallest GPU of the hosts, where every GPU's memory is known
    gpu_memory_host: str | None = None  # the host that has it
    gpu_model: str | None = None  # the first GPU's model on the first host that names one (the cost model's rate)
    inventories: dict[str, HostInventory] = {}  # what each host reported: the job record and its report keep it
    source: str = "the hosts"  # this machine; the hosts; the hosts, read N min ago

    def host_memory_per_rank(self, ranks: Mapping[str, int]) -> tuple[int | None, str]:
        """The host memory (bytes) each CPU rank may count on: the smallest MemTotal / ranks among the hosts that
        run them (``ranks``: host -> its ranks), and where that figure came from, naming the host; None (and
        which host did not say) where a host's memory is unknown."""
        shares = {}
        for host, count in ranks.items():
            found = self.inventories.get(host)
            if found is None or found.memory_mib is None:
                return None, f"unknown: {host} did not report its memory"
            shares[host] = (found.memory_mib << 20) // max(count, 1)
        if not shares:
            return None, "unknown: no host runs a rank"
        host = min(shares, key=shares.__getitem__)
        return shares[host], f"MemTotal of {host} / {plural(ranks[host], 'rank')}"


def local_inventory() -> HostInventory:
    """This machine's inventory, by the probe every agent runs: where it runs ranks, it is a host like any."""
    return HostInventory.model_validate(inventory())


def local_gpu_count() -> int:
    """This machine's GPUs, as its inventory reports them (only for work done on this machine itself)."""
    return local_inventory().gpu_count


def gpu_counts(inventories: Mapping[str, HostInventory | None]) -> dict[str, int]:
    """Each host's GPUs; a host that reported no inventory cannot decide, and says how to decide for it."""
    missing = [host for host, found in inventories.items() if found is None]
    if missing:
        raise UsageError(
            f"{missing[0]} did not report its GPUs: its agent's hello carried no inventory",
            "give --backend gloo|nccl and -n N, or see what it reports with distlaunch hosts -H HOSTFILE",
        )
    return {host: found.gpu_count for host, found in inventories.items() if found is not None}


def odd_one(counts: Mapping[str, int], same: bool) -> tuple[str, str]:
    """The host that differs from the others (the fewer kind), and one of the others: by count, or by having GPUs
    at all (``same`` False)."""
    kinds = Counter((c if same else bool(c)) for c in counts.values())
    rare = min(kinds, key=lambda k: (kinds[k], -list(kinds).index(k)))
    odd = next(h for h, c in counts.items() if (c if same else bool(c)) == rare)
    other = next(h for h, c in counts.items() if (c if same else bool(c)) != rare)
    return odd, other


def decide_backend(backend: str, counts: Mapping[str, int]) -> Literal["nccl", "gloo"]:
    """``--backend auto``: nccl where every host has GPUs, gloo where none has; hosts that disagree are refused."""
    if backend in ("nccl", "gloo"):
        return backend  # type: ignore[return-value]
    with_gpus = [h for h, c in counts.items() if c]
    if with_gpus and len(with_gpus) < len(counts):
        odd, other = odd_one(counts, same=False)
        raise UsageError(
            f"--backend auto: {odd} has {plural(counts[odd], 'GPU')} but {other} has {plural(counts[other], 'GPU')}: "
            "the hosts cannot agree on nccl or gloo",
            f"pass --backend gloo to run every host on its CPUs, or leave {odd if counts[odd] == 0 else other} out "
            "(-e HOST)",
        )
    return "nccl" if with_gpus else "gloo"


def decide_ranks(nproc: Nproc, counts: Mapping[str, int]) -> dict[str, int]:
    """Ranks per host that -n counts from GPUs (auto: the GPUs or 1; gpu: the GPUs, the same on every host);
    empty where a number or the hostfile's slots say."""
    if nproc not in ("auto", "gpu"):
        return {}
    if nproc == "auto":
        return {host: count or 1 for host, count in counts.items()}
    none = [host for host, count in counts.items() if not count]
    if none:
        raise UsageError(f"--nproc-per-node gpu: {none[0]} has no GPU", "give a number, e.g. -n 4, or auto")
    if len(set(counts.values())) > 1:
        odd, other = odd_one(counts, same=True)
        raise UsageError(
            f"--nproc-per-node gpu: {odd} has {plural(counts[odd], 'GPU')} but {other} has {counts[other]}: "
            "every host would run another number of ranks",
            f"give the ranks per host, e.g. -n {min(counts.values())}",
        )
    return dict(counts)


def decide(inventories: Mapping[str, HostInventory | None], backend: str, nproc: Nproc, source: str) -> Decisions:
    """Every decision the hosts' inventories make for a job, or one line naming the host that disagrees."""
    if backend == "auto" or nproc in ("auto", "gpu"):
        counts = gpu_counts(inventories)
    else:  # nothing hangs on them: a host without an inventory counts as none
        counts = {host: found.gpu_count if found else 0 for host, found in inventories.items()}
    chosen = decide_backend(backend, counts)
    ranks = decide_ranks(nproc, counts)
    memory = {h: inv.gpu_memory_mib for h, inv in inventories.items() if inv is not None and inv.gpu_count}
    known = {h: m for h, m in memory.items() if m is not None}
    smallest = min(known, key=known.__getitem__) if known and len(known) == len(memory) else None
    return Decisions(
        backend=chosen,
        gpus=counts,
        ranks=ranks,
        gpu_memory_mib=known[smallest] if smallest else None,
        gpu_memory_host=smallest,
        gpu_model=next((g.model for inv in inventories.values() if inv for g in inv.gpus if g.model), None),
        inventories={host: found for host, found in inventories.items() if found is not None},
        source=source,
    )


def local_nproc(nproc: Nproc) -> int | None:
    """-n for work that runs on this machine itself (an srun task, a batch script's node): auto and gpu count
    this machine's GPUs, through the same rule as a launch's hosts."""
    if nproc not in ("auto", "gpu"):
        return nproc  # type: ignore[return-value]
    return decide_ranks(nproc, {"this machine": local_gpu_count()})["this machine"]
