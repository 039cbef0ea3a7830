"""Environment forwarding for remote ranks: prefixes, env files, precedence (pure, no sshd)."""

import pytest

from distlaunch.errors import UsageError
from distlaunch.remote.env import ENV_FILE, file_env, forwarded_env, parse_env_file


def test_forwards_only_well_known_variables():
    environ = {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0", "CUDA_LAUNCH_BLOCKING": "1", "PYTHONPATH": "/src",
               "TORCH_SHOW_CPP_STACKTRACES": "1", "OMP_NUM_THREADS": "4", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x",
               "CUDA_VISIBLE_DEVICES": "0,1", "PYTHONHOME": "/opt/py", "MY_NCCL_THING": "no"}
    assert forwarded_env(environ) == {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0", "CUDA_LAUNCH_BLOCKING": "1",
                                      "PYTHONPATH": "/src", "TORCH_SHOW_CPP_STACKTRACES": "1", "OMP_NUM_THREADS": "4"}


def test_env_file_syntax(tmp_path):
    path = tmp_path / ENV_FILE
    path.write_text("# comment\n\n  A=1\nexport B = two words \nC='quoted # not a comment'\nD=\"x\"\nE=a=b\nF=\n")
    assert parse_env_file(path) == {"A": "1", "B": "two words", "C": "quoted # not a comment", "D": "x", "E": "a=b", "F": ""}


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
