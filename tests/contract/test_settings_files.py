"""Files of settings the user names (a hostfile, a training config, an sbatch template, a .distlaunch_env, an
ssh config): a device or a file of many GB in their place is one line, not read until memory runs out; a
hostfile from a pipe is read."""

from __future__ import annotations

import os
import resource
import subprocess
import threading

import pytest

from distlaunch.files import TEXT_LIMIT
from tests.helpers import distlaunch_cmd

COMMANDS = {
    "hostfile": ["run", "-H", "{f}", "--dry-run", "x.py"],
    "config": ["train", "{f}", "--dry-run"],
    "template": ["slurm", "sbatch", "--template", "{f}", "-N", "1", "--dry-run", "x.py"],
    "env file": ["run", "-n", "1", "--dry-run", "x.py"],  # the working directory's .distlaunch_env
    "ssh config": ["run", "-H", "hosts", "--ssh-config", "{f}", "--dry-run", "x.py"],
}


def run(args: list[str], cwd, path) -> subprocess.CompletedProcess:
    """The CLI with its memory capped: read for ever, a device would fill it (before: gigabytes a second)."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    argv = distlaunch_cmd(*(a.replace("{f}", str(path)) for a in args))
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, preexec_fn=cap)


@pytest.mark.parametrize("what", COMMANDS)
def test_a_device_or_a_huge_file_in_place_of_settings_is_one_line(tmp_path, what):
    (tmp_path / "x.py").write_text("print('hi')\n")
    (tmp_path / "hosts").write_text("node1 slots=1\n")
    huge = tmp_path / "huge.toml"
    with open(huge, "wb") as f:
        f.truncate(TEXT_LIMIT + 1)  # sparse: no disk, but every byte of it to read
    for path in [huge] if what == "env file" else ["/dev/zero", huge]:  # an env file is read only if a file
        if what == "env file":
            (tmp_path / ".distlaunch_env").unlink(missing_ok=True)
            (tmp_path / ".distlaunch_env").symlink_to(path)
        r = run(COMMANDS[what], tmp_path, path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
        assert "is over 64 MiB, too large for a file of settings" in lines[0], r.stderr


def test_a_hostfile_from_a_pipe_is_read_and_a_config_from_one_is_refused(tmp_path):
    """bash's <(...) hands a pipe. A hostfile is read by the launcher alone: read like a file. A training
    config is read by every rank: the launcher's check emptied the pipe, and every rank then waited on it."""
    (tmp_path / "x.py").write_text("print('hi')\n")
    pipe = tmp_path / "hosts.pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=pipe.write_text, args=("localhost slots=3\n",))
    writer.start()
    r = run(COMMANDS["hostfile"], tmp_path, pipe)
    writer.join(timeout=10)
    assert r.returncode == 0 and "world size 3" in r.stdout, r.stderr
    os.mkfifo(tmp_path / "config.pipe")  # refused before it is opened: no writer needed
    r = run(COMMANDS["config"], tmp_path, tmp_path / "config.pipe")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "is a pipe: every rank reads the config itself" in lines[0], r.stderr
