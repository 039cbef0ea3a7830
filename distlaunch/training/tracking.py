"""``train.report_to`` checked before any rank starts, without importing a tracker: TensorBoard needs a folder
for its event files, and each tracker its package. The writers themselves are the engine's
(``distlaunch.engine.tracking``), which checks the same way on rank 0."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from distlaunch.errors import UsageError
from distlaunch.extras import install_command

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # what each tracker's writer imports
TENSORBOARD_FOLDER = "tensorboard"  # beside metrics.jsonl


def package_problem(package: str, load: bool) -> str | None:
    """Why ``package`` cannot be used, or None. ``load``: import it (the rank that will use it); else only find
    it, as the launcher does without paying for the import."""
    try:
        if load:
            importlib.import_module(package)
        elif importlib.util.find_spec(package) is None:
            return f"the {package} package is not installed"
    except ModuleNotFoundError as err:
        if err.name == package:
            return f"the {package} package is not installed"
        return f"the {package} package cannot be imported ({err})"
    except Exception as err:  # a broken install fails in its own ways (a dependency of another version)
        return f"the {package} package cannot be imported ({type(err).__name__}: {err})"
    return None


def check_packages(report_to: list[str], load: bool = True) -> None:
    """UsageError, in one line, for a tracker whose package is missing (``load``: see ``package_problem``)."""
    for tracker in report_to:
        problem = package_problem(PACKAGES[tracker], load)
        if problem:
            raise UsageError(
                f"train.report_to names {tracker}, but {problem}", f"install it: {install_command('track')}"
            )


def check_event_folder(report_to: list[str], metrics_file: Path | None) -> None:
    """UsageError, in one line, for TensorBoard in a job with no folder for its event files."""
    if "tensorboard" in report_to and metrics_file is None:
        raise UsageError(
            "train.report_to names tensorboard, but the job has no log folder for its event files",
            f"give distlaunch train --log-dir DIR (the event files go to DIR/{TENSORBOARD_FOLDER}/, beside metrics.jsonl) "
            "or --metrics-file PATH",
        )
