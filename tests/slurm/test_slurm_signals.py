"""On the real Slurm cluster: one SIGINT or SIGTERM to ``distlaunch slurm run`` gives every rank SIGTERM, waits the
grace period, then SIGKILL, and the report says what happened; a distlaunch killed outright takes srun and its
ranks with it."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import children, distlaunch_cmd, running, wait_until

SCRIPTS = Path(__file__).parent / "scripts"
RANKS = (0, 1)


def start(cluster, tmp_path: Path, mode: str, grace: str) -> subprocess.Popen:
    argv = distlaunch_cmd(
        "slurm", "run", "-N", "2", "--ntasks-per-node", "1", "--grace-period", grace,
        str(SCRIPTS / "trap_term.py"), str(tmp_path), mode,
    )  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    ready = wait_until(lambda: all((tmp_path / f"ready-{r}").exists() for r in RANKS), timeout=90)
    if not ready:
        proc.kill()
        pytest.fail("ranks did not start: " + "".join(proc.communicate(timeout=30)))
    return proc


def rank_alive(tmp_path: Path, rank: int) -> bool:
    # the rank's pid, from its own file: this test started it (through Slurm on this machine)
    return running(int((tmp_path / f"ready-{rank}").read_text()))


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_one_signal_gives_every_rank_sigterm_and_they_end_in_the_grace_period(slurm_cluster, tmp_path, sig, code):
    proc = start(slurm_cluster, tmp_path, "exit", "30")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, out + err
    assert all((tmp_path / f"term-{r}").exists() for r in RANKS), err  # every rank's SIGTERM handler ran
    assert not any((tmp_path / f"ended-{r}").exists() for r in RANKS)
    report = [line for line in err.splitlines() if line.startswith("distlaunch: interrupted by")]
    assert len(report) == 1, err
    assert report[0].startswith(f"distlaunch: interrupted by {sig.name}; sent SIGTERM to every rank of step ")
    assert report[0].endswith(f"; the ranks ended within the 30 s grace period (exit {code})")


def test_the_save_signal_leaves_a_program_that_does_not_trap_it_running(slurm_cluster, tmp_path):
    """SIGUSR1 (the save signal) is passed on to every rank; a rank that never traps it ignores it (it starts with
    the signal ignored) instead of dying of it. Its SIGTERM handler still runs on a SIGTERM, which is not preceded
    by the save signal: a plain script is not known to save on it."""
    proc = start(slurm_cluster, tmp_path, "exit", "30")
    proc.send_signal(signal.SIGUSR1)
    time.sleep(3)  # the save signal reached every rank (scancel --signal=USR1 takes well under a second)
    assert proc.poll() is None and all(rank_alive(tmp_path, r) for r in RANKS)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert all((tmp_path / f"term-{r}").exists() for r in RANKS), err
    report = [line for line in err.splitlines() if line.startswith("distlaunch: interrupted by")]
    assert len(report) == 1 and report[0].startswith("distlaunch: interrupted by SIGTERM; sent SIGTERM to every rank")


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period(slurm_cluster, tmp_path):
    proc = start(slurm_cluster, tmp_path, "ignore", "2")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert all((tmp_path / f"term-{r}").exists() for r in RANKS), err  # SIGTERM first...
    assert wait_until(lambda: not any(rank_alive(tmp_path, r) for r in RANKS), timeout=30)  # ...then SIGKILL
    assert not any((tmp_path / f"ended-{r}").exists() for r in RANKS)
    report = [line for line in err.splitlines() if line.startswith("distlaunch: interrupted by")]
    assert len(report) == 1 and "; after the 2 s grace period, sent SIGKILL (exit 130)" in report[0], err


def test_a_distlaunch_killed_outright_leaves_no_srun_and_no_rank_behind(slurm_cluster, tmp_path):
    """srun runs in its own process group (a terminal's Ctrl-C goes to distlaunch alone), so a SIGKILL to
    distlaunch left it, its step and every rank running; srun now gets SIGTERM when distlaunch dies."""
    proc = start(slurm_cluster, tmp_path, "exit", "30")
    srun = [pid for pid in children(proc.pid) if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"srun")]
    assert len(srun) == 1, children(proc.pid)
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_until(lambda: not running(srun[0]), timeout=60), "srun outlived distlaunch"
    assert wait_until(lambda: not any(rank_alive(tmp_path, r) for r in RANKS), timeout=60), "ranks left running"
    assert not any((tmp_path / f"ended-{r}").exists() for r in RANKS)


def test_ctrl_c_while_srun_waits_for_its_allocation_withdraws_it_at_once(slurm_cluster, tmp_path):
    """Both nodes held by another job: srun says its job is queued. Ctrl-C then sends srun SIGTERM at once
    (there is no step to look for yet), and no rank starts once the nodes come free."""
    held = slurm_cluster.client(
        "sbatch", "--parsable", "-N", "2", "--exclusive", "-o", str(tmp_path / "holder.out"), "--wrap", "sleep 300"
    )
    assert held.returncode == 0, held.stderr
    holder = held.stdout.strip().split(";")[0]
    try:
        argv = distlaunch_cmd(
            "slurm", "run", "-N", "2", "--ntasks-per-node", "1", str(SCRIPTS / "trap_term.py"), str(tmp_path), "exit"
        )
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slurm_cluster.env)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        assert wait_until(lambda: any("queued and waiting for resources" in line for line in lines), timeout=60), lines
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
        reader.join(10)
        assert proc.returncode == 130, lines
        assert took < 5, f"stopping a queued srun took {took:.1f}s"  # it looked for a step for 10 s before
        report = [line for line in lines if line.startswith("distlaunch: interrupted by SIGINT")]
        assert report and "srun still waited for its allocation; it was sent SIGTERM, and no rank started" in report[0]
    finally:
        slurm_cluster.client("scancel", holder)
    time.sleep(3)  # the nodes are free now: a request that was not withdrawn would start its ranks
    assert not list(tmp_path.glob("ready-*"))
