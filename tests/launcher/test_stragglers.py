"""Straggler detection's parts, each with real inputs: a rank's progress file as ``distlaunch.progress`` writes it,
the agent reading real ranks' files (a corrupt one among them), and the launcher's ``StragglerWatch`` fed the
progress events agents send. The engine's own runs (a slow rank named, a busy healthy run not) are in
tests/train/test_stragglers.py."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import distlaunch
from distlaunch.agent.channel import Events
from distlaunch.agent.liveness import Progress
from distlaunch.agent.rankenv import rank_vars
from distlaunch.agent.ranks import Rank
from distlaunch.agent.scratch import make_scratch
from distlaunch.contract.layout import layout_spec
from distlaunch.contract.report import Straggler
from distlaunch.launcher.planning.hostfile import parse_hostfile_text
from distlaunch.launcher.planning.plan import LaunchPlan, LaunchSpec, build_plan
from distlaunch.launcher.supervising.stragglers import (
    MIN_SAMPLES,
    RECORD_FILE,
    StragglerWatch,
    read_stragglers,
    record_straggler,
)
from distlaunch.launcher.supervising.watch import Agents

ROOT = Path(__file__).resolve().parents[2]

# -- the rank's side: distlaunch.progress -------------------------------------------------------------------------


def test_a_progress_report_is_the_median_of_the_window_written_whole(tmp_path, monkeypatch):
    path = tmp_path / "rank0.progress"
    monkeypatch.setenv("DISTLAUNCH_PROGRESS_FILE", str(path))
    reports = distlaunch._ProgressFile()
    for step in range(1, 61):  # 60 steps: the window keeps the last 50 (11..60)
        reports.note(step, step / 100, None)
    first = json.loads(path.read_text())
    assert first["step"] == 1 and first["n"] == 1  # the first call writes; the next ones wait for 0.5 s
    reports.note(61, 0.61, 40)  # a checkpoint goes out at once
    report = json.loads(path.read_text())
    assert (report["step"], report["n"], report["saved_step"]) == (61, 50, 40)
    assert report["compute_s"] == pytest.approx(0.365)  # median of 0.12..0.61
    assert abs(report["at"] - time.time()) < 5
    assert os.listdir(tmp_path) == ["rank0.progress"]  # no temporary file left beside it


def test_progress_never_raises_and_a_plain_call_still_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAUNCH_PROGRESS_FILE", str(tmp_path / "gone" / "rank0.progress"))
    distlaunch.progress(step=1, compute_s=0.1)  # a folder that is not there: nothing written, nothing raised
    distlaunch.progress(step="x", compute_s=float("nan"), saved_step=object())
    monkeypatch.setenv("DISTLAUNCH_PROGRESS_FILE", str(tmp_path / "rank0.progress"))
    reports = distlaunch._ProgressFile()
    reports.note(None, None, None)  # what an older script's distlaunch.progress() does
    assert json.loads((tmp_path / "rank0.progress").read_text())["compute_s"] is None


# -- the agent's side: Progress reads the files its ranks write -------------------------------------------------

RANK_SCRIPT = """
import os, sys
import distlaunch
if sys.argv[1] == "report":
    distlaunch.progress(step=7, compute_s=0.25, saved_step=5)
else:  # a file cut short, as a full disk or a killed writer leaves it
    open(os.environ["DISTLAUNCH_PROGRESS_FILE"], "w").write('{"step": 7, "comp')
"""


def _ranks(progress: Progress, how: list[str]) -> list[Rank]:
    """Real rank processes, each writing its progress file its way, run to their end."""
    ranks = []
    for rank, kind in enumerate(how):
        env = {**os.environ, "PYTHONPATH": str(ROOT), **rank_vars(rank, [sys.executable], progress.scratch)}
        proc = subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, kind], env=env, stdout=subprocess.PIPE)
        ranks.append(Rank({"rank": rank, "env": env}, proc))
    for rank in ranks:
        rank.proc.communicate(timeout=60)
    return ranks


def test_the_agent_sends_each_report_once_and_a_corrupt_file_as_a_plain_mark(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = io.StringIO()
    progress = Progress(make_scratch(), Events(out))
    ranks = _ranks(progress, ["report", "corrupt"])
    progress.check(ranks)
    progress.check(ranks)  # within a tenth of a second: nothing looked at
    progress.looked = progress.sent = 0.0
    progress.check(ranks)  # a second later, nothing changed: nothing sent
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(events) == 1 and events[0]["ev"] == "progress"
    assert list(events[0]["ranks"]) == ["0"]  # rank 1's cut file is left out, its call still counts
    assert {k: v for k, v in events[0]["ranks"]["0"].items() if k != "at"} == {
        "step": 7,
        "compute_s": 0.25,
        "n": 1,
        "saved_step": 5,
        "save_s": None,  # no save timed (distlaunch.progress(save_s=...))
        "answered": 0,  # no save request answered (distlaunch.checkpoint_requested())
        "answered_step": None,
        "total_steps": None,  # what the status line shows: nothing said
        "metrics": {},
        "status": None,
    }


def test_a_new_checkpoint_goes_out_at_once_and_a_plain_step_within_the_second(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = io.StringIO()
    progress = Progress(make_scratch(), Events(out))
    env = rank_vars(0, [sys.executable], progress.scratch)
    monkeypatch.setenv("DISTLAUNCH_PROGRESS_FILE", env["DISTLAUNCH_PROGRESS_FILE"])
    reports, ranks = distlaunch._ProgressFile(), [SimpleNamespace(rank=0)]

    def sent_steps() -> list[tuple[int, int | None]]:
        events = [json.loads(line) for line in out.getvalue().splitlines()]
        return [(e["ranks"]["0"]["step"], e["ranks"]["0"]["saved_step"]) for e in events]

    def step(n: int, saved: int | None = None) -> None:
        reports.written_at = -math.inf  # past the rank's own tenth of a second between writes
        reports.note(n, 0.1, saved)
        progress.looked = 0.0  # the agent's next look, a tenth of a second later
        progress.check(ranks)

    step(1)
    assert sent_steps() == [(1, None)]  # the first report
    step(2)
    step(3)
    assert sent_steps() == [(1, None)]  # plain steps wait for the second
    step(4, saved=4)
    assert sent_steps() == [(1, None), (4, 4)]  # a save does not
    step(5, saved=4)
    assert sent_steps() == [(1, None), (4, 4)]
    progress.sent = 0.0  # a second later
    step(6, saved=4)
    assert sent_steps() == [(1, None), (4, 4), (6, 4)]


# -- the launcher's side: StragglerWatch --------------------------------------------------------------------------


def _plan(parallel: str | None = None) -> LaunchPlan:
    """Ranks 0-1 on node1, 2-3 on node2."""
    hosts = parse_hostfile_text("node1 slots=2\nnode2 slots=2")
    spec = LaunchSpec(
        hosts=hosts,
        command=["python3", "train.py"],
        parallel=layout_spec(parallel),
        master_addr="10.0.0.1",
        master_port=29500,
        job_id="dl-stragglers",
        local_hosts=[],
    )
    return build_plan(spec)


def _agents() -> Agents:
    return Agents(_plan())


def _event(step: int, compute: dict[int, float], saved_step: int | None = None) -> dict:
    """A progress event as an agent sends it: each rank's median compute over its last (up to 50) steps."""
    report = {"n": min(step, 50), "saved_step": saved_step, "at": time.time()}
    return {"ev": "progress", "ranks": {str(r): {**report, "step": step, "compute_s": c} for r, c in compute.items()}}


class Notices(list):
    def __call__(self, text: str) -> None:
        self.append(text)


def _feed(watch: StragglerWatch, steps: range, compute: dict[int, float], saved_step: int | None = None) -> None:
    for step in steps:
        watch.on_event(0, _event(step, compute, saved_step))


def test_ranks_within_the_factor_of_each_other_are_never_named():
    notices = Notices()
    watch = StragglerWatch(_agents(), "warn", notices)
    for step in range(1, 400, 15):  # a report a second, ~15 steps apart; the slowest 1.4x the others, always
        _feed(watch, range(step, step + 1), {0: 0.10, 1: 0.12, 2: 0.14, 3: 0.095})
    assert (watch.found, notices) == ([], [])
    assert watch.tick(time.monotonic()) is None


def test_a_rank_computing_twice_as_long_is_named_once_after_it_persisted():
    notices = Notices()
    watch = StragglerWatch(_agents(), "warn", notices)
    _feed(watch, range(1, MIN_SAMPLES), {0: 0.1, 1: 0.1, 2: 0.5, 3: 0.1})
    assert watch.found == []  # the warm-up: too few steps in every window to compare
    _feed(watch, range(MIN_SAMPLES, MIN_SAMPLES + 10), {0: 0.1, 1: 0.1, 2: 0.21, 3: 0.1})
    assert watch.found == []  # slow, but not for long enough yet
    _feed(watch, range(MIN_SAMPLES + 10, 200, 10), {0: 0.1, 1: 0.1, 2: 0.21, 3: 0.1})
    assert [(s.rank, s.host, s.factor, s.steps) for s in watch.found] == [(2, "node2", 2.1, 40)]
    assert notices == ["straggler: rank 2 on node2 computes 2.1× the median of the other ranks over its last 40 steps"]
    assert watch.tick(time.monotonic()) is None  # warn: the job goes on


def test_a_rank_that_recovers_before_it_persisted_is_not_named():
    watch = StragglerWatch(_agents(), "warn", Notices())
    _feed(watch, range(30, 45, 7), {0: 0.1, 1: 0.1, 2: 0.3, 3: 0.1})
    _feed(watch, range(45, 60, 7), {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1})
    _feed(watch, range(60, 75, 7), {0: 0.1, 1: 0.1, 2: 0.3, 3: 0.1})  # the run over the factor starts again
    assert watch.found == []


def test_pipeline_stages_are_compared_within_their_stage():
    plan = _plan("dp=2,pp=2")
    assert plan.groups["pp"] == [[0, 2], [1, 3]]  # stage 0: ranks 0-1, stage 1: ranks 2-3
    notices = Notices()
    watch = StragglerWatch(Agents(plan), "warn", notices, stages=plan.groups["pp"])
    _feed(watch, range(30, 200, 10), {0: 0.1, 1: 0.1, 2: 0.25, 3: 0.25})  # the last stage's head and loss
    assert watch.found == []
    _feed(watch, range(200, 300, 10), {0: 0.1, 1: 0.1, 2: 0.25, 3: 0.5})
    assert notices == ["straggler: rank 3 on node2 computes 2.0× the median of the other ranks over its last 50 steps"]


def test_reports_that_are_not_reports_are_ignored():
    watch = StragglerWatch(_agents(), "warn", Notices())
    bad = [
        {"ev": "progress"},  # an older agent's: no ranks
        {"ev": "progress", "ranks": ["0"]},
        {"ev": "progress", "ranks": {"9": {"step": 40, "compute_s": 9.0, "n": 50}}},  # no such rank
        {"ev": "progress", "ranks": {"x": {"step": 40, "compute_s": 9.0, "n": 50}}},
        {"ev": "progress", "ranks": {"2": {"step": True, "compute_s": 9.0, "n": 50}}},
        {"ev": "progress", "ranks": {"2": {"step": 40, "compute_s": "slow", "n": 50}}},
        {"ev": "progress", "ranks": {"2": {"step": 40, "compute_s": float("inf"), "n": 50}}},
        {"ev": "progress", "ranks": {"2": "garbage"}},
        {"ev": "out", "rank": 2, "line": "compute_s 9"},
    ]
    for step in range(30, 200, 10):
        for event in bad:
            watch.on_event(0, event)
        _feed(watch, range(step, step + 1), {0: 0.1, 1: 0.1, 3: 0.1})
    assert watch.found == [] and 2 not in watch.ranks


def test_replace_waits_for_the_next_checkpoint_then_quarantines_the_host():
    notices = Notices()
    watch = StragglerWatch(_agents(), "replace", notices)
    _feed(watch, range(30, 80, 10), {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.3}, saved_step=20)
    assert [s.rank for s in watch.found] == [3]
    assert notices[0].endswith("replacing its host at the next checkpoint (--on-straggler replace)")
    assert watch.tick(time.monotonic()) is None  # step 20's checkpoint is older than the naming
    _feed(watch, range(80, 81), {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.3}, saved_step=80)
    stop = watch.tick(time.monotonic())
    assert stop is not None and stop.reason == "replacing straggler node2 after the checkpoint of step 80"
    assert stop.quarantine == {"node2": "straggler: rank 3 computes 3.0× the median"}
    assert watch.tick(time.monotonic()) is None  # once


def test_replace_without_checkpoints_reported_stops_at_once():
    watch = StragglerWatch(_agents(), "replace", Notices())
    _feed(watch, range(30, 80, 10), {0: 0.1, 1: 0.4, 2: 0.1, 3: 0.1})
    stop = watch.tick(time.monotonic())
    assert stop is not None and stop.quarantine == {"node1": "straggler: rank 1 computes 4.0× the median"}


def test_the_job_folder_keeps_every_straggler_named_and_a_damaged_list_reads_as_none(tmp_path):
    notices = Notices()
    first = Straggler(rank=1, host="node1", factor=2.1, steps=50, step=60)
    record_straggler(tmp_path, first, notices)
    record_straggler(tmp_path, first.model_copy(update={"rank": 3, "attempt": 1}), notices)
    assert [(s.rank, s.attempt) for s in read_stragglers(tmp_path)] == [(1, 0), (3, 1)]
    assert sorted(os.listdir(tmp_path)) == [RECORD_FILE] and notices == []
    (tmp_path / RECORD_FILE).write_text('[{"rank": 1')
    assert read_stragglers(tmp_path) == []
    record_straggler(tmp_path / "gone", first, notices)  # a folder that is not there: one notice, no exception
    assert len(notices) == 1 and "cannot record the straggler" in notices[0]
