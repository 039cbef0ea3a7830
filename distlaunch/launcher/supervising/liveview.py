"""What a running job looks like right now, for the status line a terminal shows under the rank output.

``LiveView`` is a watch: it reads the ranks' starts, exits, output and progress reports (``distlaunch.progress``:
step, total steps, a few figures such as loss and tokens/s, or a few words of what a rank is doing before its
first step) and hands a ``JobStatus`` to the sink twice a second. It never stops the job. How the status is drawn
(or not: a pipe gets none) is the sink's business."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from distlaunch import protocol as p
from distlaunch.contract.sink import JobStatus
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.supervising.watch import Watch
from distlaunch.readable import plural

SHOW_EVERY_S = 0.5
RATE_WINDOW_S = 30.0  # the ETA follows the step rate of about the last half minute, not the whole run's


def starting_line(plan: LaunchPlan) -> str:
    """The first thing a job says, before any rank has imported anything: what starts, and where."""
    hosts = sorted({n.host for n in plan.nodes})
    if len(plan.nodes) < plan.nnodes:  # a per-node launch: this launcher starts its own node only
        node = plan.nodes[0]
        where = f"node {node.node_rank} of {plan.nnodes} ({node.host})"
        ranks = plural(len(node.ranks), "rank") + f" of {plan.world_size}"
    else:
        where = "this machine" if len(hosts) == 1 and plan.nodes[0].local else plural(len(hosts), "host")
        ranks = plural(plan.world_size, "rank")
    return f"job {plan.job_id}: starting {ranks} on {where}"


class LiveView(Watch):
    """Follows one attempt for the status line; ``show`` gets a new ``JobStatus`` every ``SHOW_EVERY_S``."""

    def __init__(self, plan: LaunchPlan, show: Callable[[JobStatus], None]):
        self.show = show
        self.status = JobStatus(world_size=plan.world_size, hosts=len({n.host for n in plan.nodes}), elapsed_s=0.0)
        self.began = time.monotonic()
        self.shown_at = -SHOW_EVERY_S
        self.progress_at: float | None = None
        self.output_at: float | None = None
        self.samples: collections.deque[tuple[float, int]] = collections.deque()  # (its wall clock, step)

    def on_event(self, node_rank: int, event: dict) -> None:
        kind = event.get("ev")
        if kind == p.STARTED:
            self.status.started += 1
            self.status.running += 1
        elif kind == p.EXIT:
            self.status.running = max(0, self.status.running - 1)
        elif kind == p.OUT:
            self.output_at = time.monotonic()
        elif kind == p.PROGRESS:
            self.progress_at = time.monotonic()
            reports = {int(r): v for r, v in (event.get("ranks") or {}).items() if isinstance(v, dict)}
            if reports:
                lowest = min(reports)
                if self.status.reporter is None or lowest <= self.status.reporter:
                    self.status.reporter = lowest
                if self.status.reporter in reports:
                    self.take(reports[self.status.reporter])

    def take(self, report: dict) -> None:
        """The followed rank's report: any field may be missing (an older distlaunch, a plain script)."""
        status = self.status
        step, at = report.get("step"), report.get("at")
        if isinstance(report.get("total_steps"), int):
            status.total_steps = report["total_steps"]
        if isinstance(report.get("metrics"), dict):
            status.metrics = {k: float(v) for k, v in report["metrics"].items() if isinstance(v, (int, float))}
        status.doing = report.get("status") if isinstance(report.get("status"), str) else None
        if isinstance(step, int) and isinstance(at, (int, float)):
            if status.step is not None and step < status.step:
                self.samples.clear()  # the rank started over (a restart resumed earlier): a new rate
            status.step = step
            self.samples.append((float(at), step))
            while len(self.samples) > 2 and self.samples[-1][0] - self.samples[0][0] > RATE_WINDOW_S:
                self.samples.popleft()

    def eta_s(self) -> float | None:
        """Seconds to the last step at the recent rate."""
        total, step = self.status.total_steps, self.status.step
        if total is None or step is None or len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        if s1 <= s0 or t1 <= t0:
            return None
        return max(0, total - step) * (t1 - t0) / (s1 - s0)

    def tick(self, now: float):
        if now - self.shown_at < SHOW_EVERY_S:
            return None
        self.shown_at = now
        status = self.status
        status.elapsed_s = now - self.began
        status.eta_s = self.eta_s()
        status.since_progress_s = None if self.progress_at is None else now - self.progress_at
        status.since_output_s = None if self.output_at is None else now - self.output_at
        self.show(status.model_copy())
        return None
