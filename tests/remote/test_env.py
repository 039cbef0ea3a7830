"""Environment forwarding for remote ranks: prefixes, env files, precedence (pure, no sshd)."""

import pytest

from distlaunch.errors import UsageError
from distlaunch.remote.env import ENV_FILE, file_env, forwarded_env, parse_env_file
from tests.helpers import run_cli


def test_forwards_only_well_known_variables():
    environ = {
        "NCCL_DEBUG": "INFO",
        "GLOO_SOCKET_IFNAME": "eth0",
        "CUDA_LAUNCH_BLOCKING": "1",
        "PYTHONPATH": "/src",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
        "OMP_NUM_THREADS": "4",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "x",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PYTHONHOME": "/opt/py",
        "MY_NCCL_THING": "no",
    }
    assert forwarded_env(environ) == {
        "NCCL_DEBUG": "INFO",
        "GLOO_SOCKET_IFNAME": "eth0",
        "CUDA_LAUNCH_BLOCKING": "1",
        "PYTHONPATH": "/src",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
        "OMP_NUM_THREADS": "4",
    }


def test_env_file_syntax(tmp_path):
    path = tmp_path / ENV_FILE
    path.write_text("# comment\n\n  A=1\nexport B = two words \nC='quoted # not a comment'\nD=\"x\"\nE=a=b\nF=\n")
    assert parse_env_file(path) == {
        "A": "1",
        "B": "two words",
        "C": "quoted # not a comment",
        "D": "x",
        "E": "a=b",
        "F": "",
    }


@pytest.mark.parametrize("line", ["NOEQUALS", "1ABC=x", "BAD-NAME=x", "=x"])
def test_env_file_errors_name_file_and_line(tmp_path, line):
    path = tmp_path / ENV_FILE
    path.write_text(f"OK=1\n{line}\n")
    with pytest.raises(UsageError, match=f"line 2 '{line}' is not KEY=VALUE") as info:
        parse_env_file(path)
    assert str(path) in info.value.message and "NAME=value" in info.value.hint


def test_working_directory_file_overrides_home(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir(), cwd.mkdir()
    (home / ENV_FILE).write_text("A=home\nB=home\n")
    (cwd / ENV_FILE).write_text("B=work\n")
    assert file_env(cwd=cwd, home=home) == {"A": "home", "B": "work"}
    assert file_env(cwd=tmp_path, home=tmp_path) == {}


def test_a_working_directory_file_is_announced_and_code_paths_draw_a_warning(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os; print('FOO=' + os.environ['FOO'], 'LIB=' + os.environ['LD_LIBRARY_PATH'])\n")
    (tmp_path / ENV_FILE).write_text("FOO=bar\nLD_LIBRARY_PATH=/nonexistent/lib\n")
    r = run_cli("run", "-n", "1", str(script), cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "FOO=bar LIB=/nonexistent/lib" in r.stdout  # the file still applies
    lines = r.stderr.splitlines()
    assert f"distlaunch: using {tmp_path / ENV_FILE}: FOO, LD_LIBRARY_PATH" in lines
    warning = [line for line in lines if "warning:" in line]
    assert len(warning) == 1 and f"{tmp_path / ENV_FILE} sets LD_LIBRARY_PATH, which decide what code" in warning[0]
    (tmp_path / ENV_FILE).write_text("FOO=plain\n")
    r = run_cli("run", "-n", "1", "--dry-run", str(script), cwd=tmp_path, timeout=60)
    assert f"distlaunch: using {tmp_path / ENV_FILE}: FOO" in r.stderr and "warning" not in r.stderr


def test_only_the_working_directory_file_is_announced(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir(), cwd.mkdir()
    (home / ENV_FILE).write_text("PYTHONPATH=/mine\n")
    said: list[str] = []
    assert file_env(cwd=cwd, home=home, announce=said.append) == {"PYTHONPATH": "/mine"}
    assert said == []


def test_quiet_keeps_distlaunchs_notices_back_and_verbose_adds_its_debug_ones(tmp_path):
    """Library code tells through one logger; -q and -v (before the command) set what reaches stderr."""
    script = tmp_path / "show.py"
    script.write_text("print('ran')\n")
    (tmp_path / ENV_FILE).write_text("FOO=plain\n")
    told = f"distlaunch: using {tmp_path / ENV_FILE}: FOO"
    quiet = run_cli("-q", "run", "-n", "1", "--dry-run", str(script), cwd=tmp_path, timeout=60)
    assert quiet.returncode == 0 and told not in quiet.stderr and "distlaunch: backend" not in quiet.stderr
    plain = run_cli("run", "-n", "1", "--dry-run", str(script), cwd=tmp_path, timeout=60)
    assert told in plain.stderr and "distlaunch: backend" not in plain.stderr, plain.stderr
    loud = run_cli("-v", "run", "-n", "1", "--dry-run", str(script), cwd=tmp_path, timeout=60)
    assert told in loud.stderr and "distlaunch: backend: hosts" in loud.stderr, loud.stderr
