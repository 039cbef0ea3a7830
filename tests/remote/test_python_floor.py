"""The Python floor of the agent and rankboot (``distlaunch.protocol.PYTHON_FLOOR``): pyproject.toml requires
the same; a job runs with its agents and ranks on the lowest Python it names; the one below it is refused in one
line, by the agent (which the launcher reports per host) and by rankboot (a rank's own interpreter)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import distlaunch
from distlaunch.protocol import PYTHON_FLOOR
from tests.fixtures import require
from tests.helpers import run_cli
from tests.remote.test_multihost import cli_env, launch_args

REPO = Path(distlaunch.__file__).resolve().parents[1]
RANKBOOT = REPO / "distlaunch" / "rankboot.py"
BELOW = (PYTHON_FLOOR[0], PYTHON_FLOOR[1] - 1)
FLOOR = ".".join(map(str, PYTHON_FLOOR))
REFUSED = rf"distlaunch's (agent|rankboot) needs Python {re.escape(FLOOR)} or newer; \S+ is Python {BELOW[0]}\.{BELOW[1]}\.\d+"
SAY_VERSION = "import sys; print('PY %d.%d' % sys.version_info[:2], 'distlaunch' in sys.modules, flush=True)\n"


def interpreter(version: tuple[int, int]) -> str:
    """A python<major>.<minor> that runs here (installed by pyenv, or on PATH); none: skipped here, a failure in CI."""
    name = f"python{version[0]}.{version[1]}"
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for candidate in [*sorted(versions.glob(f"{version[0]}.{version[1]}.*/bin/{name}")), shutil.which(name)]:
        if candidate is None:
            continue
        says = subprocess.run([candidate, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True)
        if says.stdout.split() == [str(part).encode() for part in version]:  # not a pyenv shim of another version
            return str(candidate)
    require(f"no {name} runs here (pyenv install {version[0]}.{version[1]})")
    raise AssertionError("unreachable: require skips or fails")


def with_distlaunch(python: str, folder: Path) -> Path:
    """An interpreter that imports this checkout's distlaunch (the agent needs it; it needs nothing else)."""
    wrapper = folder / f"python-{Path(python).name}"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {python} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_the_floor_is_the_python_pyproject_requires():
    requires = re.search(r'^requires-python = "(.*)"$', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert requires and requires.group(1) == f">={FLOOR}"


def test_rankboot_runs_on_the_floor_without_distlaunch_and_refuses_the_python_below_in_one_line(tmp_path):
    script = tmp_path / "say.py"
    script.write_text(SAY_VERSION)
    ran = subprocess.run([interpreter(PYTHON_FLOOR), str(RANKBOOT), str(script)], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout == f"PY {FLOOR} False\n", ran.stderr  # nothing of distlaunch loaded
    refused = subprocess.run([interpreter(BELOW), str(RANKBOOT), str(script)], capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout
    assert re.fullmatch(REFUSED + "\n", refused.stderr), refused.stderr


def test_the_agent_refuses_the_python_below_the_floor_in_one_line_before_its_hello(tmp_path):
    python = with_distlaunch(interpreter(BELOW), tmp_path)
    agent = subprocess.run([str(python), "-m", "distlaunch.agent"], input="", capture_output=True, text=True)
    assert agent.returncode == 1 and agent.stdout == "", agent.stdout  # no hello: no launcher takes it for an agent
    assert re.fullmatch(REFUSED + "\n", agent.stderr), agent.stderr


def test_a_job_runs_its_agents_and_ranks_on_the_floor_python(sshd_cluster, tmp_path):
    script = tmp_path / "say.py"
    script.write_text(SAY_VERSION)
    python = with_distlaunch(interpreter(PYTHON_FLOOR), tmp_path)
    r = run_cli(*launch_args(sshd_cluster, "--remote-python", str(python), str(script)), env=cli_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(f"PY {FLOOR} False") == 6, r.stdout  # every rank, through rankboot, on the floor


def test_a_job_whose_hosts_have_only_an_older_python_is_refused_in_one_line_per_host(sshd_cluster, tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "mark.py"
    script.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    python = with_distlaunch(interpreter(BELOW), tmp_path)
    r = run_cli(*launch_args(sshd_cluster, "--remote-python", str(python), str(script)), env=cli_env(), cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    for host in ("node1", "node2", "node3"):
        line = next((line for line in r.stderr.splitlines() if f"{host}: distlaunch's agent" in line), "")
        assert re.search(rf"{host}: {REFUSED} \(hint: point --remote-python at Python {FLOOR} or newer", line), r.stderr
    assert "Traceback" not in r.stderr and not marker.exists()  # no rank ran anywhere


def test_ranks_given_an_older_python_fail_with_its_one_line(tmp_path):
    script = tmp_path / "say.py"
    script.write_text(SAY_VERSION)
    r = run_cli("run", "-n", "1", "--json", "--python", interpreter(BELOW), str(script), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    (failure,) = json.loads(r.stdout)["failures"]
    assert any(re.fullmatch(REFUSED, line) for line in failure["tail"]), failure
