"""The program the ranks exec, checked as the ranks will find it before any starts: a relative ``--python``
from the working directory, a ``--no-python`` program or a named interpreter from there or on PATH, a script
behind interpreter options; and the exit code a rank gets when its program cannot start anyway (127: not
found, 126: found but not runnable), as a shell would give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import run_cli


@pytest.fixture
def work(tmp_path):
    """The ranks' working directory: a script, a directory, files that exist but cannot run, and a folder
    with one tool in it (for --env PATH=...)."""
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "hello.py").write_text("print('hello from the workdir')\n")
    (wd / "adir").mkdir()
    (wd / "noexec.sh").write_text("#!/bin/sh\necho never\n")  # no +x
    (wd / "plain.py").write_text("print('plain')\n")  # no +x, no #!
    noshebang = wd / "noshebang"  # +x, but no #! and no binary format: exec says ENOEXEC
    noshebang.write_text("echo never\n")
    noshebang.chmod(0o755)
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = tools / "mytool"
    tool.write_text('#!/bin/sh\necho "mytool rank $RANK"\n')
    tool.chmod(0o755)
    return wd


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """A refusal: exit 2, one line on stderr with a hint, nothing started, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "hint:" in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert "[rank" not in r.stdout + r.stderr, "a rank started"
    return lines[0]


def test_a_relative_python_found_only_from_the_launchers_directory_is_refused(tmp_path, work):
    """The ranks exec --python from --workdir: a path right from the launcher's directory but wrong from the
    workdir used to pass the check and fail every rank with 127."""
    deep = work / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "inwd.py").write_text("print('ran in the workdir')\n")
    python = os.path.relpath(sys.executable, tmp_path)  # right from tmp_path, wrong from wd/a/b
    for dry in ([], ["--dry-run"]):
        r = run_cli("run", "-n", "1", *dry, "--workdir", str(deep), "--python", python, "inwd.py", cwd=tmp_path)
        line = one_error_line(r)
        assert f"--python {python!r} does not exist on this machine (ranks start in {deep})" in line
        assert "relative path starts from the working directory" in line


def test_a_relative_python_found_from_the_workdir_runs(tmp_path, work):
    """The reverse: a path right from --workdir (where the ranks exec it) but wrong from the launcher's
    directory used to be refused."""
    launcher_cwd = tmp_path / "x" / "y"
    launcher_cwd.mkdir(parents=True)
    python = os.path.relpath(sys.executable, work)  # right from wd, wrong from x/y (two levels deeper)
    assert not (launcher_cwd / python).exists()
    r = run_cli("run", "-n", "1", "--workdir", str(work), "--python", python, "hello.py", cwd=launcher_cwd)
    assert r.returncode == 0, r.stderr
    assert "hello from the workdir" in r.stdout


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        (["--no-python", "trian.sh"], "program 'trian.sh' is not on the ranks' PATH here"),
        (["--no-python", "./trian.sh"], "program './trian.sh' does not exist on this machine (ranks start in {wd})"),
        (["--no-python", "{wd}/trian.sh"], "program '{wd}/trian.sh' does not exist on this machine (hint"),
        (["--no-python", "adir/"], "program 'adir/' is a directory, not a program"),
        (["python3.99", "hello.py"], "interpreter 'python3.99' is not on the ranks' PATH here"),
        (["{wd}/python3", "hello.py"], "interpreter '{wd}/python3' does not exist on this machine"),
        (["python3", "-u", "missing.py"], "script 'missing.py' does not exist (ranks start in {wd})"),
        (["python3", "-O", "missing.py"], "script 'missing.py' does not exist"),
        (["python3", "-X", "dev", "-W", "error", "missing.py"], "script 'missing.py' does not exist"),
        (["python3", "-Xdev", "-Werror", "missing.py"], "script 'missing.py' does not exist"),
        (["python3", "-uW", "error", "missing.py"], "script 'missing.py' does not exist"),
    ],
)
def test_a_program_no_rank_could_start_is_refused_in_one_line(work, program, expected):
    """Before: every rank failed with 127 (and was restarted for nothing); a dry-run printed a plan, rc 0."""
    args = [a.format(wd=work) for a in program]
    for dry in ([], ["--dry-run"]):
        r = run_cli("run", "-n", "2", "--max-restarts", "2", *dry, "--workdir", str(work), *args)
        line = one_error_line(r)
        assert expected.format(wd=work) in line, line
        assert "restart" not in r.stdout + r.stderr


def test_a_bare_name_is_looked_up_on_path_with_a_hint_for_the_file_in_the_workdir(work):
    """exec looks a bare name up on PATH, not in the working directory: say so, and how to name the file."""
    plain = work / "plain.py"
    plain.chmod(0o755)
    line = one_error_line(run_cli("run", "-n", "1", "--workdir", str(work), "--no-python", "plain.py"))
    assert "program 'plain.py' is not on the ranks' PATH here" in line
    assert "write ./plain.py for the file in the working directory" in line


@pytest.mark.parametrize(
    ("program", "hint"),
    [
        ("./noexec.sh", "chmod +x {wd}/noexec.sh, or run it through its interpreter: --no-python sh ./noexec.sh"),
        ("./plain.py", "chmod +x {wd}/plain.py, or run it with Python: leave out --no-python"),
    ],
)
def test_a_program_without_the_execute_bit_is_refused_with_the_fix(work, program, hint):
    """Before: every rank failed 'Permission denied' with exit 127."""
    for dry in ([], ["--dry-run"]):
        r = run_cli("run", "-n", "2", *dry, "--workdir", str(work), "--no-python", program)
        line = one_error_line(r)
        assert f"program {program!r} is not executable (no execute permission)" in line
        assert hint.format(wd=work) in line


def test_the_ranks_path_is_the_one_searched(tmp_path, work):
    """--env PATH=... is the PATH the ranks' exec searches: a tool only there runs; one not there is refused."""
    tools = str(tmp_path / "tools")
    r = run_cli("run", "-n", "1", "--workdir", str(work), "--env", f"PATH={tools}", "--no-python", "mytool")
    assert r.returncode == 0, r.stderr
    assert "mytool rank 0" in r.stdout
    r = run_cli("run", "-n", "1", "--workdir", str(work), "--env", f"PATH={tools}", "--no-python", "sh", "-c", "true")
    assert "program 'sh' is not on the ranks' PATH here" in one_error_line(r)


@pytest.mark.parametrize(
    "program",
    [
        ["python3", "-u", "hello.py"],
        ["python3", "-X", "dev", "hello.py"],
        ["python3", "-c", "print('code ran')"],
        ["--no-python", "sh", "-c", "echo code ran"],
    ],
)
def test_programs_the_ranks_can_start_still_run(work, program):
    r = run_cli("run", "-n", "1", "--workdir", str(work), *program)
    assert r.returncode == 0, r.stderr
    assert ("hello from the workdir" if "hello.py" in program else "code ran") in r.stdout


@pytest.mark.parametrize(
    "program",
    [
        ["python3", "-uc", "print('code ran')"],  # a group that ends the options: before, rankboot became the code
        ["python3", "-uW", "ignore", "hello.py"],  # -W's value is the next word
        ["python3", "-Wignore", "-OO", "hello.py"],
    ],
)
def test_combined_option_groups_run_as_python_reads_them(work, program):
    r = run_cli("run", "-n", "1", "--workdir", str(work), *program)
    assert r.returncode == 0, r.stderr
    assert ("hello from the workdir" if "hello.py" in program else "code ran") in r.stdout


def test_a_program_found_but_not_runnable_exits_126_like_a_shell(work):
    """Executable bit set, but no #! and no binary format (ENOEXEC): it passes the check, and the rank's exit
    code is 126, not 127 ("found but cannot execute", as sh gives)."""
    r = run_cli("run", "-n", "1", "--workdir", str(work), "--no-python", "./noshebang")
    assert r.returncode == 126, (r.returncode, r.stderr)
    assert "cannot start './noshebang': Exec format error" in r.stdout + r.stderr


def test_the_agent_gives_127_for_a_missing_program_and_126_for_one_it_may_not_run(work):
    """Remote hosts (and a file changed after the check) reach the agent's own exec: ENOENT is 127, EACCES
    and ENOEXEC 126. The agent runs as a real process, given its node's plan on stdin."""
    node = {
        "workdir": str(work),
        "ranks": [
            {"rank": 0, "env": {}, "argv": ["./missing"]},
            {"rank": 1, "env": {}, "argv": ["./noexec.sh"]},
            {"rank": 2, "env": {}, "argv": ["./noshebang"]},
        ],
    }
    agent = subprocess.run(
        [sys.executable, "-m", "distlaunch.agent"],
        input=json.dumps(node) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    events = [json.loads(line) for line in agent.stdout.splitlines()]
    codes = {e["rank"]: e["code"] for e in events if e["ev"] == "exit"}
    assert codes == {0: 127, 1: 126, 2: 126}, agent.stdout + agent.stderr
