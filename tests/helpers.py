"""Shared test helpers: drive the CLI in-process at a fixed width, and find a job's processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from typer.testing import CliRunner

from distlaunch.cli.app import main


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


def finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    """(returncode, stdout, stderr) of processes that run together, such as the nodes of one job. Their
    pipes are read at once, so none blocks on a full pipe while another is waited for; past the timeout
    every one still running is killed (our own children, by pid) and the test fails with their output."""
    with ThreadPoolExecutor(max_workers=len(procs)) as pool:
        readers = [pool.submit(proc.communicate) for proc in procs]
        _, late = wait(readers, timeout=timeout)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        outputs = [reader.result() for reader in readers]
    if late:
        tails = "\n".join(f"--- process {i}:\n{err[-2000:]}" for i, (_, err) in enumerate(outputs))
        raise AssertionError(f"{len(late)} of {len(procs)} processes still ran after {timeout:g}s (killed):\n{tails}")
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]
