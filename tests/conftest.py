"""Shared pytest fixtures."""

import compileall
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # makes ``fixtures`` importable however pytest is invoked

# --cpu-account: what each test costs in CPU (tests/fixtures/cpu_account.py).
# The real OpenSSH test cluster (127.0.0.11 …) for multi-host tests: ``sshd_cluster`` (session scope).
from fixtures.sshd import sshd_cluster  # noqa: F401

from tests.fixtures import cpu_account
from tests.fixtures.cpu_account import pytest_addoption  # noqa: F401

# Job records of the jobs this suite starts go to a folder of its own, never the user's state directory
# (and two suites running at once never see each other's jobs). Set before any test starts a process.
_STATE_DIR = tempfile.mkdtemp(prefix="distlaunch-test-state-")
os.environ["DISTLAUNCH_STATE_DIR"] = _STATE_DIR
# Training runs draw no loss curve here (matplotlib's import is about a second of CPU a run): a test that checks
# the curve asks for it (DISTLAUNCH_LOSS_CURVE=1).
os.environ["DISTLAUNCH_LOSS_CURVE"] = "0"
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Compile distlaunch and the tests' own modules once, before any test starts a Python process.

    Tests start many of them (the CLI, agents, ranks), each importing distlaunch. Where
    PYTHONDONTWRITEBYTECODE is set (this project's machines set it) none may write its bytecode, so each one
    compiled every module it imported again: measured on tests/launcher/test_causes.py and tests/jobs/test_jobs.py,
    83 s before, 67 s with this hook, from a checkout without __pycache__. Up-to-date files are skipped, and each file is written whole
    (atomically), so xdist workers and suites running at once do not get in each other's way.
    """
    for folder in (ROOT / "distlaunch", ROOT / "tests"):
        compileall.compile_dir(folder, quiet=2)
    cpu_account.configure(config)


# The longest files (real training, multi-node and Slurm faults: up to two minutes each) are scheduled first, so
# that none is left running on one pytest-xdist worker at the end while the other has nothing to do.
LONGEST_FIRST = (
    "tests/slurm/test_slurm_requeue.py",  # the longest of all (Slurm's time limits), mostly waiting
    "tests/engine/",
    "tests/signals/",  # every command stopped at 30 moments per signal: minutes of short runs
    "tests/train/",
    "tests/checkpoint/",
    "tests/launcher/test_pernode",
    "tests/slurm/",
    "tests/doctor/test_ground_truth",
    "tests/docs/",  # real training runs behind two examples: about three minutes in one file
)


def pytest_collection_modifyitems(session, config, items):
    """Files whose path starts with one of ``LONGEST_FIRST`` first, in that order; each file's tests together."""

    def rank(item) -> int:
        path = Path(os.path.relpath(item.path, ROOT)).as_posix()  # never raises, unlike relative_to
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the order within a file and among the rest stays as collected


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_STATE_DIR, ignore_errors=True)
