"""Shared pytest fixtures."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # makes ``fixtures`` importable however pytest is invoked

# The real OpenSSH test cluster (127.0.0.11 …) for multi-host tests: ``sshd_cluster`` (session scope).
from fixtures.sshd import sshd_cluster  # noqa: F401

# Job records of the jobs this suite starts go to a folder of its own, never the user's state directory
# (and two suites running at once never see each other's jobs). Set before any test starts a process.
_STATE_DIR = tempfile.mkdtemp(prefix="distlaunch-test-state-")
os.environ["DISTLAUNCH_STATE_DIR"] = _STATE_DIR


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_STATE_DIR, ignore_errors=True)
