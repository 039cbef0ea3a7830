"""Save requests for a plain PyTorch script under ``distlaunch run``: ``distlaunch.checkpoint_requested()`` in the
loop, ``distlaunch checkpoint JOB`` / ``stop --checkpoint`` answered once the ranks report the save, signals passed
on with ``--forward-signals``; the options' bad values; the rank side's reading of its request file."""

from __future__ import annotations

import json
import os
import signal
import textwrap

import pytest

import distlaunch
from distlaunch import saverequest
from tests.helpers import run_cli, wait_until

# The documented loop (docs/surviving-failures.md): every rank agrees on the flag, then saves the same step.
LOOP = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch, torch.distributed as dist
    import distlaunch

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    signal.signal(signal.SIGUSR2, lambda *_: open(f"{out}/usr2-{rank}", "w").close())
    open(f"{out}/ready-{rank}", "w").close()
    for step in range(1, 100000):
        time.sleep(0.05)  # the step's work
        asked = torch.tensor([int(distlaunch.checkpoint_requested())])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        if asked.item():
            distlaunch.save_request()  # this rank's own request, read now if it came a moment after another's
            torch.save({"step": step}, f"{out}/ckpt-{step}-rank{rank}.pt")
            distlaunch.progress(step=step, saved_step=step)
        else:
            distlaunch.progress(step=step)
    """
)
# Never looks at requests, never reports a save.
DEAF = "import time\nopen(__import__('sys').argv[1] + '/ready-' + __import__('os').environ['RANK'], 'w').close()\ntime.sleep(600)\n"


@pytest.fixture
def state(tmp_path) -> dict[str, str]:
    return {"DISTLAUNCH_STATE_DIR": str(tmp_path / "state"), "OMP_NUM_THREADS": "1"}


def detach(tmp_path, state, script: str, *launch: str) -> str:
    (tmp_path / "job.py").write_text(script)
    started = run_cli("run", "-n", "2", "--detach", *launch, "job.py", str(tmp_path), env=state, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.split()[0]
    assert wait_until(lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 60, 0.1)
    return job_id


def test_a_plain_loop_saves_when_asked_then_is_stopped_after_its_save(tmp_path, state):
    job_id = detach(tmp_path, state, LOOP, "--forward-signals", "USR2", "--grace-period", "2")
    try:
        asked = run_cli("checkpoint", job_id, "--json", env=state, cwd=tmp_path)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        step = json.loads(asked.stdout)["step"]
        assert all((tmp_path / f"ckpt-{step}-rank{r}.pt").exists() for r in (0, 1))  # both ranks, one step

        record = json.loads(run_cli("status", job_id, "--json", env=state, cwd=tmp_path).stdout)
        os.kill(record["owner"]["pid"], signal.SIGUSR2)  # the launcher we started passes it on to each rank
        assert wait_until(lambda: all((tmp_path / f"usr2-{r}").exists() for r in (0, 1)), 30, 0.1)
        assert run_cli("status", job_id, "--json", env=state, cwd=tmp_path).stdout.count('"state": "running"') == 1

        stopped = run_cli("stop", "--checkpoint", job_id, env=state, cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert stopped.stdout.strip() == f"job {job_id} stopped (exit 75)"
        saved = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("ckpt-*-rank0.pt"))
        assert saved[0] == step and saved[-1] > step  # the stop's own save came after the first
        assert saved == sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("ckpt-*-rank1.pt"))  # same steps
    finally:
        run_cli("stop", job_id, env=state, cwd=tmp_path)


def test_a_script_that_never_saves_leaves_the_command_waiting_and_saying_so(tmp_path, state):
    job_id = detach(tmp_path, state, DEAF)
    try:
        asked = run_cli("checkpoint", job_id, "--timeout", "2", env=state, cwd=tmp_path)
        assert asked.returncode == 1 and asked.stderr.count("\n") == 1, asked.stderr
        assert f"job {job_id} did not answer with a checkpoint within 2s" in asked.stderr
    finally:
        assert run_cli("stop", job_id, env=state, cwd=tmp_path).returncode == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--save-signal", "KILL"], "--save-signal 'KILL': SIGKILL is not one distlaunch can take for this"),
        (["--forward-signals", "USR1,NOPE"], "--forward-signals 'NOPE' is not a signal"),
        (["--forward-signals", "usr1"], "SIGUSR1 is both the save signal and one of --forward-signals"),
    ],
)
def test_bad_signal_options_are_one_line(tmp_path, state, args, message):
    (tmp_path / "x.py").write_text("pass\n")
    r = run_cli("run", *args, "x.py", env=state, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr


def test_checkpoint_of_a_job_that_is_not_running_is_one_line(tmp_path, state):
    (tmp_path / "x.py").write_text("pass\n")
    assert run_cli("run", "x.py", env=state, cwd=tmp_path).returncode == 0
    [record] = json.loads(run_cli("jobs", "--json", env=state, cwd=tmp_path).stdout)
    for job, message in ((record["job_id"], "is succeeded, not running"), ("nope", "no job 'nope'")):
        r = run_cli("checkpoint", job, env=state, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_a_rank_reads_its_request_file_and_a_reported_save_answers_it(tmp_path, monkeypatch):
    path = tmp_path / "rank0.request"
    monkeypatch.setenv("DISTLAUNCH_REQUEST_FILE", str(path))
    monkeypatch.setenv("DISTLAUNCH_PROGRESS_FILE", str(tmp_path / "rank0.progress"))
    monkeypatch.setattr(saverequest, "_requests", saverequest._Requests())
    monkeypatch.setattr(distlaunch, "_progress", distlaunch._ProgressFile())
    assert not distlaunch.checkpoint_requested()  # no file yet
    path.write_text('{"id": 1, "then": "continue", "why": "distlaunch checkpoint"}')
    assert distlaunch.save_request() == saverequest.SaveRequest(1, "continue", "distlaunch checkpoint")
    assert distlaunch.checkpoint_requested()  # until a save is reported
    distlaunch.progress(step=7, saved_step=7, save_s=0.5)
    assert not distlaunch.checkpoint_requested()
    report = json.loads((tmp_path / "rank0.progress").read_text())
    assert (report["save_s"], report["answered"], report["answered_step"]) == (0.5, 1, 7)
    # a periodic save a step later, before the agent read the file again: step 7 stays the answer
    distlaunch.progress(step=8, saved_step=8)
    report = json.loads((tmp_path / "rank0.progress").read_text())
    assert (report["saved_step"], report["answered"], report["answered_step"]) == (8, 1, 7)
    path.write_text('{"id": 2, "then": "stop", "why": "SIGUSR1"}  ')  # a new request (another size, another stamp)
    assert distlaunch.save_request() == saverequest.SaveRequest(2, "stop", "SIGUSR1")
    path.write_text("{not json")  # never a failure in the rank: the last one read stands
    assert distlaunch.save_request().id == 2


# -- the launcher's side: SaveWatch, on progress events as the agents send them ------------------------------------


def _progress(reports: dict[int, dict]) -> dict:
    return {"ev": "progress", "ranks": {str(rank): {"at": 0.0, **report} for rank, report in reports.items()}}


def test_a_save_is_done_only_once_every_checkpointing_rank_saved_for_this_request():
    from distlaunch.launcher.supervising.goodput import StepTimeline
    from distlaunch.launcher.supervising.requests import SaveAsk
    from distlaunch.launcher.supervising.saves import SaveWatch
    from distlaunch.launcher.supervising.watch import Agents
    from tests.launcher.test_stragglers import _plan

    notices: list[str] = []
    watch = SaveWatch(Agents(_plan()), None, StepTimeline(), notices.append, grace_period=5.0)
    # the step each rank resumed from (0) is no answer, nor is a periodic save of an earlier request
    watch.on_event(0, _progress({0: {"step": 3, "saved_step": 0}, 1: {"step": 3, "saved_step": 0}}))
    watch.ask(SaveAsk("stop", "SIGUSR1"), now=0.0)
    assert watch.tick(0.5) is None and watch.pending is not None
    # rank 0 answered the request with step 4; rank 1 saved step 4 with it but had not read its own file yet
    watch.on_event(0, _progress({0: {"step": 4, "saved_step": 4, "answered": 1, "save_s": 0.3}}))
    assert watch.tick(0.6) is None and watch.pending is not None  # rank 1 still reports step 0
    watch.on_event(0, _progress({1: {"step": 4, "saved_step": 4, "answered": 0, "save_s": 0.4}}))
    assert watch.tick(0.7) is None and watch.pending is None
    assert [(s.step, s.why, s.then, s.save_s) for s in watch.saved] == [(4, "SIGUSR1", "stop", 0.4)]
    assert watch.outcome == (75, "the checkpoint of step 4 was saved as asked by SIGUSR1")
    # the ranks get the grace period to end by themselves; then they are stopped
    assert watch.tick(5.6) is None
    stop = watch.tick(5.8)
    assert stop is not None and stop.reason == watch.outcome[1]


def test_the_answer_is_the_save_that_answered_not_a_later_periodic_one():
    from distlaunch.launcher.supervising.goodput import StepTimeline
    from distlaunch.launcher.supervising.requests import SaveAsk
    from distlaunch.launcher.supervising.saves import SaveWatch
    from distlaunch.launcher.supervising.watch import Agents
    from tests.launcher.test_stragglers import _plan

    watch = SaveWatch(Agents(_plan()), None, StepTimeline(), [].append, grace_period=5.0)
    watch.on_event(0, _progress({0: {"step": 3, "saved_step": 0}, 1: {"step": 3, "saved_step": 0}}))
    watch.ask(SaveAsk("continue", "distlaunch checkpoint"), now=0.0)
    # both ranks saved step 4 as asked, then step 5 as it was due, before their agent read the reports again
    after = {"step": 5, "saved_step": 5, "answered": 1, "answered_step": 4, "save_s": 0.2}
    watch.on_event(0, _progress({0: after, 1: after}))
    assert watch.tick(0.5) is None and watch.pending is None
    assert [(s.step, s.then) for s in watch.saved] == [(4, "continue")]
