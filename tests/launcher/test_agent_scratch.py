"""An agent's scratch folder (its ranks' stacks files, NCCL dumps) in the temp folder: removed by the agent at
its end, and, when the agent was killed outright, by a later agent: never a live agent's (each holds a lock on
its own). The temp folder is the test's own (TMPDIR), so two suites at once never see each other's."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import children, distlaunch_cmd, run_cli

SLEEPER = "import os, time\nprint(os.environ['DISTLAUNCH_PROGRESS_FILE'], flush=True)\ntime.sleep(60)\n"


def test_a_killed_agents_scratch_folder_is_removed_by_a_later_agent_never_a_live_ones(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "NO_COLOR": "1"}
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    launcher = subprocess.Popen(
        distlaunch_cmd("run", "-n", "1", "--hang-timeout", "600", str(tmp_path / "sleeper.py")),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        scratch = Path(launcher.stdout.readline().split()[-1]).parent  # the rank's progress file is in it
        agents = [
            pid for pid in children(launcher.pid) if b"distlaunch.agent" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert scratch.parent == tmp and len(agents) == 1, (scratch, agents)
        os.kill(agents[0], signal.SIGKILL)  # the OOM killer, say: no cleanup of its own
        launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert scratch.is_dir()  # left behind

    old = time.time() - 120
    os.utime(scratch, (old, old))
    young = tmp / "distlaunch-agent-young"  # an agent's that has just made it, and is about to lock it
    young.mkdir()
    held = tmp / "distlaunch-agent-held"  # a live agent's: locked
    held.mkdir()
    os.utime(held, (old, old))
    lock = os.open(held, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        r = run_cli("run", "-n", "1", "--", sys.executable, "-c", "pass", env={"TMPDIR": str(tmp)})
    finally:
        os.close(lock)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp.iterdir()) == ["distlaunch-agent-held", "distlaunch-agent-young"]
