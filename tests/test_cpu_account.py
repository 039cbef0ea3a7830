"""``pytest --cpu-account`` counts what a test costs: its own CPU, the processes it started, the servers it used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """\
from tests.fixtures import cpu_account
from tests.fixtures.cpu_account import pytest_addoption

def pytest_configure(config):
    cpu_account.configure(config)
"""

TESTS = """\
import subprocess, sys, time

from tests.fixtures.cpu_account import watch_daemon

BURN = "import time\\nend = time.process_time() + %s\\nwhile time.process_time() < end: pass\\n"
# A server that outlives the test that uses it, as the suite's sshd does: each line it reads is a job that it runs
# as its own child and reaps, so the job's time is the server's, never the test process's.
SERVER = (
    "import subprocess, sys\\n"
    "for line in sys.stdin:\\n"
    "    subprocess.run([sys.executable, '-c', 'import time\\\\nend = time.process_time() + ' + line.strip()"
    " + '\\\\nwhile time.process_time() < end: pass'])\\n"
    "    print('done', flush=True)\\n"
)
servers = []


def test_in_a_child():
    subprocess.run([sys.executable, "-c", BURN % 1.0], check=True)


def test_in_itself():
    exec(BURN % 0.5)


def test_in_a_server():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    servers.append(server)
    watch_daemon(server.pid)
    server.stdin.write("0.8\\n")
    server.stdin.flush()
    assert server.stdout.readline() == "done\\n"


def test_idle():
    time.sleep(0.2)
    for server in servers:  # its end: the job it ran was counted once, to the test it ran for
        server.stdin.close()
        server.wait()
"""


def test_the_account_names_each_tests_cpu_with_its_children_and_servers(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_costs.py").write_text(TESTS)
    out = tmp_path / "cpu.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--cpu-account={out}", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    cost = {nodeid.split("::")[-1]: seconds for nodeid, seconds in json.loads(out.read_text()).items()}
    assert cost["test_in_a_child"] >= 0.9, cost  # a child it ran and reaped
    assert cost["test_in_itself"] >= 0.45, cost
    assert cost["test_in_a_server"] >= 0.7, cost  # a watched server ran it
    assert cost["test_idle"] < 0.2, cost  # the server's end: its job is not counted again
    assert "CPU account" in run.stdout and "costliest tests" in run.stdout, run.stdout
    first = next(line for line in run.stdout.splitlines() if line.strip().endswith("test_in_a_child"))
    assert float(first.split()[0]) >= 0.9, run.stdout
