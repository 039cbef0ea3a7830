"""On the real Slurm cluster: time limits and preemption lose no step. Slurm warns a batch job ahead of its time
limit (``#SBATCH --signal=B:USR1@LEAD``), every rank of the bundled engine saves the same step, ``distlaunch slurm
run`` requeues the job, and the next run resumes there: one job, one output file, one metrics stream. A SIGTERM to
the batch job (a preemption) saves first too, then requeues, or exits 143 with ``--no-requeue``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

from distlaunch.slurm.jobstate import job_fields
from tests.helpers import distlaunch_cmd, wait_until

# A constant learning rate: train.steps changes no number, so the reference can run the steps the job ran in one go.
# The rest is written out as the 1e-6 bar below was measured with (lr 1e-3, no warmup, no decay, no evaluation):
# the job's ranks (one per node) compute with all the cores, the reference's (two on one host) with one thread
# each, so their sums may round differently, and the engine's default lr (3e-3) took that past the bar (3e-6).
CONFIG = """\
[model]
preset = "tiny"
[train]
steps = {steps}
lr = 1e-3
lr_schedule = "constant"
warmup_steps = 0
weight_decay = 0.0
log_every = 1
eval_every = 0
seed = 7
"""
SAVED = re.compile(
    r"^distlaunch: SIGUSR1 \(the save signal\); sent SIGUSR1 to every rank of step \d+\.\d+; rank 0 saved the "
    r"checkpoint of step (\d+); requeued Slurm job (\d+): it resumes there \(exit 75\)$",
    re.M,
)


class Job:
    """One training job of the bundled engine in ``tmp_path``, through the real CLI against the test cluster."""

    def __init__(self, cluster, folder: Path, steps: int, name: str = "train"):
        self.cluster, self.folder = cluster, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.config, self.ckpt, self.metrics = folder / f"{name}.toml", folder / "ckpt", folder / "metrics.jsonl"
        self.config.write_text(CONFIG.format(steps=steps))
        self.env = {**cluster.env, "DISTLAUNCH_STATE_DIR": str(folder / "state")}
        self.slurm_id: str | None = None

    def engine(self) -> list[str]:
        return ["-m", "distlaunch.engine", str(self.config), "--set", f"checkpoint.dir={self.ckpt}",
                "--metrics-file", str(self.metrics)]  # fmt: skip

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            distlaunch_cmd(*args), capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.folder
        )

    def submit(self, *sbatch: str) -> str:
        shape = ["-N", "2", "--ntasks-per-node", "1", "--backend", "gloo", "-o", "out-%j.log"]
        done = self.cli("slurm", "sbatch", *shape, *sbatch, *self.engine())
        assert done.returncode == 0, done.stderr
        self.slurm_id = done.stdout.split()[-1]
        return self.slurm_id

    def fields(self) -> dict[str, str]:
        return job_fields(self.cluster.client("scontrol", "show", "job", "-o", self.slurm_id).stdout)

    def output(self) -> str:
        path = self.folder / f"out-{self.slurm_id}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def records(self) -> list[dict]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def steps(self) -> list[int]:
        return [r["step"] for r in self.records() if "step" in r]

    def ended(self, timeout: float) -> dict[str, str]:
        final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
        assert wait_until(lambda: self.fields().get("JobState") in final, timeout, interval=0.5), self.fields()
        return self.fields()


def saved_steps(job_id: str, env: dict[str, str]) -> dict[int, int]:
    """Every rank's record of its newest checkpoint, in the job's folder under the job's state directory."""
    folder = Path(env["DISTLAUNCH_STATE_DIR"]) / "jobs" / job_id / "saved"
    return {
        int(p.stem.removeprefix("rank")): json.loads(p.read_text())["saved_step"] for p in folder.glob("rank*.json")
    }


def stopped_at(job: Job) -> list[int]:
    return [r["at_step"] for r in job.records() if r.get("event") == "stopped"]


class Reference:
    """The same config trained in one go, uninterrupted (2 ranks, gloo, on this machine), beside the job's last run."""

    def __init__(self, job: Job, steps: int):
        self.config, self.metrics = job.folder / "reference.toml", job.folder / "reference.jsonl"
        self.config.write_text(CONFIG.format(steps=steps))
        argv = ["-m", "distlaunch.engine", str(self.config), "--set", f"checkpoint.dir={job.folder / 'reference-ckpt'}",
                "--metrics-file", str(self.metrics)]  # fmt: skip
        self.proc = subprocess.Popen(
            distlaunch_cmd("run", "-n", "2", "--backend", "gloo", *argv),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job.env, cwd=job.folder,
        )  # fmt: skip

    def losses(self) -> dict[int, float]:
        try:
            _, err = self.proc.communicate(timeout=300)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert self.proc.returncode == 0, err[-3000:]
        records = map(json.loads, self.metrics.read_text().splitlines())
        return {r["step"]: r["loss"] for r in records if "step" in r}


def test_a_one_minute_job_finishes_through_two_requeues_with_every_step_once(slurm_cluster, tmp_path):
    """A 1-minute time limit, warned 10 s ahead: Slurm checks limits every 30 s, so the warning comes 10 to 40 s
    before the end, and the requeued runs (which start about 15 s after such a check) get it some 45 s in.

    The job is submitted with more steps than many time limits hold (train.steps = 10000). Once Slurm has requeued
    it twice, the test holds it, lowers train.steps in its config file to the saved step + 2 (each run reads its
    config again), and releases it: the third run finishes, and the test takes three runs, not as many as the
    machine's speed would make of a fixed number of steps."""
    job = Job(slurm_cluster, tmp_path, steps=10000)
    started = time.monotonic()
    slurm_id = job.submit("-t", "1", "--signal-lead", "10")
    assert wait_until(lambda: int(job.fields().get("Restarts", 0)) >= 2, 300, interval=0.5), job.output()[-3000:]
    held = slurm_cluster.client("scontrol", "hold", slurm_id)
    assert held.returncode == 0, held.stderr  # pending for cred_expire (10 s) after the requeue: held in time
    saved = stopped_at(job)
    assert len(saved) == 2, job.output()[-3000:]
    last = saved[-1] + 2
    job.config.write_text(CONFIG.format(steps=last))
    assert slurm_cluster.client("scontrol", "release", slurm_id).returncode == 0
    reference = Reference(job, last)  # trains while the job's last run does
    final = job.ended(300)
    took = time.monotonic() - started

    assert (final["JobState"], final["ExitCode"]) == ("COMPLETED", "0:0"), (final, job.output()[-3000:])
    assert int(final["Restarts"]) == 2 and final["TimeLimit"] == "00:01:00"
    out = job.output()
    assert [int(m[1]) for m in SAVED.finditer(out)] == saved and {m[2] for m in SAVED.finditer(out)} == {slurm_id}
    for step in saved:
        assert f"0: resumed from {job.ckpt}/step_{step:06d} (step {step}," in out, out[-3000:]
    assert "DUE TO TIME LIMIT" not in out  # never killed by the limit: each run saved and requeued itself first

    # one metrics stream: every step once, in order, a "stopped" event at each save, one summary at the end
    assert job.steps() == list(range(1, last + 1)), job.steps()
    assert [r.get("why") for r in job.records() if r.get("event") == "stopped"] == ["SIGUSR1", "SIGUSR1"]
    assert sum(r.get("event") == "summary" for r in job.records()) == 1

    losses, reference = {r["step"]: r["loss"] for r in job.records() if "step" in r}, reference.losses()
    assert abs(losses[last] - reference[last]) <= 1e-6 * abs(reference[last]), (losses[last], reference[last])
    worst = max(abs(losses[s] - reference[s]) / abs(reference[s]) for s in reference)
    assert worst <= 1e-6, f"a resumed step's loss differs from the uninterrupted run's by {worst:.2e}"

    # still one distlaunch job, which says how often Slurm requeued it
    status = job.cli("status", slurm_id)
    assert re.search(r"^  restarts\s+2$", status.stdout, re.M) and "succeeded" in status.stdout, status.stdout
    print(f"one-minute job through two requeues: {took:.0f}s")


def test_sigterm_to_the_batch_job_saves_then_requeues_or_exits_143(slurm_cluster, tmp_path):
    """``scancel --batch --signal=TERM`` (what a preemption's grace time sends the batch shell) mid-run: the ranks get
    the save signal first and save the same step; the default job then requeues itself and finishes from there, the
    ``--no-requeue`` job ends with 143. Both jobs run at once (the two nodes have room for both)."""
    requeued = Job(slurm_cluster, tmp_path / "requeued", steps=30)
    ended = Job(slurm_cluster, tmp_path / "ended", steps=30)
    requeued.submit("--grace-period", "30")
    ended.submit("--grace-period", "30", "--no-requeue")
    for job in (requeued, ended):
        assert wait_until(lambda job=job: len(job.steps()) >= 2, 180, interval=0.2), job.output()[-3000:]
        sent = slurm_cluster.client("scancel", "--batch", "--signal=TERM", job.slurm_id)
        assert sent.returncode == 0, sent.stderr

    first = ended.ended(180)
    assert (first["JobState"], first["ExitCode"], first["Restarts"]) == ("FAILED", "143:0", "0"), ended.output()
    [step] = stopped_at(ended)
    assert ended.steps() == list(range(1, step + 1)) and (ended.ckpt / "latest").read_text().strip() == (
        f"step_{step:06d}"
    )
    line = next(line for line in ended.output().splitlines() if line.startswith("distlaunch: interrupted by"))
    assert re.fullmatch(
        r"distlaunch: interrupted by SIGTERM; sent SIGUSR1 \(the save signal\) to every rank of step \d+\.0 first; "
        rf"the ranks ended within the 30 s grace period; rank 0 saved the checkpoint of step {step} \(exit 143\)",
        line,
    ), line

    final = requeued.ended(240)
    assert (final["JobState"], final["Restarts"]) == ("COMPLETED", "1"), requeued.output()[-3000:]
    [step] = stopped_at(requeued)
    out = requeued.output()
    assert re.search(
        r"^distlaunch: interrupted by SIGTERM; sent SIGUSR1 \(the save signal\) to every rank of step \d+\.0 first; "
        rf"the ranks ended within the 30 s grace period; rank 0 saved the checkpoint of step {step}; requeued Slurm "
        rf"job {requeued.slurm_id}: it resumes there \(exit 75\)$",
        out,
        re.M,
    ), out[-3000:]
    assert f"0: resumed from {requeued.ckpt}/step_{step:06d}" in out
    assert requeued.steps() == list(range(1, 31))


def test_the_save_signal_to_slurm_run_saves_and_exits_75_and_a_second_run_resumes(slurm_cluster, tmp_path):
    """Outside a batch job (no --requeue): SIGUSR1 to ``distlaunch slurm run`` passes on to every rank, which saves
    and stops; exit 75 says so. Started again, the job resumes at the next step."""
    job = Job(slurm_cluster, tmp_path, steps=30)
    argv = distlaunch_cmd("slurm", "run", "-N", "2", "--ntasks-per-node", "1", "--backend", "gloo", *job.engine())
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job.env, cwd=tmp_path)
    try:
        assert wait_until(lambda: len(job.steps()) >= 2, 180, interval=0.2), "no step trained"
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    [step] = stopped_at(job)
    assert re.search(
        r"^distlaunch: SIGUSR1 \(the save signal\); sent SIGUSR1 to every rank of step \d+\.0; rank 0 saved the "
        rf"checkpoint of step {step}; requeue the job \(or start it again\) and it resumes there \(exit 75\)$",
        err,
        re.M,
    ), err[-3000:]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=job.env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {job.ckpt}/step_{step:06d} (step {step}," in again.stdout
    assert job.steps() == list(range(1, 31))


def test_a_checkpoint_on_demand_then_stop_with_a_checkpoint(slurm_cluster, tmp_path):
    """``distlaunch checkpoint slurm-N``: every rank saves one step (the checkpoint signal, USR2, through the batch
    script's distlaunch) and trains on. ``distlaunch stop --checkpoint slurm-N``: the save signal, every rank saves
    and the job requeues itself, as before a time limit; the requeued job is cancelled while it waits."""
    job = Job(slurm_cluster, tmp_path, steps=100000)
    job.submit()
    assert wait_until(lambda: len(job.steps()) >= 2, 180, interval=0.2), job.output()[-3000:]
    asked = job.cli("checkpoint", f"slurm-{job.slurm_id}", "--json", timeout=300)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    first = json.loads(asked.stdout)["step"]
    assert (job.ckpt / f"step_{first:06d}").is_dir()
    # confirmed by what every rank recorded in the job's folder (slurm/saves.py), not by the job's output
    assert saved_steps(f"slurm-{job.slurm_id}", job.env) == {0: first, 1: first}
    assert wait_until(lambda: len(job.steps()) >= first + 2, 120, interval=0.2)  # it trains on
    done = job.cli("stop", "--checkpoint", f"slurm-{job.slurm_id}", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().startswith(f"job slurm-{job.slurm_id} stopped"), done.stdout
    [step] = stopped_at(job)
    assert step > first and (job.ckpt / "latest").read_text().strip() == f"step_{step:06d}"
    assert job.steps() == list(range(1, step + 1))
    assert job.fields()["JobState"] == "CANCELLED"
