"""One attempt's watches, built together: each is told of every agent event and asked on every turn of the loop,
in the order of ``AttemptWatches.all``. A new watch is one more entry there."""

from __future__ import annotations

from dataclasses import dataclass

from distlaunch.contract.options import ExecOptions
from distlaunch.contract.sink import Sink
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.supervising.dumps import AttemptFolder, FlightRecorderDumps
from distlaunch.launcher.supervising.gate import StartGate
from distlaunch.launcher.supervising.goodput import StepTimeline
from distlaunch.launcher.supervising.hangwatch import HangWatch, StacksOnRequest, report_after
from distlaunch.launcher.supervising.heartbeats import HeartbeatWatch
from distlaunch.launcher.supervising.liveview import LiveView
from distlaunch.launcher.supervising.output import RankOutput
from distlaunch.launcher.supervising.ranklogs import RankLogs
from distlaunch.launcher.supervising.requests import ForwardSignals, JobRequests
from distlaunch.launcher.supervising.saves import SaveWatch
from distlaunch.launcher.supervising.stragglers import StragglerWatch
from distlaunch.launcher.supervising.watch import Agents, Watch


@dataclass
class AttemptWatches:
    """The watches the attempt and its report read by name, and every watch in the order the loop asks them."""

    gate: StartGate
    output: RankOutput
    heartbeats: HeartbeatWatch
    hangs: HangWatch
    steps: StepTimeline
    straggling: StragglerWatch
    saves: SaveWatch
    all: list[Watch]

    @classmethod
    def build(
        cls,
        plan: LaunchPlan,
        agents: Agents,
        restart_count: int,
        options: ExecOptions,
        sink: Sink,
        logs: RankLogs,
        requests: JobRequests | None,
    ) -> AttemptWatches:
        """The watches of one attempt of ``plan`` (its ``restart_count``-th restart) over ``agents``."""
        notice = sink.notice
        folder = AttemptFolder(plan, options.log_dir, restart_count)
        gate = StartGate(plan, agents)
        output = RankOutput(plan, sink, logs, options.local_ranks_filter)
        heartbeats = HeartbeatWatch(agents, options.heartbeat_timeout)
        hangs = HangWatch(agents, options.hang_timeout, folder, notice)
        stalls = HangWatch(agents, report_after(options.hang_report, options.hang_timeout), folder, notice, stops=False)
        steps = StepTimeline()
        job_folder = requests.folder if requests is not None else None
        stages = plan.groups.get("pp")
        straggling = StragglerWatch(agents, options.on_straggler, notice, restart_count, job_folder, stages)
        saves = SaveWatch(agents, requests, steps, notice, options.grace_period)
        # Told of every event and asked on every turn, in this order.
        every = [
            gate,
            output,
            heartbeats,
            hangs,
            stalls,
            StacksOnRequest(agents, requests, plan.job_id, notice),
            FlightRecorderDumps(folder, notice),
            steps,
            straggling,
            saves,
            ForwardSignals(agents, requests),
            LiveView(plan, sink.status),
        ]
        return cls(gate, output, heartbeats, hangs, steps, straggling, saves, every)
