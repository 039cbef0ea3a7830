"""Shared test helpers: drive the CLI in-process at a fixed width, and find a job's processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from typer.testing import CliRunner

from distlaunch.cli.app import main

T = TypeVar("T")


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    """Run ``distlaunch ARGS`` in-process through CliRunner's isolation (fixed 100-column terminal)."""
    runner = CliRunner()
    with runner.isolation(env={"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb", **(env or {})}) as (out, err, _):
        code = main(args)
        sys.stdout.flush()
        sys.stderr.flush()
        return Result(code, out.getvalue().decode(), err.getvalue().decode())


def distlaunch_cmd(*args: str) -> list[str]:
    """The real console entry point, as a user runs it."""
    return [sys.executable, "-m", "distlaunch", *args]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc/*/stat: not every kernel has
    /proc/PID/task/TID/children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after "(comm) state"
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def pids_with_env(name: str, value: str) -> list[int]:
    """Processes whose environment has NAME=VALUE (how tests find a job's processes; never by name)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def left_behind(name: str, value: str, timeout: float) -> list[str]:
    """The processes with NAME=VALUE in their environment still there after ``timeout`` seconds, each as
    "pid command (state)" so that a failure says what outlived the job; empty once all are gone."""
    wait_until(lambda: not pids_with_env(name, value), timeout)
    found = []
    for pid in pids_with_env(name, value):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # ended while we looked
        found.append(f"{pid} {command} ({state})")
    return found


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or timeout; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def run_cli(*args: str, timeout: float = 120, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess and capture its output."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", **(env or {})}
    return subprocess.run(distlaunch_cmd(*args), capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)


class PortTaken(Exception):
    """A port that free_port found free was bound by someone else before our process bound it."""


def finish(procs: list[subprocess.Popen], timeout: float = 240, port_race: bool = False) -> list[tuple[int, str, str]]:
    """(returncode, stdout, stderr) of processes that run together, such as the nodes of one job. Their
    pipes are read at once, so none blocks on a full pipe while another is waited for; past the timeout
    every one still running is killed (our own children, by pid) and the test fails with their output.

    ``port_race``: a process that ended saying a port is already in use ends the others at once and raises
    PortTaken (see ``on_fresh_ports``), instead of leaving them to wait for a node that will never come.
    """
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=len(procs)) as pool:
        readers = [pool.submit(proc.communicate) for proc in procs]
        late, taken = set(readers), False
        while late and not taken and time.monotonic() < deadline:
            done, late = wait(late, timeout=deadline - time.monotonic(), return_when=FIRST_COMPLETED)
            taken = port_race and any(PORT_TAKEN in reader.result()[1] for reader in done)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        outputs = [reader.result() for reader in readers]
    if taken:
        raise PortTaken(next(err for _, err in outputs if PORT_TAKEN in err))
    if late:
        tails = "\n".join(f"--- process {i}:\n{err[-2000:]}" for i, (_, err) in enumerate(outputs))
        raise AssertionError(f"{len(late)} of {len(procs)} processes still ran after {timeout:g}s (killed):\n{tails}")
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]


PORT_TAKEN = "already in use"


def on_fresh_ports(job: Callable[[], T], attempts: int = 3) -> T:
    """Run ``job`` (which picks its ports with free_port and finishes with ``port_race=True``) again on new
    ports when another process took one in the second between free_port and the bind: a port that is free
    when asked is not reserved. PyTorch's own distributed tests retry this race the same way."""
    for _ in range(attempts - 1):
        with contextlib.suppress(PortTaken):
            return job()
    return job()


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent, or for init, to reap it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
