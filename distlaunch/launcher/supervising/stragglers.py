"""Stragglers: a rank whose own compute is persistently slower than the other ranks', named while the job runs.

Every rank's agent sends its progress reports (``distlaunch.progress``; the engine reports every step): among
them ``compute_s``, the median of the rank's last 50 compute times, each a step's compute outside collectives
(engine/compute.py). A slow rank makes every peer wait for it, so step times are alike on every rank and only
this tells them apart: the peers' waits are not counted, the slow rank's compute is.

A rank is named a straggler when its median is at least ``SLOW_FACTOR`` times the median of the other ranks'
medians, every one of them taken over at least ``MIN_SAMPLES`` steps (the warm-up of the first steps is behind
them), and it stayed so in every report of it over ``PERSIST_STEPS`` steps and ``PERSIST_REPORTS`` reports. The
other ranks are those of its pipeline stage (all of them without pipeline parallelism). Measured: healthy runs
on a busy machine (2 cores, a CPU-burning process beside 2 ranks) peaked at 1.1-1.3, a ``fault.factor=3`` rank
at 3.2.

``--on-straggler warn`` (the default) names it (one notice, the run report, ``distlaunch status``);
``replace`` also waits for the next checkpoint any rank reports saved (none ever reported: at once) and then stops
the attempt with the straggler's host quarantined (``Stop.quarantine``): a spare takes its place, or the job
shrinks (launcher/elastic/healing.py); a job without spares stops there.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from distlaunch import protocol as p
from distlaunch.contract.options import OnStraggler
from distlaunch.contract.report import Straggler
from distlaunch.launcher.supervising.watch import Agents, Stop, Watch

log = logging.getLogger("distlaunch")

SLOW_FACTOR = 1.5  # a straggler's median compute over the median of the other ranks'
MIN_SAMPLES = 20  # steps in every compared rank's window
PERSIST_STEPS = 20  # steps the straggler stays over SLOW_FACTOR before it is named ...
PERSIST_REPORTS = 3  # ... in at least this many reports of it in a row
RECORD_FILE = "stragglers.json"  # in the job's folder: the stragglers named so far, for 'distlaunch status'


@dataclass
class _Compute:
    """A rank's latest report, and how long it has been over the factor."""

    compute_s: float
    samples: int
    step: int
    slow_since: int | None = None  # the step of the first report of the current run over the factor
    slow_reports: int = 0


class StragglerWatch(Watch):
    """Compares the ranks' compute times as their progress reports come; names a straggler once, and with
    ``replace`` stops the attempt at the next checkpoint with its host quarantined."""

    def __init__(
        self,
        agents: Agents,
        policy: OnStraggler,
        notice: Callable[[str], None],
        attempt: int = 0,
        folder: Path | None = None,
        stages: list[list[int]] | None = None,
    ):
        self.agents, self.policy, self.notice, self.attempt, self.folder = agents, policy, notice, attempt, folder
        # A pipeline's stages do different work (the first embeds, the last computes the head and the loss): a rank
        # is compared with the ranks of its own stage only (``stages``: the plan's pp groups, one rank per stage).
        self.stage_of = {rank: i for group in stages or [] for i, rank in enumerate(group)}
        self.ranks: dict[int, _Compute] = {}
        self.found: list[Straggler] = []
        self.saved_step: int | None = None  # the newest checkpoint any rank reported saved
        self.replacing: tuple[Straggler, int | None] | None = None  # and the saved step when it was named
        self.replaced = False
        self.peak = (0.0, -1)  # the largest factor seen, and whose (for the debug notice at the end)

    def on_event(self, node_rank: int, event: dict) -> None:
        """A progress event: take each rank's report, then judge the ranks it moved."""
        reports = event.get("ranks") if event.get("ev") == p.PROGRESS else None
        if not isinstance(reports, dict):
            return
        moved = [rank for key, report in reports.items() if (rank := self.take(key, report)) is not None]
        for rank in moved:
            self.judge(rank)

    def take(self, key: object, report: object) -> int | None:
        """One rank's report (any field may be missing or wrong: that part is ignored); the rank, if it has a new
        compute time."""
        rank = int(key) if isinstance(key, str) and key.isdigit() else None
        if rank not in self.agents.host_of or not isinstance(report, dict):
            return None
        saved = report.get("saved_step")
        if _count(saved) and (self.saved_step is None or saved > self.saved_step):
            self.saved_step = saved
        compute, samples, step = report.get("compute_s"), report.get("n"), report.get("step")
        if not (_seconds(compute) and _count(samples) and _count(step)):
            return None
        known = self.ranks.get(rank)
        if known is not None and step <= known.step:
            return None  # nothing new: the same step again, or an older report
        if known is None:
            self.ranks[rank] = _Compute(compute, samples, step)
        else:
            known.compute_s, known.samples, known.step = compute, samples, step
        return rank

    def judge(self, rank: int) -> None:
        """Is ``rank`` over the factor, and has it been for long enough to be named?"""
        me = self.ranks[rank]
        stage = self.stage_of.get(rank, 0)
        others = [
            c.compute_s
            for r, c in self.ranks.items()
            if r != rank and c.samples >= MIN_SAMPLES and self.stage_of.get(r, 0) == stage
        ]
        if me.samples < MIN_SAMPLES or not others or rank in {s.rank for s in self.found}:
            return
        base = statistics.median(others)
        factor = me.compute_s / base if base > 0 else math.inf if me.compute_s > 0 else 1.0
        if factor > self.peak[0]:
            self.peak = (factor, rank)
        if factor < SLOW_FACTOR:
            me.slow_since, me.slow_reports = None, 0
            return
        me.slow_since = me.step if me.slow_since is None else me.slow_since
        me.slow_reports += 1
        if me.slow_reports >= PERSIST_REPORTS and me.step - me.slow_since >= PERSIST_STEPS:
            self.name(rank, factor)

    def name(self, rank: int, factor: float) -> None:
        """Say it once, keep it for the report and 'distlaunch status', and start replacing it if asked."""
        me = self.ranks[rank]
        found = Straggler(
            rank=rank,
            host=self.agents.host_of[rank],
            factor=round(min(factor, 1e6), 2),
            steps=me.samples,
            step=me.step,
            attempt=self.attempt,
        )
        self.found.append(found)
        then = ""
        if self.policy == "replace" and self.replacing is None:
            self.replacing = (found, self.saved_step)
            then = "; replacing its host at the next checkpoint (--on-straggler replace)"
        self.notice(f"straggler: {found.what}{then}")
        if self.folder is not None:
            record_straggler(self.folder, found, self.notice)

    def tick(self, now: float) -> Stop | None:
        """With ``replace``: once a checkpoint newer than the one at naming time is saved (or the ranks report
        none at all), stop the attempt with the straggler's host quarantined."""
        if self.replacing is None or self.replaced or self.agents.stopping or self.agents.exited:
            return None
        straggler, saved_then = self.replacing
        if saved_then is not None and self.saved_step <= saved_then:
            return None  # the engine reports 0 until its first save: a job that checkpoints always waits here
        self.replaced = True
        at = f" after the checkpoint of step {self.saved_step}" if self.saved_step is not None else ""
        why = f"straggler: rank {straggler.rank} computes {straggler.factor:.1f}× the median"
        return Stop(f"replacing straggler {straggler.host}{at}", quarantine={straggler.host: why})

    def finish(self) -> None:
        factor, rank = self.peak
        if rank >= 0:
            log.debug(f"stragglers: the largest compute ratio seen was {factor:.2f}× (rank {rank})")


def _count(value: object) -> bool:
    """A step number or a sample count: an int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


_RECORDED = TypeAdapter(list[Straggler])


def read_stragglers(folder: Path) -> list[Straggler]:
    """The stragglers a running job's launcher named so far (none when the file is missing or damaged)."""
    try:
        return _RECORDED.validate_json((folder / RECORD_FILE).read_bytes())
    except (OSError, ValidationError):
        return []


def record_straggler(folder: Path, straggler: Straggler, notice: Callable[[str], None]) -> None:
    """Add ``straggler`` to the job folder's list, replaced whole (a reader sees the old list or the new one); a
    full disk costs 'distlaunch status' the news, never the job."""
    found = [s.model_dump(mode="json") for s in [*read_stragglers(folder), straggler]]
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".stragglers-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(found, f)
        os.replace(tmp, folder / RECORD_FILE)
    except OSError as exc:
        notice(f"cannot record the straggler in {folder}: {exc}")
