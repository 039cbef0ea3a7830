"""Every rank's stack, gathered from the agents: on a hang (--hang-timeout: no rank made progress for that
long), which then stops the job with a HangReport; on a long stall (--hang-report), said once and the job
running on; and when 'distlaunch stacks' asks, the job running on."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from distlaunch import protocol as p
from distlaunch.contract.report import HangReport
from distlaunch.files import os_error_words
from distlaunch.launcher.supervising.dumps import AttemptFolder
from distlaunch.launcher.supervising.requests import JobRequests
from distlaunch.launcher.supervising.stacks import summarise_stacks, write_rank_stacks
from distlaunch.launcher.supervising.watch import Agents, Stop, Watch

STACKS_TIMEOUT_S = 30.0  # how long agents get to send their ranks' stacks (after a hang, or when asked)


class StackGathering:
    """Asks every agent that still answers for its ranks' stacks, and collects them as they come."""

    def __init__(self, agents: Agents, now: float):
        self.agents = agents
        self.stacks: dict[int, dict] = {}  # rank -> its stacks event
        self.deadline = now + STACKS_TIMEOUT_S
        agents.ask_pending(p.command(p.ASK_STACKS))

    def add(self, event: dict) -> None:
        """A rank's stacks event."""
        self.stacks[event["rank"]] = event

    def complete(self, now: float) -> bool:
        """Every rank still running sent its stacks, or the agents' time is up."""
        return not self.agents.waiting_ranks() - set(self.stacks) or now >= self.deadline


def report_after(hang_report: float, hang_timeout: float) -> float:
    """When the report-only watch speaks (0: never): a --hang-timeout that stops the job first leaves it nothing."""
    return hang_report if not hang_timeout or hang_report < hang_timeout else 0.0


class HangWatch(Watch):
    """No output and no distlaunch.progress() from any rank for ``timeout`` seconds: gather every rank's stack and
    say where the ranks wait. With ``stops`` (--hang-timeout) the job then stops (``report``, exit 124); without
    (--hang-report) it runs on, and the next stall, after new progress, is reported again."""

    def __init__(
        self,
        agents: Agents,
        timeout: float,
        folder: AttemptFolder,
        notice: Callable[[str], None],
        stops: bool = True,
    ):
        self.agents, self.timeout, self.folder, self.notice = agents, timeout, folder, notice  # timeout 0: off
        self.stops = stops
        self.progress_at = time.monotonic()  # the last output or progress() of any rank
        self.gathering: StackGathering | None = None  # once a hang was seen
        self.report: HangReport | None = None  # the hang that stopped the job
        self.stalls: list[HangReport] = []  # reported with the job running on (not ``stops``)
        self.reported_for: float | None = None  # the progress_at of the stall reported last

    def on_event(self, node_rank: int, event: dict) -> None:
        """Output and progress() are progress; stacks are collected while a hang is looked at."""
        kind = event.get("ev")
        if kind in (p.OUT, p.PROGRESS):
            self.progress_at = time.monotonic()
        elif kind == p.STACKS and self.gathering is not None:
            self.gathering.add(event)

    def tick(self, now: float) -> Stop | None:
        """No progress for the timeout: ask every agent for its ranks' stacks; once they are in, stop (or, not
        ``stops``, say where the ranks wait and run on)."""
        if self.gathering is None:
            stalled = self.timeout and now - self.progress_at > self.timeout
            if stalled and not self.agents.stopping and self.progress_at != self.reported_for:
                self.notice(f"no rank made progress for {now - self.progress_at:.0f}s: gathering every rank's stack")
                self.gathering = StackGathering(self.agents, now)
                self.reported_for = self.progress_at  # one report per stall: new progress re-arms the watch
            return None
        if self.report is not None or not self.gathering.complete(now):
            return None
        if not self.stops:
            self.report_stall(self.gathering.stacks)
            return None
        self.report = self.hang_report(self.gathering.stacks)
        self.notice(f"hang: {self.report.summary}")
        if self.report.folder:
            self.notice(f"full stacks: {self.report.folder}")
        return Stop(f"the job hung (no progress for {self.timeout:g}s, --hang-timeout)")

    def report_stall(self, stacks: dict[int, dict]) -> None:
        """Say where the ranks wait, keep their stacks (``stall-N`` beside a hang's ``stacks``), and let the job
        run on."""
        self.gathering = None
        stall = self.hang_report(stacks, f"stall-{len(self.stalls) + 1}")
        self.stalls.append(stall)
        self.notice(f"stalled: {stall.summary} (no progress for {self.timeout:g}s; the job runs on)")
        if stall.folder:
            self.notice(f"full stacks: {stall.folder}")

    def hang_report(self, stacks: dict[int, dict], name: str = "stacks") -> HangReport:
        """Where the ranks wait, and every rank's full stack written in this attempt's folder ``name`` (a full
        disk costs the files, never the report)."""
        groups, text = summarise_stacks(stacks, self.agents.host_of)
        folder = None
        try:
            folder = self.folder.path(name)
            write_rank_stacks(folder, stacks, self.agents.host_of)
        except OSError as exc:
            where = f" in {folder}" if folder else ""
            self.notice(f"cannot write every rank's full stack{where}: {os_error_words(exc)}")
            folder = None
        return HangReport(timeout_s=self.timeout, summary=text, folder=str(folder) if folder else None, groups=groups)


class StacksOnRequest(Watch):
    """'distlaunch stacks' asked (launcher/supervising/requests.py): gather every rank's stack as on a hang, write a new numbered snapshot
    into the job's folder, and let the job run on."""

    def __init__(self, agents: Agents, requests: JobRequests | None, job_id: str, notice: Callable[[str], None]):
        self.agents, self.requests, self.job_id, self.notice = agents, requests, job_id, notice
        self.gathering: StackGathering | None = None  # while asked-for stacks come in

    def on_event(self, node_rank: int, event: dict) -> None:
        """Stacks are collected while a request is answered (a hang may gather at the same time)."""
        if event.get("ev") == p.STACKS and self.gathering is not None:
            self.gathering.add(event)

    def tick(self, now: float) -> Stop | None:
        """Start gathering for new requests; once the stacks are in, write the snapshot. Never stops the job."""
        requests = self.requests
        if requests is None or requests.folder is None:
            return None
        requests.poll(now)
        if self.gathering is None:
            if requests.waiting and self.agents.pending:
                requests.take()
                self.gathering = StackGathering(self.agents, now)
            return None
        if self.gathering.complete(now):
            self.write_snapshot(requests.folder, self.gathering.stacks)
            self.gathering = None
        return None

    def write_snapshot(self, folder: Path, stacks: dict[int, dict]) -> None:
        """Write the snapshot and say where the ranks are; a full disk costs the answer, never the job."""
        from distlaunch.launcher.supervising.snapshots import write_snapshot  # the job registry owns its folder's files

        try:
            snapshot = write_snapshot(folder, self.job_id, stacks, self.agents.host_of)
        except OSError as exc:
            self.notice(f"cannot write the requested stacks into {folder}: {exc}")
        else:
            self.notice(f"stacks on request: {snapshot.summary}")
            self.notice(f"full stacks: {snapshot.folder}")
