"""The status line under a running job's output, on a real terminal (tmux at 80 columns), and its absence in a
pipe: what it shows (the first line at once, a rank's words before its first step, step/total and figures, a
stall), that it stays one line inside the width, and that it is gone when the job ends."""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from fixtures.terminal import Terminal
from helpers import distlaunch_cmd

from distlaunch.cli.statusline import status_text
from distlaunch.contract.sink import JobStatus

STATUS = r"^step (\d+)/40 · loss \d\.\d{4} · \d+(\.\d+)?k tok/s · MFU 3\d% · eta \d+s · 0:\d\d$"

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import distlaunch

    rank = int(os.environ["RANK"])
    distlaunch.progress(status="warming up")
    time.sleep(float(sys.argv[1]))  # what importing torch looks like: seconds without a step
    for step in range(1, 41):
        time.sleep(0.25)
        distlaunch.progress(step=step, total_steps=40, metrics={"loss": 3 - step / 40, "tokens_per_s": 12345.0, "mfu": 0.345})
        if step % 10 == 0 and rank == 0:
            print(f"line of step {step}", flush=True)
        if step == 30:
            time.sleep(float(sys.argv[2]))  # a stall: no step for a while
    """
)


@pytest.fixture
def terminal(tmp_path):
    term = Terminal(tmp_path, width=80, height=30)
    yield term
    term.close()


def last_line(screen: str) -> str:
    return screen.splitlines()[-1] if screen else ""


def test_the_status_line_follows_the_job_on_a_terminal_and_is_gone_at_its_end(terminal, tmp_path):
    (tmp_path / "steps.py").write_text(SCRIPT)
    terminal.run("distlaunch run -n 2 steps.py 3 12", cwd=tmp_path)
    # at once, before any rank has said anything: what starts, and where
    first = terminal.wait_for(r"^distlaunch: job (dl-\w+): starting 2 ranks on this machine$", 10)
    job_id = first.group(1)
    # the rank's own words while it has no step yet
    terminal.wait_for(r"^\S.* · \d:\d\d · rank 0: warming up$", 10)
    # then its steps, with the figures it reports, as the last line of the screen, under the rank lines
    terminal.wait_for(r"^\[rank 0\] line of step 10$", 30)
    found = terminal.wait_for(STATUS, 10)  # (a second or so behind the lines: ranks report once a second)
    screen = terminal.screen()
    assert last_line(screen) == found.group(0), screen
    assert all(len(line) < 80 for line in screen.splitlines()), screen
    # a stall is said on the line (the ranks are silent at step 30 for 12 s)
    terminal.wait_for(r"^step 30/40 · loss .* · no step for 1\ds$", 20)
    assert terminal.exit_code(30) == 0
    history = terminal.history()
    # the status line was erased: nothing of it is left on the screen or in the scrollback, only the ranks' lines
    assert " · loss " not in history, history
    assert [line for line in history.splitlines() if "line of step" in line] == [
        f"[rank 0] line of step {s}" for s in (10, 20, 30, 40)
    ]
    assert f"job {job_id} finished: 2 ranks exited 0" in history


def test_a_pipe_gets_the_first_line_and_no_status_line(tmp_path):
    (tmp_path / "steps.py").write_text(SCRIPT)
    run = subprocess.run(
        [*distlaunch_cmd("run", "-n", "2", "steps.py", "0", "0")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines()[0].startswith("distlaunch: job dl-"), run.stderr
    assert "\x1b" not in run.stdout + run.stderr and "\r" not in run.stdout + run.stderr
    assert " · loss " not in run.stderr


@pytest.mark.parametrize("width", [80, 60, 40, 20])
def test_the_status_line_fits_the_width_and_drops_whole_parts(width):
    cases = [
        JobStatus(world_size=4096, hosts=512, elapsed_s=3.5),
        JobStatus(world_size=8, hosts=2, elapsed_s=75, started=8, running=8, since_output_s=12.0),
        JobStatus(world_size=8, hosts=1, elapsed_s=9, started=8, running=8, reporter=0, doing="first step, compiling"),
        JobStatus(
            world_size=16, hosts=2, elapsed_s=3700, started=16, running=16, reporter=0, step=123456, total_steps=200000,
            metrics={"loss": 2.345678, "tokens_per_s": 1234567.0, "mfu": 0.4567}, eta_s=86000, since_progress_s=0.4,
        ),
    ]  # fmt: skip
    words = set()
    for case in cases:
        words |= set(status_text(case, 1000).split(" · "))
    for case in cases:
        line = status_text(case, width)
        assert len(line) <= width - 1, line
        parts = line.split(" · ")
        assert all(part in words for part in parts) or len(parts) == 1, line  # parts are left out, never cut
    assert (
        status_text(cases[3], 80) == "step 123456/200000 · loss 2.3457 · 1.23M tok/s · MFU 46% · eta 23h53m · 1:01:40"
    )
    # too long for 40 columns: the clock goes first, then MFU, the ETA, tokens/s
    assert status_text(cases[3], 40) == "step 123456/200000 · loss 2.3457"
    stalled = cases[3].model_copy(update={"since_progress_s": 95.0})
    assert status_text(stalled, 60) == "step 123456/200000 · loss 2.3457 · no step for 1m35s"
