"""An ssh_config's ``Match exec`` commands run as OpenSSH runs them, and one that hangs is one line, not a silent
launch: real commands, the real CLI."""

from __future__ import annotations

import uuid

from distlaunch.remote.sshconfig import MATCH_EXEC_TIMEOUT_S, resolve_targets
from tests.helpers import left_behind, run_cli


def test_match_exec_picks_the_settings_its_command_answers_for(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(
        'Match host gpu1 exec "test -d /"\n  User alice\n'
        'Match host gpu2 exec "test -d /no/such/folder"\n  User bob\n'
        "Host *\n  User carol\n"
    )
    targets = resolve_targets(["gpu1", "gpu2"], config)
    assert (targets["gpu1"].user, targets["gpu2"].user) == ("alice", "carol")


def test_a_match_exec_command_that_hangs_is_one_line_and_is_ended(tmp_path):
    mark = uuid.uuid4().hex
    config = tmp_path / "ssh_config"
    config.write_text('Match exec "sleep 300"\n  User bob\nHost gpu1\n  HostName 127.0.0.99\n')
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu1 slots=1\n")
    r = run_cli(
        "run", "-H", str(hostfile), "--ssh-config", str(config), "--dry-run", "train.py",
        env={"DLTEST_MARK": mark}, timeout=MATCH_EXEC_TIMEOUT_S + 60,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: ssh config: Match exec 'sleep 300' did not finish within {MATCH_EXEC_TIMEOUT_S:g}s (hint: fix or "
        "remove that Match exec (OpenSSH runs it too, before every connection))"
    ], r.stderr
    assert not (left := left_behind("DLTEST_MARK", mark, 10)), f"the Match exec command still runs: {left}"
