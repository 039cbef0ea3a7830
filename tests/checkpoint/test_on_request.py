"""Checkpoints on request, through the real CLI and the engine's 2-rank reference job (dp=2, 20 steps, a checkpoint
every 5): ``distlaunch checkpoint JOB`` (the job trains on), ``stop --checkpoint`` and the save signal (saved, then
stopped: exit 75), SIGTERM (saved when the measured save fits in the grace period, exit 143; else the lost work is
said). Every rank saves the same step, and the next start resumes after it: the metrics hold every step once and
the loss curve is the uninterrupted run's.

Rank 0 is slowed by the ``slow`` fault (it spins: the arithmetic is unchanged) so that a request lands mid-run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from tests.checkpoint.conftest import REPO, SAME_LAYOUT_RTOL, STEPS, cli_env, engine_args, max_relative, step_losses
from tests.helpers import distlaunch_cmd, run_cli, wait_until

SLOW = ("fault.rank=0", "fault.kind='slow'", "fault.step=1", "fault.factor=40", "train.log_every=1")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """The CLI's environment: a private state folder (the job records) and the engine's quiet settings."""
    return {"DISTLAUNCH_STATE_DIR": str(tmp_path / "state"), **cli_env()}


def metrics_steps(metrics) -> list[int]:
    """Every step line of metrics.jsonl, in order, repeats included."""
    if not metrics.exists():
        return []
    return [r["step"] for r in map(_record, metrics.read_text().splitlines()) if "step" in r]


def _record(line: str) -> dict:
    """One metrics line; one the engine is still writing (the last, read mid-write) as nothing."""
    try:
        return json.loads(line)
    except ValueError:
        return {}


def events(metrics) -> list[dict]:
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("event") in ("saved", "stopped")]


def latest_step(ckpt) -> int:
    """The step the checkpoint folder's ``latest`` pointer names."""
    return int(re.fullmatch(r"step_(\d+)", (ckpt / "latest").read_text().strip())[1])


def start(tmp_path, env, *launch: str, overrides=SLOW) -> subprocess.Popen:
    args = [
        "run",
        "-n",
        "2",
        "--grace-period",
        "5",
        *launch,
        *engine_args(tmp_path / "ckpt", tmp_path / "m.jsonl", *overrides),
    ]
    return subprocess.Popen(
        distlaunch_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, **env, "NO_COLOR": "1", "COLUMNS": "200"},
    )  # fmt: skip


def past_step(tmp_path, step: int, timeout: float = 90) -> bool:
    return wait_until(lambda: max(metrics_steps(tmp_path / "m.jsonl"), default=0) >= step, timeout, 0.1)


def resume_to_the_end(tmp_path, env) -> str:
    """Run the same job again (not slowed) to its last step; its output."""
    done = run_cli(
        "run", "-n", "2", *engine_args(tmp_path / "ckpt", tmp_path / "m.jsonl", "train.log_every=1"),
        env=env, cwd=REPO, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout + done.stderr


def test_checkpoint_on_demand_then_stop_with_a_checkpoint_then_resume_as_one_curve(tmp_path, env, reference):
    job = run_cli("run", "-n", "2", "--detach", "--grace-period", "5",
                  *engine_args(tmp_path / "ckpt", tmp_path / "m.jsonl", *SLOW), env=env, cwd=REPO)  # fmt: skip
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.split()[0]
    try:
        check_on_demand_then_stop(tmp_path, env, reference, job_id)
    finally:  # a failed check must not leave the job running: stopped (a no-op once it has ended)
        run_cli("stop", job_id, env=env, cwd=REPO)


def check_on_demand_then_stop(tmp_path, env, reference, job_id: str) -> None:
    assert past_step(tmp_path, 3)

    asked = run_cli("checkpoint", job_id, "--json", env=env, cwd=REPO)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    first = json.loads(asked.stdout)
    assert (first["job_id"], first["then"]) == (job_id, "continue") and first["step"] >= 3
    assert (tmp_path / "ckpt" / f"step_{first['step']:06d}").is_dir()
    assert past_step(tmp_path, first["step"] + 2)  # the job trains on past the step it saved

    stopped = run_cli("stop", "--checkpoint", job_id, env=env, cwd=REPO)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stopped.stdout.strip() == f"job {job_id} stopped (exit 75)"
    record = json.loads(run_cli("status", job_id, "--json", env=env, cwd=REPO).stdout)
    assert (record["state"], record["exit_code"]) == ("stopped", 75)
    saves = record["report"]["saved_on_request"]
    assert [(s["why"], s["then"]) for s in saves] == [
        ("distlaunch checkpoint", "continue"),
        ("distlaunch stop --checkpoint", "stop"),
    ]
    last = saves[1]["step"]
    assert first["step"] < last < STEPS and latest_step(tmp_path / "ckpt") == last
    # every rank stopped at the step it saved: no step after it is in the metrics, which say why they end there
    assert metrics_steps(tmp_path / "m.jsonl") == list(range(1, last + 1))
    assert [(e["event"], e["at_step"]) for e in events(tmp_path / "m.jsonl")] == [
        ("saved", first["step"]),
        ("stopped", last),
    ]

    output = resume_to_the_end(tmp_path, env)
    assert f"continuing at step {last + 1}" in output
    assert metrics_steps(tmp_path / "m.jsonl") == list(range(1, STEPS + 1))  # one curve: each step once
    assert max_relative(reference.losses, step_losses(tmp_path / "m.jsonl")) <= SAME_LAYOUT_RTOL


def test_the_save_signal_saves_every_rank_at_one_step_then_exits_75(tmp_path, env, reference):
    proc = start(tmp_path, env)
    assert past_step(tmp_path, 3)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, out[-2000:] + err[-2000:]
    saved = latest_step(tmp_path / "ckpt")
    assert f"saved and stopped at step {saved}, asked by SIGUSR1 (exit 75)" in out + err
    assert f"saved the checkpoint of step {saved} (asked by SIGUSR1); stopping here" in out + err
    assert metrics_steps(tmp_path / "m.jsonl") == list(range(1, saved + 1))

    resume_to_the_end(tmp_path, env)
    assert metrics_steps(tmp_path / "m.jsonl") == list(range(1, STEPS + 1))
    assert max_relative(reference.losses, step_losses(tmp_path / "m.jsonl")) <= SAME_LAYOUT_RTOL


def test_sigterm_saves_when_the_measured_save_fits_in_the_grace_period(tmp_path, env):
    # 30 s: room for the measured save and a step even on a loaded machine (it ends as soon as it has saved)
    proc = start(tmp_path, env, "--grace-period", "30")
    assert past_step(tmp_path, 6)  # the step-5 checkpoint timed a save
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    saved = latest_step(tmp_path / "ckpt")
    assert saved > 5, out[-2000:] + err[-2000:]
    assert f"saved the checkpoint of step {saved} before stopping, as asked by SIGTERM" in out + err
    assert metrics_steps(tmp_path / "m.jsonl") == list(range(1, saved + 1))


def test_sigterm_without_time_to_save_says_what_is_lost(tmp_path, env):
    proc = start(tmp_path, env, "--grace-period", "0.1")  # a step alone takes longer
    assert past_step(tmp_path, 7)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]
    assert latest_step(tmp_path / "ckpt") == 5  # no save but the periodic ones
    said = [line for line in err.splitlines() if "no save before the stop" in line]
    assert len(said) == 1, err
    assert re.search(r"more than fits in the 0\.1s grace period \(--grace-period \d+ would fit them\)", said[0])
    assert re.search(r"lost work: the \d+ steps? since the checkpoint of step 5 (?:is|are) lost", out + err), out + err


def test_a_rank_killed_during_the_save_it_was_asked_for_leaves_the_last_good_checkpoint(tmp_path, env):
    # A checkpoint of step 3, then a long run that saves only when asked; the asked save kills rank 1 midway
    # (os._exit after writing its shards, before the publish: what a SIGKILL there leaves).
    first = run_cli("run", "-n", "2", *engine_args(tmp_path / "ckpt", tmp_path / "m.jsonl", "train.steps=3",
                                                   "checkpoint.every=0"), env=env, cwd=REPO)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    crash = ("train.steps=5000", "checkpoint.every=0", "train.log_every=1",
             "fault.rank=1", "fault.kind='crash-in-save'", "fault.step=4")  # fmt: skip
    proc = start(tmp_path, env, overrides=crash)
    assert past_step(tmp_path, 5)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 42, out[-2000:] + err[-2000:]  # the rank's own exit: the save failed
    assert "fault injection: rank 1 crashes while saving the step-" in err
    assert latest_step(tmp_path / "ckpt") == 3
    assert not [
        p.name for p in (tmp_path / "ckpt").iterdir() if re.fullmatch(r"step_\d+", p.name) and p.name != "step_000003"
    ]
    verify = run_cli("checkpoint", "verify", str(tmp_path / "ckpt"), env=env, cwd=REPO)
    assert verify.returncode == 0, verify.stdout + verify.stderr
