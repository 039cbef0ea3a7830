"""What a rank runs, checked before any rank starts: the working directory, the ranks' Python and the
program are refused in one line (exit 2) instead of failing on every rank; what a failing rank shows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import distlaunch_cmd, invoke, run_cli, wait_until


@pytest.fixture
def work(tmp_path):
    """A working directory with a script, a package and shell scripts; the launcher starts elsewhere."""
    (tmp_path / "hello.py").write_text("print('hello from the workdir')\n")
    (tmp_path / "sleepy.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "boom.py").write_text("def fail():\n    raise ValueError('boom')\n\n\nfail()\n")
    (tmp_path / "broken.py").write_text("x = (\n")
    (tmp_path / "localmod.py").write_text("print('module ran')\n")
    (tmp_path / "adir").mkdir()
    wrap = tmp_path / "wrap.sh"
    wrap.write_text('#!/bin/sh\necho "shell rank $RANK of $WORLD_SIZE"\n')
    wrap.chmod(0o755)
    (tmp_path / "noexec.sh").write_text("#!/bin/sh\necho never\n")
    return tmp_path


def dry_run(*args: str):
    return invoke(["run", "-n", "2", "--dry-run", "--json", *args])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--workdir", "/nonexistent/dir", "hello.py"], "working directory '/nonexistent/dir' does not exist"),
        (["--workdir", "{work}/hello.py", "hello.py"], "working directory '{work}/hello.py' is not a directory"),
        (["--workdir", "{work}", "missing.py"], "script 'missing.py' does not exist (ranks start in {work})"),
        (["--workdir", "{work}", "adir"], "script 'adir' is a directory without a __main__.py"),
        (["--workdir", "{work}", "noexec.sh"], "script 'noexec.sh' starts with #! but is not executable"),
        (["--workdir", "{work}", "--python", "/nonexistent/python3", "hello.py"], "--python '/nonexistent/python3'"),
        (["--workdir", "{work}", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["--master-port", "80", "{work}/hello.py"], "--master-port 80 is a privileged port (below 1024)"),
    ],
)
def test_a_program_no_rank_could_start_is_one_line_before_anything_starts(work, args, expected):
    r = dry_run(*(a.format(work=work) for a in args))
    assert r.exit_code == 2, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "hint:" in lines[0], r.stderr
    assert expected.format(work=work) in lines[0]


def test_scripts_and_modules_are_found_in_the_ranks_working_directory(work):
    """Relative names are the ranks' own: they start in --workdir, not where the launcher was started."""
    for program in (["hello.py"], ["-m", "localmod"], ["-m", "json.tool"]):
        r = dry_run("--workdir", str(work), *program)
        assert r.exit_code == 0, (program, r.stderr)


def test_an_executable_script_named_without_a_path_runs_from_the_working_directory(work):
    """exec would look a bare name up on PATH; the file the user named is the one in the working directory."""
    plan = json.loads(dry_run("--workdir", str(work), "wrap.sh").stdout)
    assert plan["nodes"][0]["ranks"][0]["argv"] == ["./wrap.sh"]
    r = run_cli("run", "-n", "1", "--workdir", str(work), "wrap.sh")
    assert r.returncode == 0, r.stderr
    assert "shell rank 0 of 1" in r.stdout
    assert "1 rank exited 0" in r.stderr


def test_a_failing_rank_shows_its_own_traceback_without_the_launchers_frames(work):
    """As `python boom.py` shows it: from the user's first frame (no rankboot.py, no runpy)."""
    r = run_cli("run", "-n", "1", "--workdir", str(work), "boom.py")
    assert r.returncode == 1
    shown = r.stdout + r.stderr
    assert 'File "boom.py", line 5, in <module>' in shown and "ValueError: boom" in shown
    assert "rankboot" not in shown and "runpy" not in shown, shown
    r = run_cli("run", "-n", "1", "--workdir", str(work), "broken.py")
    shown = r.stdout + r.stderr
    assert r.returncode == 1 and "SyntaxError" in shown
    assert "rankboot" not in shown and "runpy" not in shown, shown


def loading_the_cli(pid: int) -> bool:
    """Whether the process is loading the CLI's libraries: pydantic's compiled core is mapped (imported
    by the CLI, never by Python's own start-up, where a Ctrl-C is Python's business)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "pydantic_core" in f.read()
    except OSError:
        return False


def test_ctrl_c_while_the_command_starts_is_a_quiet_exit_130(work):
    """The CLI's libraries take a few tenths of a second to load, the command's own on first use: a Ctrl-C then
    is no traceback, no 'internal error' (pydantic wraps an interrupt inside its schema building) and no death
    by SIGINT (CPython 3.11 ends `python -m` so after an interrupt caught inside a string's exec)."""
    for delay in (0.0, 0.1, 0.2, 0.3):
        proc = subprocess.Popen(
            distlaunch_cmd("run", "-n", "1", str(work / "sleepy.py")),  # still running at any delay
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert wait_until(lambda p=proc: loading_the_cli(p.pid) or p.poll() is not None, timeout=30, interval=0.002)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, (delay, proc.returncode, err)
        assert "Traceback" not in err and "Exception ignored" not in err, err


SWALLOWED = """
import os, signal, sys
from distlaunch import __main__ as command
from distlaunch.launcher.running import launch

class Finaliser:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # its exception is raised here, where Python can only drop it
        for _ in range(1000):
            pass

def execute(*args, **kwargs):  # right before the job's own trap takes the signals: past every check
    Finaliser()
    return real(*args, **kwargs)

real, launch.execute = launch.execute, execute
sys.argv = ["distlaunch", *sys.argv[1:]]
command.entry()
"""


def test_a_ctrl_c_some_code_swallowed_still_stops_the_job_before_it_runs(work):
    """A signal whose exception a finaliser swallowed, right before the job starts: the job that starts after it
    must stop at once (130), not run its ranks to their end, and nothing says the exception was "ignored"."""
    r = subprocess.run(
        [sys.executable, "-c", SWALLOWED, "run", "-n", "1", str(work / "sleepy.py")],
        capture_output=True, text=True, timeout=40,
    )  # fmt: skip
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert "interrupted by SIGINT" in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_the_python_m_entry_point_is_the_console_command():
    r = subprocess.run([sys.executable, "-m", "distlaunch", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("distlaunch ")
