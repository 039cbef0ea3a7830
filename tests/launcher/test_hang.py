"""A real hang with real gloo: one of 4 ranks sleeps before an all_reduce; the launcher names it."""

import os
import re
import subprocess
from pathlib import Path

from distlaunch.launcher.stacks import group_stacks, summary
from tests.helpers import distlaunch_cmd, pids_with_env, wait_until

LATE = str(Path(__file__).parent / "scripts" / "late_rank.py")


def test_a_rank_that_never_joins_the_all_reduce_is_named_and_the_job_exits_124(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(NO_COLOR="1", COLUMNS="200", LATE_RANK="3", DLTEST_MARK=tmp_path.name)
    r = subprocess.run(
        distlaunch_cmd(
            "run", "-n", "4", "--hang-timeout", "20", "--grace-period", "1", "--log-dir", str(tmp_path / "logs"), LATE
        ),
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert r.returncode == 124, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("distlaunch: hang: "))
    assert re.search(r"ranks 0-2 wait in all_reduce \(late_rank\.py:17\)", line), line
    assert re.search(r"rank 3 in <module> \(late_rank\.py:15\) on localhost", line), line
    folders = list((tmp_path / "logs").glob("dl-*/stacks"))
    assert len(folders) == 1
    stacks = {p.name: p.read_text() for p in folders[0].iterdir()}
    assert sorted(stacks) == ["rank0.txt", "rank1.txt", "rank2.txt", "rank3.txt"]
    assert 'late_rank.py", line 15 in <module>' in stacks["rank3.txt"]
    assert "all_reduce" in stacks["rank0.txt"]
    assert wait_until(lambda: not pids_with_env("DLTEST_MARK", tmp_path.name), 10), "ranks left behind"


def test_grouping_names_the_odd_ranks_out_with_their_host():
    def dump(func: str, line: int) -> str:
        return f'Thread 0x1 (most recent call first):\n  File "/x/y.py", line {line} in {func}\n'

    stacks = {r: dump("all_reduce", 42) for r in (0, 1, 2, 4, 5, 6, 7)} | {3: dump("<module>", 40)}
    hosts = {r: f"node{r // 4 + 1}" for r in range(8)}
    text = summary(group_stacks(stacks, hosts))
    assert text == "ranks 0-2,4-7 wait in all_reduce (y.py:42); rank 3 in <module> (y.py:40) on node1"
