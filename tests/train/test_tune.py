"""``distlaunch train --parallel auto --tune K``: what a trial is and how it is judged (pure), its refusals through
the CLI, and one real tuning of the tiny GPT on 2 gloo ranks, whose trials stay out of the job's own places."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from distlaunch.cli.auto_layout import render_choice, trial_line
from distlaunch.contract.layout import layout_spec, spelling
from distlaunch.contract.report import AttemptReport, RunReport
from distlaunch.launcher.planning.tune import TRIAL_STEPS, Trial, TuneResult, metrics_step_s, trial_sets, trial_step_s
from distlaunch.launcher.running.outcome import AttemptOutcome
from distlaunch.launcher.supervising.goodput import StepTimeline
from distlaunch.launcher.supervising.recovery import AttemptEnd
from distlaunch.training.config import load_config
from distlaunch.training.planner.cost import CostTerm, StepCost
from distlaunch.training.planner.search import LayoutCost
from tests.helpers import invoke


def one_line(result, *words: str) -> None:
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def trial(measured: float | None, code: int = 0) -> Trial:
    return Trial(parallel="dp=2", activation_checkpointing=False, predicted_s=1.0, measured_s=measured,
                 exit_code=code, folder="/x")  # fmt: skip


def test_the_job_trains_the_measured_best_else_the_fastest_predicted_that_ran():
    assert TuneResult(steps=10, folder="/x", trials=[trial(0.3), trial(0.2), trial(None, 1)]).chosen == 1
    assert TuneResult(steps=10, folder="/x", trials=[trial(None, 1), trial(None), trial(None)]).chosen == 1
    assert TuneResult(steps=10, folder="/x", trials=[trial(None, 1), trial(None, 7)]).chosen is None


def test_a_trial_trains_a_few_steps_resumes_nothing_and_saves_only_in_its_own_folder(tmp_path):
    cfg = load_config(None, ["checkpoint.dir=mine", "train.report_to=tensorboard", "checkpoint.every=2"])
    sets = trial_sets(cfg, tmp_path / "trial-1")
    seen = load_config(None, ["checkpoint.dir=mine", "train.report_to=tensorboard", "checkpoint.every=2", *sets])
    assert seen.train.steps == TRIAL_STEPS and seen.train.eval_every == 0 and seen.train.log_every == 1
    assert seen.train.report_to == [] and seen.checkpoint.resume == "never" and seen.checkpoint.every == 0
    assert seen.checkpoint.dir == str(tmp_path / "trial-1" / "checkpoints")
    assert not any(s.startswith("checkpoint.dir") for s in trial_sets(load_config(), tmp_path))  # none: none


def test_a_trials_step_is_the_median_after_the_first_else_the_launchers_timing(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"event": "start"}, *({"step": s, "step_time_s": t} for s, t in [(1, 9.0), (2, 0.3), (3, 0.1), (4, 0.2)])]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert metrics_step_s(metrics) == pytest.approx(0.2)  # step 1 carries the warm-up
    attempt = AttemptReport(restart=0, hosts=["node1"], world_size=2, layout="dp=2", step_s=1.5)
    report = RunReport(job_id="dl-0", exit_code=0, world_size=2, attempts=[attempt])
    assert trial_step_s(metrics, report) == pytest.approx(0.2)
    assert trial_step_s(tmp_path / "on-another-host.jsonl", report) == 1.5
    assert trial_step_s(metrics, report.model_copy(update={"exit_code": 1})) is None


def test_an_attempts_report_carries_the_step_time_its_ranks_reported():
    steps = StepTimeline()
    steps.take({"step": 2, "at": 100.0})
    steps.take({"step": 6, "at": 102.0})
    plan = SimpleNamespace(nodes=[SimpleNamespace(host="node1")], world_size=2, parallel="dp=2")  # what it reads
    end = AttemptEnd(plan=plan, connect=None, failures=[], hang=None, silent=[], quarantine={})
    outcome = AttemptOutcome(
        end=end, restart_count=0, dropped={}, added=[], started_at=99.0, ended_at=103.0, stopped_at=None,
        unconfirmed=[], stragglers=0, stragglers_found=[], steps=steps, saved=[], save_outcome=None,
        stopped_unsaved=False, cpus={},
    )  # fmt: skip
    assert outcome.times().report.step_s == pytest.approx(0.5)


def test_each_trial_says_predicted_against_measured_and_the_choice_says_why():
    def layout(spelled: str) -> LayoutCost:
        cost = StepCost(terms=[CostTerm(name="compute", seconds=0.2)], tokens=2048)
        return LayoutCost(parallel=spelled, activation_checkpointing=False, micro_batch_size=8, cost=cost)

    layouts = [layout("dp=2,tp=1,pp=1,zero=1,microbatches=1"), layout("dp=2,tp=1,pp=1,zero=0,microbatches=2")]
    result = TuneResult(steps=10, folder="/x", trials=[trial(0.31), trial(0.25), trial(None, 1)])
    assert trial_line(1, layouts[0], result.trials[0]) == (
        "  1. dp=2,pp=1,zero=1\n     predicted 1 s a step, measured 0.31 s"
    )
    assert trial_line(3, layouts[0], result.trials[2]).endswith("predicted 1 s a step, failed (exit 1)")
    out = io.StringIO()
    render_choice(result, 1, layouts, Console(file=out, width=200))
    assert out.getvalue().strip() == (
        "--tune: training dp=2,pp=1,zero=0,microbatches=2, the measured best (0.25 s a step, predicted 1 s; trial 1 "
        "took 1.24x as long)"
    )


@pytest.mark.parametrize(
    "args,words",
    [
        (["--parallel", "auto", "--tune", "0"], ["--tune 0: at least one layout", "--tune 1 or more"]),
        (["--tune", "2"], ["--tune 2 measures the layouts that --parallel auto proposes", "add --parallel auto"]),
        (["--parallel", "dp=2", "--tune", "2"], ["this job has no --parallel auto"]),
        (["--parallel", "auto", "--tune", "2", "--dry-run"], ["--dry-run starts none"]),
        (["--parallel", "auto", "--tune", "2", "--detach"], ["--detach leaves the job"]),
    ],
)
def test_tune_refusals_are_one_line_and_exit_2(args, words):
    one_line(invoke(["train", "-n", "2", *args]), *words)


def test_tune_2_trains_two_trials_apart_and_then_the_measured_best(tmp_path, monkeypatch):
    """The one real tuning: 2 trials of the tiny GPT on 2 gloo ranks, then 2 steps of the measured best. The job's
    checkpoint folder and metrics file get the job's own run only; its checkpoint then keeps the tuned layout."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tune").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tune"))  # the trials' folders: in this test's
    args = ["train", "-n", "2", "--parallel", "auto", "--set", "checkpoint.dir=ckpt", "--metrics-file", "m.jsonl"]
    result = invoke([*args, "--tune", "2", "--set", "train.steps=2", "--json"])
    assert result.exit_code == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    tune = report["tune"]
    assert tune["steps"] == TRIAL_STEPS and len(tune["trials"]) == 2
    for t in tune["trials"]:
        assert t["exit_code"] == 0 and t["predicted_s"] > 0 and t["measured_s"] > 0, t
        folder = Path(t["folder"])
        assert folder.parent == tmp_path / "tune" / Path(tune["folder"]).name
        assert {"metrics.jsonl", t["job_id"], "checkpoints"} <= {p.name for p in folder.iterdir()}  # + rank logs
        assert [p.name for p in (folder / "checkpoints").glob("step_*")] == [f"step_{TRIAL_STEPS:06d}"]
    chosen = tune["trials"][tune["chosen"]]
    assert chosen["measured_s"] == min(t["measured_s"] for t in tune["trials"])
    summary = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["event"] for r in summary if "event" in r] == ["start", "summary"]  # the job's run alone
    assert summary[-1]["layout"] == spelling(layout_spec(chosen["parallel"]), pipeline=False)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step_*")) == ["step_000002"]
    again = json.loads(invoke([*args, "--dry-run", "--json"]).stdout)  # a resumed auto job: the tuned degrees
    kept = layout_spec(chosen["parallel"])
    assert (again["parallel"]["dp"], again["parallel"]["tp"], again["parallel"]["zero"]) == (
        kept.dp,
        kept.tp,
        kept.zero,
    )
    assert "resuming step_000002: keeping its" in again["layouts"]["kept"]
