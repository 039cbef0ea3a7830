"""What every attempt of one job is supervised with, handed from ``execute`` to each ``Attempt`` and its
collaborators."""

from __future__ import annotations

from dataclasses import dataclass

from distlaunch.contract.options import ExecOptions
from distlaunch.contract.sink import Sink
from distlaunch.launcher.running.signals import SignalTrap
from distlaunch.launcher.supervising.ranklogs import RankLogs
from distlaunch.launcher.supervising.requests import JobRequests, StopRequest


@dataclass
class JobContext:
    """One job's supervision, the same for each of its attempts: how it is supervised (``options``), where its
    output goes (``sink``, ``logs``), the signals trapped while it runs, what commands ask of it (``requests``)
    and a stop distlaunch itself may ask (``stop_request``)."""

    options: ExecOptions
    sink: Sink
    interrupts: SignalTrap
    logs: RankLogs
    requests: JobRequests | None = None
    stop_request: StopRequest | None = None
