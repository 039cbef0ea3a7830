"""``train.report_to``: TensorBoard event files and a W&B run (offline) get what metrics.jsonl gets, one job is one
run across a crash and its restart with each step once, and what cannot work is one line at the start.

Real ranks, real gloo, the real CLI; the event files are read back with TensorBoard's own reader, the W&B runs from
their ``.wandb`` transaction logs (what ``wandb sync`` uploads).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distlaunch.engine.wandb_run import RUN_FILE, WandbRunRecord, pick_run
from distlaunch.errors import UsageError
from distlaunch.extras import install_command
from distlaunch.training.config import load_config
from distlaunch.training.tracking import TENSORBOARD_FOLDER
from tests.checkpoint.conftest import REPO, cli_env, step_losses
from tests.helpers import distlaunch_cmd, invoke

SMALL = ["model.preset='tiny'", "train.global_batch_size=4", "train.seq_len=32", "train.seed=7"]
BOTH = "train.report_to=tensorboard,wandb"
MISSING_WANDB = (
    "error: train.report_to names wandb, but the wandb package is not installed "
    f"(hint: install it: {install_command('track')})"  # from a checkout: pip install -e '<checkout>[track]'
)


def sets(*overrides: str) -> list[str]:
    return [arg for o in [*SMALL, *overrides] for arg in ("--set", o)]


def wandb_env(tmp: Path, **more: str) -> dict[str, str]:
    """This process's environment less the user's W&B settings, plus W&B offline with its settings and caches
    under ``tmp``, one thread per rank and the repo importable."""
    mine = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    return {
        **mine,
        **cli_env(),
        "NO_COLOR": "1",
        "WANDB_MODE": "offline",
        "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp / "wandb-data"),
        **more,
    }


def run(cmd: list[str], tmp: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``cmd`` in ``tmp`` with ``env`` (default ``wandb_env``), whole: run_cli would add back the user's W&B settings."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env or wandb_env(tmp), cwd=tmp)


def train(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, str | None]:
    """``distlaunch train -n 2 --log-dir tmp/logs ARGS``; the job id it named."""
    r = run(distlaunch_cmd("train", "-n", "2", "--grace-period", "1", "--log-dir", str(tmp / "logs"), *args), tmp, env)
    found = re.search(r"job (dl-[0-9a-f]+) finished", r.stdout + r.stderr)
    return r, found.group(1) if found else None


def curve(events: EventAccumulator, tag: str) -> dict[int, float]:
    """``tag``'s value per step, as TensorBoard shows it; each step at most once, in order."""
    steps = [e.step for e in events.Scalars(tag)]
    assert steps == sorted(set(steps)), (tag, steps)
    return {e.step: e.value for e in events.Scalars(tag)}


def read_events(folder: Path) -> EventAccumulator:
    """Every event file of ``folder``, as TensorBoard shows them (purged steps dropped), nothing sampled away."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def texts(events: EventAccumulator, name: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(f"{name}/text_summary")]


def wandb_records(path: Path):
    """The records of a ``.wandb`` file: a header (":W&B", a key, a version), then LevelDB's log format (blocks of
    32 KiB; a record is crc32, length, kind, then a protobuf ``Record``, split in parts across blocks)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", path
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the tail of a block too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending, pos = pending + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last part of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(path: Path) -> list[dict[str, float]]:
    """The rows a W&B run file holds, each ``{name: value}`` with its ``_step``."""
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def offline_runs(log_dir: Path) -> list[Path]:
    """W&B's offline run folders, oldest first (their names start with the time, to the second)."""
    return sorted((log_dir / "wandb").glob("offline-run-*"))


def test_report_to_takes_a_list_or_names_joined_by_commas():
    assert load_config(None, [BOTH]).train.report_to == ["tensorboard", "wandb"]
    assert load_config(None, ["train.report_to=['wandb', 'wandb']"]).train.report_to == ["wandb"]
    assert load_config(None, ["train.report_to="]).train.report_to == load_config().train.report_to == []
    with pytest.raises(UsageError) as refused:
        load_config(None, ["train.report_to=['tensorboard', 'mlflow']"])
    assert str(refused.value) == (
        "bad value for train.report_to: ['tensorboard', 'mlflow'] (hint: 'mlflow' is not one of: tensorboard, wandb "
        "(one or both, e.g. train.report_to=tensorboard,wandb))"
    )


def test_the_wandb_run_of_a_start_is_the_job_s_whatever_restarted_it(tmp_path):
    job = {"DISTLAUNCH_JOB_ID": "dl-aaaa"}
    assert pick_run(tmp_path, False, job) == WandbRunRecord("dl-aaaa", "dl-aaaa", 0)  # the first start names it
    WandbRunRecord("dl-aaaa", "dl-aaaa", 17).save(tmp_path)
    assert pick_run(tmp_path, False, job) == WandbRunRecord("dl-aaaa", "dl-aaaa", 17)  # a restart before a save
    requeued = {"DISTLAUNCH_JOB_ID": "slurm-12.0"}  # another launch that resumed the job's checkpoint
    assert pick_run(tmp_path, True, requeued) == WandbRunRecord("dl-aaaa", "slurm-12.0", 17)
    assert pick_run(tmp_path, False, requeued) == WandbRunRecord("slurm-12.0", "slurm-12.0", 0)  # a new job
    assert pick_run(tmp_path, True, {**requeued, "WANDB_RUN_ID": "mine"}) == WandbRunRecord("mine", "slurm-12.0", 0)
    assert pick_run(None, True, {"DISTLAUNCH_JOB_ID": "a/b:c"}).run_id == "a-b-c"  # no / or : in a W&B id
    torchrun = {"TORCHELASTIC_RUN_ID": "none"}  # torchrun's default --rdzv-id: the same for every job, so no job
    assert pick_run(tmp_path, True, torchrun) == WandbRunRecord("dl-aaaa", "", 17)
    assert re.fullmatch("[0-9a-f]{12}", pick_run(tmp_path, False, torchrun).run_id)
    (tmp_path / RUN_FILE).write_text("{not json")  # damaged: a new run rather than a failed start
    assert re.fullmatch("[0-9a-f]{12}", pick_run(tmp_path, True, {}).run_id)


def test_an_unknown_tracker_is_one_line_before_any_rank_starts():
    r = invoke(["train", "-n", "2", "--dry-run", *sets("train.report_to=tensorboard,wandbb")])
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr == (
        "error: bad value for train.report_to: 'tensorboard,wandbb' (hint: 'wandbb' is not one of: tensorboard, "
        "wandb (one or both, e.g. train.report_to=tensorboard,wandb))\n"
    )


def test_tensorboard_without_a_log_folder_is_one_line_before_any_rank_starts(tmp_path):
    r = invoke(["train", "-n", "2", "--dry-run", *sets("train.report_to=tensorboard")])
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr == (
        "error: train.report_to names tensorboard, but the job has no log folder for its event files (hint: give "
        "distlaunch train --log-dir DIR (the event files go to DIR/tensorboard/, beside metrics.jsonl) or --metrics-file PATH)\n"
    )
    r = invoke(["train", "-n", "2", "--dry-run", "--log-dir", str(tmp_path), *sets("train.report_to=tensorboard")])
    assert r.exit_code == 0, r.stdout + r.stderr


def test_a_tracker_whose_package_is_missing_is_one_line_at_the_start(tmp_path):
    """An interpreter where ``import wandb`` fails as it does where wandb is not installed: ``sys.modules`` holds
    None for it (Python's own way to make a module unimportable), set by a sitecustomize on PYTHONPATH."""
    (tmp_path / "no-wandb").mkdir()
    (tmp_path / "no-wandb" / "sitecustomize.py").write_text("import sys\n\nsys.modules['wandb'] = None\n")
    env = wandb_env(tmp_path, PYTHONPATH=f"{tmp_path / 'no-wandb'}:{REPO}")
    r, _ = train(tmp_path, *sets("train.steps=1", "train.report_to=wandb"), env=env)
    assert r.returncode == 2 and r.stderr == MISSING_WANDB + "\n", r.stdout[-2000:] + r.stderr[-2000:]
    assert "[rank" not in r.stdout  # the launcher's look: no rank started
    # no launcher to look first: the engine's rank 0 refuses it itself, in the same words, before the first step
    engine = run(
        [sys.executable, "-m", "distlaunch.engine", *sets("train.steps=1", "train.report_to=wandb")], tmp_path, env
    )
    assert engine.returncode == 2 and engine.stderr == MISSING_WANDB + "\n", engine.stdout[-2000:] + engine.stderr
    assert "step 1/" not in engine.stdout


def test_tensorboard_and_wandb_get_every_step_the_eval_loss_and_the_config(tmp_path):
    r, job = train(tmp_path, *sets("train.steps=6", "train.eval_every=3", BOTH))
    assert r.returncode == 0 and job, r.stdout[-3000:] + r.stderr[-3000:]
    assert "warning:" not in r.stdout + r.stderr
    logs = tmp_path / "logs"
    losses = step_losses(logs / "metrics.jsonl")
    assert sorted(losses) == list(range(1, 7))

    events = read_events(logs / TENSORBOARD_FOLDER)
    assert curve(events, "train/loss") == pytest.approx(losses, rel=1e-6)  # event files hold float32
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    val_losses = {r["step"]: r["val_loss"] for r in records if r.get("val_loss") is not None}
    assert list(val_losses) == [3, 6]
    assert curve(events, "eval/val_loss") == pytest.approx(val_losses, rel=1e-6)
    for tag in ("train/lr", "train/grad_norm", "perf/tokens_per_s", "memory/state_bytes", "memory/params_bytes"):
        assert list(curve(events, tag)) == list(range(1, 7)), tag
    assert "perf/mfu" not in events.Tags()["scalars"]  # unknown on a CPU: left out, not logged as 0
    [(step, config)] = texts(events, "config")
    [start] = [r for r in records if r.get("event") == "start"]
    assert step == 1 and json.loads(config) == start["config"]  # the config the ranks resolved, as in metrics.jsonl
    assert texts(events, "layout") == [(1, "dp=2,tp=1,pp=1,zero=1 (2 ranks, cpu)")]
    [(step, summary)] = texts(events, "summary")
    assert step == 6 and json.loads(summary)["final_loss"] == pytest.approx(losses[6])

    # W&B: a run named after the job, its id recorded beside metrics.jsonl (no checkpoint.dir), every step once
    [run] = offline_runs(logs)
    assert run.name.endswith(f"-{job}")
    assert json.loads((logs / RUN_FILE).read_text()) == {"run_id": job, "job": job, "logged_step": 6}
    rows = wandb_history(run / f"run-{job}.wandb")
    assert [row["_step"] for row in rows] == list(range(1, 7))
    assert [row["train/loss"] for row in rows] == pytest.approx([losses[s] for s in range(1, 7)], rel=1e-12)
    assert {row["_step"]: row["eval/val_loss"] for row in rows if "eval/val_loss" in row} == val_losses
    [opened] = [r.run for r in wandb_records(run / f"run-{job}.wandb") if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in opened.config.update}
    assert opened.run_id == job and opened.project == "distlaunch"
    assert {key: config[key] for key in start["config"]} == start["config"] and config["layout"] == start["layout"]


def test_a_crashed_and_resumed_job_is_one_run_with_each_step_once(tmp_path):
    """Rank 1 crashes at the start of step 5; steps 1-4 were logged, the checkpoint is step 3's, so the restart
    runs step 4 again. TensorBoard keeps the restart's step 4; W&B, whose history only grows, keeps the first
    one's and gets 5 and 6 from the restart, in the same run."""
    ckpt = tmp_path / "ckpt"
    crash = ["fault.rank=1", "fault.step=5", "fault.kind='crash'"]
    r, job = train(
        tmp_path, "--max-restarts", "1",
        *sets("train.steps=6", f"checkpoint.dir='{ckpt}'", "checkpoint.every=3", *crash, BOTH),
    )  # fmt: skip
    output = r.stdout + r.stderr
    assert r.returncode == 0 and job, output[-3000:]
    assert "rank 1 crashes at step 5" in output and f"resumed from {ckpt / 'step_000003'} (step 3" in output
    logs = tmp_path / "logs"
    losses = step_losses(logs / "metrics.jsonl")  # a step run twice keeps its last value

    events = read_events(logs / TENSORBOARD_FOLDER)
    assert len(list((logs / TENSORBOARD_FOLDER).iterdir())) == 2  # one event file per attempt
    assert list(curve(events, "train/loss")) == list(range(1, 7))  # step 4 once, the restart's
    assert curve(events, "train/loss") == pytest.approx(losses, rel=1e-6)
    assert [step for step, _ in texts(events, "config")] == [1, 4]  # each attempt says what it ran with

    # one W&B run for both attempts: the id recorded in checkpoint.dir, where the restart found it
    first, second = offline_runs(logs)
    assert first.name.endswith(f"-{job}") and second.name.endswith(f"-{job}")
    assert json.loads((ckpt / RUN_FILE).read_text()) == {"run_id": job, "job": job, "logged_step": 6}
    verified = invoke(["checkpoint", "verify", str(ckpt)])  # the record beside the checkpoints is not one of them
    assert verified.exit_code == 0 and verified.stdout.count("ok ") == 2, verified.stdout + verified.stderr
    # W&B keeps what the crashed attempt sent only up to its last flush to disk (every 15 s by default), so its
    # file may hold fewer rows; together they never hold a step twice, and the restart sent only 5 and 6
    steps = [row["_step"] for run in (first, second) for row in wandb_history(run / f"run-{job}.wandb")]
    assert steps == sorted(set(steps)) and steps[-2:] == [5, 6]
    assert [row["_step"] for row in wandb_history(second / f"run-{job}.wandb")] == [5, 6]


def test_a_tracker_that_fails_is_one_warning_and_the_training_goes_on(tmp_path):
    """TensorBoard's folder is taken by a file (it cannot start), and W&B online cannot reach its server (a closed
    port): one warning each on rank 0, and the job trains to its end. One process, no launcher."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / TENSORBOARD_FOLDER).write_text("not a folder")
    dead_server = {
        "WANDB_MODE": "online",
        "WANDB_BASE_URL": "http://127.0.0.1:9",  # nothing listens there
        "WANDB_API_KEY": "0" * 40,
        "WANDB_INIT_TIMEOUT": "1",  # W&B still retries ~10 s before it gives up
    }
    engine = [sys.executable, "-m", "distlaunch.engine", "--metrics-file", str(logs / "metrics.jsonl")]
    done = run([*engine, *sets("train.steps=2", BOTH)], tmp_path, wandb_env(tmp_path, **dead_server))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, done.stderr[-3000:]
    assert warnings[0].startswith("warning: tensorboard could not start (") and warnings[0].endswith(
        "): the training goes on without it"
    )
    assert warnings[1].startswith("warning: wandb could not start (")
    assert sorted(step_losses(logs / "metrics.jsonl")) == [1, 2]
