"""Jobs that heal themselves: ``--nnodes MIN:MAX`` with a hostfile.

The job runs on the first MAX hosts of the hostfile; the hosts after them are spares. When an attempt ends with
a failure that points at a host, that host is quarantined for the rest of the job: a spare takes its place (the
same layout), or, with no spare left, the job shrinks to the largest layout its remaining hosts can hold (dp
shrinks; tp and pp stay, as the model's shapes fix them). It goes on while at least MIN healthy hosts remain.
Before every attempt, the hosts of that attempt are checked in parallel, within a time bound: SSH, the agent's
interpreter starting (the same preflight as any launch), the master port. A host that fails it is quarantined
too, and the next spare is checked in its place.

A failure points at a host when distlaunch lost contact with it, it went silent (missed heartbeats), a rank
there was killed by SIGKILL (the kernel's OOM killer sends it too), SIGSEGV or SIGBUS, its output shows a GPU
error (Xid, ECC, "CUDA error"), it failed the preflight, a watch asked for it (a straggler with
``--on-straggler replace``), or it was the root cause of two attempts. Any other failure (the script's own
exception) restarts the same hosts, as ``--max-restarts`` does without spares.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from distlaunch.contract.layout import MODEL_DEGREES, Layout, LayoutSpec
from distlaunch.contract.options import NodeRange
from distlaunch.contract.report import HOST_SILENT_CODE, LOST_AGENT_CODE, RankExit
from distlaunch.errors import HostError, UsageError
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.supervising.recovery import AttemptEnd, Connect, NextAttempt
from distlaunch.readable import plural

if TYPE_CHECKING:
    from distlaunch.remote.session import RemoteHosts

log = logging.getLogger("distlaunch")

PREFLIGHT_TIMEOUT_S = 15.0  # SSH connection to each host of the next attempt, all at once
DEFAULT_MAX_RESTARTS = 3  # with --nnodes MIN:MAX and no --max-restarts: recover without a human, within bounds
HOST_SIGNALS = ("SIGKILL", "SIGSEGV", "SIGBUS")
GPU_ERROR = re.compile(r"\bXid\b|\bECC\b|CUDA error|uncorrectable", re.IGNORECASE)


def node_range(text: str) -> NodeRange:
    """``--nnodes MIN:MAX`` (or ``N``, the same as ``N:N``) read with a hostfile."""
    low, colon, high = text.strip().partition(":")
    try:
        least, most = int(low), int(high if colon else low)
    except ValueError:
        raise UsageError(
            f"--nnodes {text!r} is not a node count or a MIN:MAX range", "write --nnodes 2 or --nnodes 2:4"
        ) from None
    if not 1 <= least <= most:
        raise UsageError(
            f"--nnodes {text}: MIN must be at least 1 and at most MAX",
            f"write e.g. --nnodes {max(most, 1)}:{max(most, 1)}",
        )
    return NodeRange(min_nodes=least, max_nodes=most)


def split_spares(hosts: list[HostSlots], nodes: NodeRange, hostfile: object) -> tuple[list[HostSlots], list[HostSlots]]:
    """The hosts a job with ``--nnodes MIN:MAX`` starts on (the first MAX), and its spares (the rest)."""
    if len(hosts) < nodes.min_nodes:
        raise UsageError(
            f"--nnodes {nodes} needs at least {plural(nodes.min_nodes, 'host')}, but {hostfile} has {len(hosts)}",
            f"lower MIN to {len(hosts)}, or add hosts to the hostfile",
        )
    return hosts[: nodes.max_nodes], hosts[nodes.max_nodes :]


def host_fault(failure: RankExit) -> str | None:
    """Why this failure points at its host, in a few words; None when it points at the program."""
    if failure.exit_code == LOST_AGENT_CODE:
        return "lost contact with its agent"
    if failure.exit_code == HOST_SILENT_CODE:
        return "its agent lost the launcher and stopped its ranks"
    if failure.signal in HOST_SIGNALS:
        return f"rank {failure.rank} was killed by {failure.signal}"
    match = GPU_ERROR.search("\n".join(failure.tail))
    if match:
        return f"GPU error on rank {failure.rank} ({match.group(0)})"
    return None


@dataclass
class Pool:
    """The hosts of the job: in use (in rank order), spares (in hostfile order), and quarantined (host -> why)."""

    active: list[HostSlots]
    spares: list[HostSlots]
    nodes: NodeRange
    quarantined: dict[str, str] = field(default_factory=dict)
    root_causes: dict[str, int] = field(default_factory=dict)  # host -> attempts it was the root cause of

    def faults(self, end: AttemptEnd) -> dict[str, str]:
        """The hosts an attempt's end points at (host -> why)."""
        bad = dict(end.quarantine)
        for silent in end.silent:
            bad.setdefault(silent.host, f"went silent for {silent.silent_s:g}s (missed heartbeats)")
        for failure in end.failures:
            why = host_fault(failure)
            if why is not None:
                bad.setdefault(failure.host, why)
        if end.failures:
            host = end.failures[0].host
            self.root_causes[host] = self.root_causes.get(host, 0) + 1
            if self.root_causes[host] >= 2:
                bad.setdefault(host, f"failed twice ({end.failures[0].what})")
        return bad

    def drop(self, bad: dict[str, str]) -> list[str]:
        """Quarantine ``bad`` hosts; a spare takes each one's place (in its position, so the other hosts keep
        their ranks). The spares that joined, in order. Raises HostError when fewer than MIN hosts remain."""
        added = []
        for host, why in bad.items():
            self.quarantined[host] = why
            index = next((i for i, h in enumerate(self.active) if h.host == host), None)
            self.spares = [h for h in self.spares if h.host != host]
            if index is None:
                continue
            if self.spares:
                spare = self.spares.pop(0)
                self.active[index] = spare
                added.append(spare.host)
            else:
                del self.active[index]
        if len(self.active) < self.nodes.min_nodes:
            gone = ", ".join(f"{h} ({why})" for h, why in self.quarantined.items())
            raise HostError(
                f"only {plural(len(self.active), 'healthy host')} left, fewer than --nnodes {self.nodes}: {gone}",
                "fix or replace those hosts (or lower MIN), then resume the job from its checkpoint",
            )
        return added


def fitted(
    hosts: list[HostSlots], layout: Layout, valid: Callable[[Layout], str | None]
) -> tuple[list[HostSlots], Layout]:
    """The largest layout ``hosts`` can hold with ``layout``'s tp, pp and the rest: dp shrinks (tp and pp are
    tied to the model's shapes); ranks past a whole dp replica are left idle, from the last host back. ``valid``
    says why a layout cannot train (the engine's rules: the global batch must split over dp), or None."""
    slots = sum(h.nslots for h in hosts)
    per_replica = layout.model_parallel
    problems = []
    for dp in range(min(slots // per_replica, layout.dp), 0, -1):
        candidate = layout.model_copy(update={"dp": dp})
        problem = valid(candidate)
        if problem is None:
            return _trimmed(hosts, dp * per_replica), candidate
        problems.append(f"dp={dp}: {problem}")
    split = ", ".join(f"{axis}={getattr(layout, axis)}" for axis in MODEL_DEGREES)  # tp=2, pp=1
    raise HostError(
        f"the {plural(len(hosts), 'host')} left ({plural(slots, 'slot')}) cannot hold a layout with {split}"
        + (f" ({problems[0]})" if problems else ""),
        "add hosts to the hostfile as spares, or resume later on enough hosts",
    )


def _trimmed(hosts: list[HostSlots], ranks: int) -> list[HostSlots]:
    """``hosts`` holding exactly ``ranks`` ranks: slots dropped from the last host back (a host left with none
    is left out)."""
    kept, left = [], ranks
    for host in hosts:
        if left <= 0:
            break
        kept.append(host if host.nslots <= left else host.model_copy(update={"slots": host.slots[:left]}))
        left -= min(host.nslots, left)
    return kept


class Healing:
    """The recovery policy of a job with spares (``supervising/recovery.py``'s ``Recovery``): after an attempt that did not finish,
    quarantine the hosts its end points at, take spares or shrink, check the next attempt's hosts, and go on
    while restarts and hosts last. It owns the SSH connections of the attempt it starts: ``connect`` opens them
    (the preflight) and gives the plan back as its hosts decide it (their network cards)."""

    def __init__(
        self,
        first: LaunchPlan,
        pool: Pool,
        replan: Callable[[list[HostSlots], LayoutSpec], LaunchPlan],
        connect: Callable[[LaunchPlan], tuple[LaunchPlan, Connect, RemoteHosts | None]],
        max_restarts: int,
        notice: Callable[[str], None],
        valid: Callable[[Layout], str | None] = lambda layout: None,
    ):
        self.first, self.pool, self.replan = first, pool, replan
        self.open_connections, self.max_restarts, self.notice, self.valid = connect, max_restarts, notice, valid
        self.remote: RemoteHosts | None = None

    def start(self) -> NextAttempt:
        """The first attempt: its hosts checked first (a host that fails is replaced by a spare)."""
        return self._checked(self.first, {}, [])

    def after(self, end: AttemptEnd, restart_count: int) -> NextAttempt | None:
        if not (end.failures or end.hang or end.quarantine or end.silent):  # it finished
            return None
        bad = self.pool.faults(end)
        if restart_count >= self.max_restarts:
            self.notice(f"no restart left (--max-restarts {self.max_restarts}): the job ends here")
            return None
        try:
            added = self.pool.drop(bad)
            plan = self._plan(end.plan)
        except HostError as exc:
            self.notice(f"cannot go on: {exc}")
            return None
        self._say(restart_count, end, bad, added, plan)
        self.close()
        try:
            return self._checked(plan, bad, added)
        except (HostError, UsageError) as exc:  # UsageError: a spare without the network card the job names
            self.notice(f"cannot go on: {exc}")
            return None

    def _plan(self, before: LaunchPlan) -> LaunchPlan:
        """The next attempt's plan on the pool's hosts: the same layout when they hold it, else a smaller one."""
        hosts, layout = fitted(self.pool.active, self.first.parallel, self.valid)
        try:
            return self.replan(hosts, layout)
        except UsageError as exc:  # a tensor-parallel group would span two hosts of other sizes
            raise HostError(f"the hosts left cannot hold the job: {exc.message}", exc.hint) from None

    def _checked(self, plan: LaunchPlan, dropped: dict[str, str], added: list[str]) -> NextAttempt:
        """Preflight: connect to the plan's remote hosts and start their agents; a host that fails is quarantined
        and replaced (or the job shrinks) until every host of the plan passes."""
        from distlaunch.remote.ssh import HostsFailed

        while True:
            try:
                plan, connect, self.remote = self.open_connections(plan)
                return NextAttempt(plan, connect, dropped=dropped, added=added)
            except HostsFailed as exc:
                failed = {e.host: e.message.removeprefix(f"{e.host}: ") for e in exc.errors if e.host}
                if not failed or len(failed) < len(exc.errors):
                    raise
                self.notice(f"preflight: {'; '.join(f'{h}: {why}' for h, why in failed.items())}")
                dropped = {**dropped, **{h: f"failed preflight: {why}" for h, why in failed.items()}}
                added = [h for h in added if h not in failed] + self.pool.drop(failed)
                plan = self._plan(plan)

    def _say(self, restart_count: int, end: AttemptEnd, bad: dict[str, str], added: list[str], plan: LaunchPlan):
        count = f"{restart_count + 1}/{self.max_restarts}"
        for host, why in bad.items():
            self.notice(f"quarantined {host} for the rest of the job: {why}")
        change = f"{', '.join(added)} in place of {', '.join(bad)}" if added else ""
        if plan.world_size < end.plan.world_size:
            ranks = f"{plan.world_size} rank{'s' if plan.world_size > 1 else ''}"
            change = f"shrinking to {ranks} ({plan.parallel})" + (f", {change}" if change else "")
        cause = "the hang" if end.hang is not None else end.failures[0].what if end.failures else ""
        cause = cause or ", ".join(bad)
        self.notice(f"restarting the job ({count}) after {cause}" + (f": {change}" if change else ""))

    def close(self) -> None:
        """Disconnect from the hosts of the attempt that ended."""
        if self.remote is not None:
            self.remote.close()
            self.remote = None
