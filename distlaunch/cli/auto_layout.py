"""``distlaunch train --parallel auto``: the layout chosen on a plan of the job's hosts, and with ``--tune K`` each
of the K fastest predicted layouts trained a few steps first, as a job of its own started as the job itself will
be (``TrainJob``) and checked by the same plan, its measured step printed beside the predicted one
(``launcher/planning/tune.py`` says what a trial is)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from distlaunch import interrupts
from distlaunch.backends.base import LaunchRequest
from distlaunch.backends.registry import select
from distlaunch.cli.layouts_render import seconds, short
from distlaunch.cli.lines import print_indented
from distlaunch.cli.render import print_json, render_report
from distlaunch.cli.train_job import TrainJob
from distlaunch.contract.report import RunReport
from distlaunch.contract.sink import JobStatus
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.layouts import layout_config, ranked_layouts, rates_for
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.planning.train import parallel_spec, train_plan
from distlaunch.launcher.planning.tune import TRIAL_STEPS, Trial, TuneResult, trial_sets, trial_step_s
from distlaunch.readable import plural
from distlaunch.training.config import TrainingConfig
from distlaunch.training.planner.search import SHOWN, LayoutCost


class TunedReport(RunReport):
    """The report of a job that ``--tune`` chose the layout of: its trials beside the run's own report."""

    tune: TuneResult


class Quiet:
    """A trial's sink: its rank output goes only to its rank logs (in the trial's folder), the terminal gets one
    line per trial."""

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None:
        """Kept in the trial's rank logs only."""

    def notice(self, text: str) -> None:
        """A trial that fails is told by its report."""

    def status(self, state: JobStatus) -> None:
        """No status line under the trial lines."""


def auto_config(
    job: TrainJob,
    cfg: TrainingConfig,
    rank_sets: list[str],
    metrics: Path | None,
    link: str | None,
    compute: str | None,
    tune: int | None,
) -> tuple[TrainingConfig, list[str], TuneResult | None]:
    """``--parallel auto``: the config and ``--set`` list of the fastest predicted layout that fits, or with
    ``--tune K`` of the measured best of the K fastest (and the trials). A tuning that trains nothing ends the
    command here (``typer.Exit``)."""
    launch = job.launch
    probe = job.request(rank_sets, metrics, "dp=auto")  # the job with any layout: its hosts, as it will plan them
    ranked, layouts = auto_layouts(probe, launch.detach, cfg, job.gpu_memory, link, compute, max(SHOWN, tune or 0))
    if not tune:
        return (*layout_config(layouts[0], ranked, job.config, rank_sets), None)
    console = None if launch.json_output else Console(stderr=True)
    tuned, stopped = tune_layouts(job, layouts[:tune], ranked, rank_sets, console)
    chosen = tuned.chosen
    if stopped is not None or chosen is None:
        raise typer.Exit(untuned(tuned, stopped, launch.json_output))
    if console is not None:
        render_choice(tuned, chosen, layouts, console)
    return (*layout_config(layouts[chosen], ranked, job.config, rank_sets), tuned)


def auto_layouts(
    probe: LaunchRequest,
    detach: bool,
    cfg: TrainingConfig,
    gpu_memory: str | None,
    link: str | None,
    compute: str | None,
    count: int,
) -> tuple[TrainingConfig, list[LayoutCost]]:
    """``--parallel auto``: the ``count`` fastest layouts that fit the hosts of ``probe`` (the job with any
    layout), planned as the job itself will be, and the config they are ranked for."""
    plan = select(probe, detach).plan(probe)
    if not isinstance(plan, LaunchPlan):
        raise UsageError(
            "--parallel auto needs the job's hosts before it starts, and this launch plans them later",
            "give the layout with --parallel (distlaunch train --parallel auto --dry-run on the hosts proposes one)",
        )
    return ranked_layouts(plan, cfg, gpu_memory, rates_for(plan, cfg, link, compute), count)


def untuned(result: TuneResult, stopped: RunReport | None, json_output: bool) -> int:
    """The end of a ``--tune`` that trains nothing: a trial was interrupted (its report, its code), or every
    trial failed (the first one's code)."""
    if stopped is not None:
        if json_output:
            print_json(tuned_report(stopped, result))
        return stopped.exit_code
    sys.stderr.write(
        f"distlaunch: --tune: every trial failed (their rank logs: {result.folder}); the job was not started\n"
    )
    return result.trials[0].exit_code


def tuned_report(report: RunReport, result: TuneResult) -> TunedReport:
    return TunedReport(**report.model_dump(), tune=result)


def run_trial(job: TrainJob, request: LaunchRequest, cfg: TrainingConfig) -> RunReport:
    """One trial: planned and checked as the job (``train_plan``: the layout, the fault, every rank's memory)."""
    backend = select(request, False)
    plan = train_plan(backend.plan(request), cfg, job.config, job.gpu_memory)
    interrupts.check()
    return backend.run(request, plan, Quiet())


def tune_layouts(
    job: TrainJob, layouts: list[LayoutCost], cfg: TrainingConfig, rank_sets: list[str], console: Console | None
) -> tuple[TuneResult, RunReport | None]:
    """Each layout's trial, in order, and the report of one that was interrupted (the tuning stops there; None:
    every trial ran). ``cfg``: the config the layouts were ranked for; ``console``: where the lines go (None:
    --json, where the result is in the report)."""
    folder = Path(tempfile.mkdtemp(prefix="distlaunch-tune-"))
    if console is not None:
        print_indented(
            console,
            f"--tune {len(layouts)}: {plural(len(layouts), 'trial')} of {TRIAL_STEPS} steps, the fastest "
            f"predicted layouts first (their metrics and rank logs in {folder})",
        )
    trials: list[Trial] = []
    for i, layout in enumerate(layouts, 1):
        here = folder / f"trial-{i}"
        trial_cfg, sets = layout_config(layout, cfg, job.config, [*rank_sets, *trial_sets(cfg, here)])
        metrics = here / "metrics.jsonl"
        report = run_trial(job, job.request(sets, metrics, parallel_spec(trial_cfg), log_dir=here), trial_cfg)
        trial = Trial(
            parallel=layout.parallel,
            activation_checkpointing=layout.activation_checkpointing,
            predicted_s=layout.cost.step_s,
            measured_s=trial_step_s(metrics, report),
            exit_code=report.exit_code,
            job_id=report.job_id,
            folder=str(here),
        )
        trials.append(trial)
        if console is not None:
            console.print(Text(trial_line(i, layout, trial)))
            if report.exit_code != 0:
                render_report(report, console)
        if report.interrupted:
            return TuneResult(steps=TRIAL_STEPS, folder=str(folder), trials=trials), report
    return TuneResult(steps=TRIAL_STEPS, folder=str(folder), trials=trials), None


def trial_line(i: int, layout: LayoutCost, trial: Trial) -> str:
    """``  1. dp=2,zero=1`` and under it ``predicted 31.2 ms a step, measured 45.1 ms`` (or how it ended)."""
    if trial.measured_s is not None:
        measured = f"measured {seconds(trial.measured_s)}"
    elif trial.exit_code != 0:
        measured = f"failed (exit {trial.exit_code})"
    else:
        measured = "not measured (no step time reached this machine)"
    return f"  {i}. {short(layout)}\n     predicted {seconds(trial.predicted_s)} a step, {measured}"


def render_choice(result: TuneResult, chosen: int, layouts: list[LayoutCost], console: Console) -> None:
    """The layout the job trains (trial ``chosen``), against the fastest predicted one."""
    best, first = result.trials[chosen], result.trials[0]
    if best.measured_s is None:
        why = "the fastest predicted that ran: no trial's step time reached this machine"
    elif chosen == 0 or first.measured_s is None:
        why = f"the measured best ({seconds(best.measured_s)} a step, predicted {seconds(best.predicted_s)})"
    else:
        why = (
            f"the measured best ({seconds(best.measured_s)} a step, predicted {seconds(best.predicted_s)}; "
            f"trial 1 took {first.measured_s / best.measured_s:.2f}x as long)"
        )
    print_indented(console, f"--tune: training {short(layouts[chosen])}, {why}")
