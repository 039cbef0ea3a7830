"""Shared pytest fixtures."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # makes ``fixtures`` importable however pytest is invoked

# The real OpenSSH test cluster (127.0.0.11 …) for multi-host tests: ``sshd_cluster`` (session scope).
from fixtures.sshd import sshd_cluster  # noqa: E402,F401
