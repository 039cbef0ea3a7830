"""What every launch of one ``distlaunch train`` command shares: the job itself, the plan ``--parallel auto``
chooses on, and each ``--tune`` trial. They differ only in their ranks' ``--set`` list, layout, metrics file and
rank-log folder; everything else is the command line's, so a trial starts exactly as the job does."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from distlaunch.backends.base import LaunchRequest
from distlaunch.cli import groups as g
from distlaunch.contract.options import Nproc
from distlaunch.launcher.planning.train import engine_program


@dataclass(frozen=True)
class TrainJob:
    """The launch options of a training command, and the engine's config file every rank loads."""

    launch: g.LaunchArgs
    config: Path | None
    nproc: Nproc
    backend: str
    gpu_memory: str | None

    def request(
        self, rank_sets: list[str], metrics: Path | None, parallel: str, log_dir: Path | None = None
    ) -> LaunchRequest:
        """The request of one launch: ranks started with ``rank_sets`` on layout ``parallel``; ``log_dir``
        replaces the command line's ``--log-dir`` (a trial's rank logs stay in its own folder)."""
        launch = self.launch
        if log_dir is not None:
            launch = dataclasses.replace(launch, values={**launch.values, "log_dir": log_dir})
        opts = launch.options(
            program=engine_program(self.config, rank_sets, metrics),
            module=True,
            nproc_per_node=self.nproc,
            parallel=parallel,
            backend=self.backend,
        )
        return launch.request(opts)
