"""Stragglers end to end: the engine on 2 real gloo ranks, one slowed by ``fault.kind=slow``; the launcher names it
while the job runs (its output, ``distlaunch status``) and in the report, and ``--on-straggler replace`` takes its
host out at the next checkpoint. The watch's rules and the progress files alone: tests/launcher/test_stragglers.py;
a busy healthy run naming nobody: tests/train/test_no_false_straggler.py."""

from __future__ import annotations

import json
import re

from tests.helpers import invoke, run_cli, wait_until

TINY = ["model.preset='tiny'", "train.global_batch_size=4", "train.seq_len=32", "train.log_every=50"]
SLOW_RANK_1 = ["fault.kind='slow'", "fault.rank=1", "fault.step=5", "fault.factor=3"]


def engine(*sets: str) -> list[str]:
    return ["-m", "distlaunch.engine", *[arg for s in [*TINY, *sets] for arg in ("--set", s)]]


def cli_env() -> dict[str, str]:
    return {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def status(job_id: str) -> dict:
    r = invoke(["status", job_id, "--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_a_slow_rank_is_named_in_its_output_status_and_report_its_peers_never(tmp_path):
    r = run_cli("run", "-n", "2", "--detach", "--json", *engine("train.steps=120", *SLOW_RANK_1), env=cli_env())
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["job_id"]
    seen: dict = {}

    def named_or_ended() -> bool:
        seen.update(status(job_id))
        return bool(seen["stragglers_found"]) or seen["state"] != "running"

    assert wait_until(named_or_ended, 120, interval=0.5)
    assert seen["state"] == "running", "named only after the job ended"  # distlaunch status, while it runs
    assert [s["rank"] for s in seen["stragglers_found"]] == [1]
    assert "straggler  rank 1 on localhost computes" in invoke(["status", job_id]).stdout
    assert wait_until(lambda: status(job_id)["state"] != "running", 120, interval=0.5)
    record = status(job_id)
    assert record["exit_code"] == 0  # warn (the default): the job goes on to its end
    found = record["report"]["stragglers_found"]
    assert [(s["rank"], s["host"]) for s in found] == [(1, "localhost")]
    assert found[0]["factor"] >= 2, found  # 3x slower compute, measured
    logs = invoke(["logs", job_id])  # what the terminal of a foreground run shows, notices included
    output = logs.stdout + logs.stderr
    notice = re.search(r"distlaunch: straggler: rank 1 on localhost computes ([\d.]+)× the median of the other", output)
    assert notice and float(notice[1]) >= 2, output[-3000:]
    assert "straggler: rank 0" not in output


def test_replace_stops_the_job_at_the_next_checkpoint_when_no_spare_can_take_the_host(tmp_path):
    ckpt = tmp_path / "ckpt"
    sets = ["train.steps=300", f"checkpoint.dir='{ckpt}'", "checkpoint.every=20", *SLOW_RANK_1]
    r = run_cli("run", "-n", "2", "--json", "--on-straggler", "replace", *engine(*sets), env=cli_env(), timeout=240)
    report = json.loads(r.stdout)
    assert r.returncode == report["exit_code"] != 0, r.stderr[-3000:]
    assert [s["rank"] for s in report["stragglers_found"]] == [1]
    named_at = report["stragglers_found"][0]["step"]
    stop = re.search(r"replacing straggler localhost after the checkpoint of step (\d+)", r.stderr)
    assert stop, r.stderr[-3000:]
    saved = int(stop[1])
    assert saved % 20 == 0 and named_at < saved < 300  # the first checkpoint after the naming, long before the end
    assert (ckpt / f"step_{saved:06d}").is_dir()
    assert "straggler" in report["stopped_by"] and not report["failures"]  # stopped by distlaunch, no rank failed
