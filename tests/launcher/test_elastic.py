"""The rules of a job with spares (``--nnodes MIN:MAX``), on the models the launcher itself builds: which
failure points at a host, who replaces it, how far the job shrinks, and what a fault cost. The real runs over
SSH are tests/checkpoint/test_spares.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distlaunch.contract.layout import Layout
from distlaunch.contract.options import NodeRange
from distlaunch.contract.report import AttemptReport, RankExit
from distlaunch.errors import HostError, UsageError
from distlaunch.launcher.elastic.healing import Pool, fitted, host_fault, node_range, split_spares
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.supervising.goodput import AttemptTimes, StepTimeline, account
from tests.helpers import invoke


def hosts(*names: str, slots: int = 2) -> list[HostSlots]:
    return [HostSlots(host=name, slots=list(range(slots))) for name in names]


def test_nnodes_reads_a_range_or_one_count():
    assert node_range("2:4") == NodeRange(min_nodes=2, max_nodes=4)
    assert node_range("3") == NodeRange(min_nodes=3, max_nodes=3)
    for bad in ("0:2", "3:2", "a:b", ":"):
        with pytest.raises(UsageError, match="--nnodes"):
            node_range(bad)


def test_the_hosts_after_max_are_spares_and_min_must_be_there():
    active, spares = split_spares(hosts("a", "b", "c", "d"), NodeRange(min_nodes=1, max_nodes=3), "h")
    assert [h.host for h in active] == ["a", "b", "c"] and [h.host for h in spares] == ["d"]
    with pytest.raises(UsageError, match="needs at least 5 hosts, but h has 4"):
        split_spares(hosts("a", "b", "c", "d"), NodeRange(min_nodes=5, max_nodes=5), "h")


@pytest.mark.parametrize(
    "failure, points_at_host",
    [
        (RankExit(rank=1, host="b", exit_code=137, signal="SIGKILL"), "killed by SIGKILL"),
        (RankExit(rank=1, host="b", exit_code=139, signal="SIGSEGV"), "killed by SIGSEGV"),
        (RankExit(rank=1, host="b", exit_code=255), "lost contact"),
        (RankExit(rank=1, host="b", exit_code=3), "lost the launcher"),
        (RankExit(rank=1, host="b", exit_code=1, tail=["RuntimeError: CUDA error: an illegal memory access"]), "GPU"),
        (RankExit(rank=1, host="b", exit_code=1, tail=["NVRM: Xid (PCI:0000:3b:00): 79"]), "Xid"),
        (RankExit(rank=1, host="b", exit_code=1, tail=["ValueError: bad batch"]), None),
        (RankExit(rank=1, host="b", exit_code=42), None),
        (RankExit(rank=1, host="b", exit_code=143, signal="SIGTERM"), None),
    ],
)
def test_which_failures_point_at_their_host(failure, points_at_host):
    why = host_fault(failure)
    assert (why is None) if points_at_host is None else (points_at_host in why)


def test_a_spare_takes_the_failed_hosts_place_and_without_one_the_job_shrinks_to_min():
    pool = Pool(active=hosts("a", "b", "c"), spares=hosts("d"), nodes=NodeRange(min_nodes=2, max_nodes=3))
    assert pool.drop({"b": "x"}) == ["d"]
    assert [h.host for h in pool.active] == ["a", "d", "c"]  # in b's place: a and c keep their ranks
    assert pool.drop({"c": "y"}) == [] and [h.host for h in pool.active] == ["a", "d"]
    with pytest.raises(HostError, match=r"only 1 healthy host left, fewer than --nnodes 2:3: b \(x\), c \(y\)"):
        pool.drop({"a": "z"})


def test_a_spare_that_fails_is_quarantined_too():
    pool = Pool(active=hosts("a", "b"), spares=hosts("c", "d"), nodes=NodeRange(min_nodes=2, max_nodes=2))
    assert pool.drop({"b": "x"}) == ["c"]
    assert pool.drop({"c": "failed preflight"}) == ["d"]
    assert [h.host for h in pool.active] == ["a", "d"] and set(pool.quarantined) == {"b", "c"}


def test_shrinking_keeps_tp_and_pp_and_takes_the_largest_dp_the_job_can_train():
    layout = Layout(dp=4, tp=2, pp=1)
    three = hosts("a", "b", "c")  # 6 slots: dp=3 fits the slots, but say the global batch does not split in 3
    kept, shrunk = fitted(three, layout, lambda lay: "batch 16 over dp=3" if lay.dp == 3 else None)
    assert (shrunk.dp, shrunk.tp, shrunk.pp) == (2, 2, 1) and [h.host for h in kept] == ["a", "b"]
    kept, shrunk = fitted(hosts("a", "b", "c", "d", "e"), layout, lambda lay: None)
    assert shrunk.dp == 4 and len(kept) == 4  # never past the job's own dp: a spare left over stays idle
    with pytest.raises(HostError, match="cannot hold a layout with tp=2, pp=1"):
        fitted(hosts("a", slots=1), layout, lambda lay: None)


def attempt(restart: int, started: float, ended: float, steps: list[tuple[int, float]], saved: int | None):
    timeline = StepTimeline()
    for step, at in steps:
        timeline.take({"step": step, "at": at, "saved_step": saved})
    report = AttemptReport(
        restart=restart, hosts=["a"], world_size=1, layout="dp=1", started_at=started, ended_at=ended
    )
    return timeline, report


def test_goodput_splits_a_faults_cost_and_counts_only_kept_steps():
    # attempt 0: steps 1-12 at 1 s each (step s done at 10+s), checkpoint at 10, fails at 22.5, noticed at 23,
    # stopped at 24; attempt 1 starts at 26, resumes after step 10, step 11 done at 30, step 20 at 39.
    t0, r0 = attempt(0, 10.0, 24.0, [(1, 11.0), (12, 22.0)], saved=10)
    t1, r1 = attempt(1, 26.0, 39.5, [(11, 30.0), (20, 39.0)], saved=20)
    goodput = account([AttemptTimes(r0, t0, 22.5, 23.0), AttemptTimes(r1, t1, None, None)], wall_s=30.0)
    (fault,) = goodput.faults
    assert (fault.detection_s, fault.stopping_s, fault.restart_s, fault.startup_s) == (0.5, 1.0, 2.0, 4.0)
    assert (fault.recomputed_steps, fault.recomputed_s) == (2, 2.0)
    assert goodput.productive_s == 20.0  # steps 1-10 of attempt 0 and 11-20 of attempt 1, 1 s each
    assert goodput.ettr == round(20.0 / 30.0, 4)


def test_the_dry_run_shows_the_spares():
    hostfile = str(Path(__file__).resolve().parents[2] / "hostfiles" / "mixed.txt")
    plan = json.loads(invoke(["run", "-H", hostfile, "--nnodes", "1:1", "--dry-run", "--json", "x.py"]).stdout)
    assert plan["nnodes"] == 1 and plan["spares"]["min_nodes"] == 1 and len(plan["spares"]["hosts"]) >= 1
    text = invoke(["run", "-H", hostfile, "--nnodes", "1:1", "--dry-run", "x.py"]).stdout
    assert "spares: " + plan["spares"]["hosts"][0]["host"] in text
