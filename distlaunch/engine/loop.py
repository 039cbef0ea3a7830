"""The training loop of one rank: set up, step, report, clean up."""

from __future__ import annotations

import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import distlaunch
from distlaunch.contract.layout import spelling
from distlaunch.engine.checkpoint.session import Checkpointing
from distlaunch.engine.compute import StepClock
from distlaunch.engine.memory import device_peak_bytes, peak_rss_bytes
from distlaunch.engine.metrics import MetricsWriter, flops_per_token, peak_flops
from distlaunch.engine.model import num_params
from distlaunch.engine.parallel.compile import compile_enabled
from distlaunch.engine.parallel.mesh import DistEnv, build_mesh, init_process_group, pick_device
from distlaunch.engine.progress import ProgressReport, curve_wanted, write_loss_curve
from distlaunch.engine.tracking import open_tracking
from distlaunch.engine.trainer import Engine, StepResult, read_results
from distlaunch.errors import DistlaunchError
from distlaunch.training.config import TrainingConfig
from distlaunch.training.dims import ParallelDims, resolve_parallel_dims
from distlaunch.training.places import create_checkpoint_dir, hold_checkpoint_dir
from distlaunch.training.presets import model_config


def step_record(engine: Engine, result: StepResult, mfu_scale: float | None) -> dict[str, Any]:
    """The per-step metrics line (the documented keys, plus the memory breakdown)."""
    tokens = engine.cfg.train.global_batch_size * engine.cfg.train.seq_len
    tokens_per_s = tokens / result.seconds
    mem = engine.state_bytes()
    return {
        "step": result.step,
        "loss": None,  # read with the interval's other steps (fill_pending)
        "lr": result.lr,
        "grad_norm": None,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * mfu_scale if mfu_scale else None,
        "mem_bytes": mem["total"],
        "mem": mem,  # rank 0's params / grads / optimizer bytes, measured from storages
        "device_peak_bytes": device_peak_bytes(engine.device),
        "step_time_s": result.seconds,
        "skipped": result.skipped,
        "loss_scale": engine.scaler.scale if engine.scaler.enabled else None,
    }


def train_one_step(engine: Engine, step: int, mfu_scale: float | None) -> tuple[StepResult, dict[str, Any]]:
    """Step ``step`` and, when due, the held-out evaluation; returns the result and its metrics
    record, whose ``loss`` and ``grad_norm`` are filled in by ``fill_pending``."""
    result = engine.train_step(step)
    record = step_record(engine, result, mfu_scale)
    every = engine.cfg.train.eval_every
    if every and (step % every == 0 or step == engine.cfg.train.steps):
        record["val_loss"] = engine.evaluate()
    return result, record


def read_due(cfg: TrainingConfig, step: int, first_step: int, evaluated: bool, saving: bool) -> bool:
    """Whether the pending records are read (one host sync) and written after ``step``: the first
    step run, every ``train.log_every`` steps, the last step, an evaluation, a checkpoint save, and
    the step before an injected fault.

    The first step is read on its own because it carries the warm-up (compilation, allocator growth,
    pipeline shape inference): on an accelerator a record's time is its interval's mean, and a
    warm-up averaged into the next steps would understate their tokens/s and MFU."""
    return (
        step == first_step
        or step % cfg.train.log_every == 0
        or step == cfg.train.steps
        or evaluated
        or saving
        or (cfg.fault.step is not None and step + 1 >= cfg.fault.step)
    )


def fill_pending(
    engine: Engine, pending: list[tuple[StepResult, dict[str, Any]]], seconds: float, mfu_scale: float | None
) -> None:
    """Fill in the pending records' loss and grad norm with one device-to-host copy. On an
    accelerator a step's host time says little (the host runs ahead), so each record gets the
    mean step time of the interval, measured up to this synchronising read."""
    values = read_results([result for result, _ in pending])
    for (_, record), (loss, norm) in zip(pending, values, strict=True):
        record["loss"], record["grad_norm"] = loss, norm
        if engine.device.type != "cpu":
            tokens = engine.cfg.train.global_batch_size * engine.cfg.train.seq_len
            record["step_time_s"] = seconds / len(pending)
            record["tokens_per_s"] = tokens / record["step_time_s"]
            record["mfu"] = record["tokens_per_s"] * mfu_scale if mfu_scale else None


def summarize(engine: Engine, records: list[dict[str, Any]], mfu_scale: float | None) -> dict[str, Any]:
    """The final record (identical on every rank; gathers every rank's state bytes)."""
    cfg, dims = engine.cfg, engine.dims
    per_rank: list[Any] = [None] * dims.world_size
    dist.all_gather_object(per_rank, engine.state_bytes())
    # each rank's peaks: until its model was built, and over the whole run (memory.py)
    peaks: list[Any] = [None] * dims.world_size
    dist.all_gather_object(
        peaks, (engine.init_peak, {"rss_bytes": peak_rss_bytes(), "device_bytes": device_peak_bytes(engine.device)})
    )
    # the first step includes the warm-up and is read on its own (``read_due``): left out
    # (no records at all: resumed from the checkpoint of the last step, nothing left to run)
    steady = [r["tokens_per_s"] for r in records[1:]] or [r["tokens_per_s"] for r in records] or [0.0]
    evals = [r["val_loss"] for r in records if r.get("val_loss") is not None]
    tokens_per_s = statistics.median(steady)
    return {
        "event": "summary",
        "steps": cfg.train.steps,
        "final_loss": records[-1]["loss"] if records else None,
        "first_loss": records[0]["loss"] if records else None,
        "final_val_loss": evals[-1] if evals else None,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * mfu_scale if mfu_scale else None,
        "skipped_steps": engine.scaler.skipped_steps,
        "layout": spelling(dims, pipeline=False),
        "world_size": dims.world_size,
        "preset": cfg.model.preset,
        "precision": cfg.train.precision,
        "n_params": num_params(engine.model_cfg),
        "mem_bytes_per_rank": per_rank,
        "init_peak_per_rank": [init for init, _ in peaks],
        "peak_per_rank": [run for _, run in peaks],
    }


def status_metrics(record: dict[str, Any]) -> dict[str, float]:
    """What of a step's record the launcher's status line shows (distlaunch.progress's ``metrics``)."""
    return {k: record[k] for k in ("loss", "tokens_per_s", "mfu") if record.get(k) is not None}


def answer_request(asked: distlaunch.SaveRequest, step: int, writer: MetricsWriter, progress: ProgressReport) -> None:
    """Say that the checkpoint of ``step`` was saved as asked: a line on rank 0's output and in the metrics (an
    event, without a ``step`` key: a reader of the curve counts each step once)."""
    stopping = asked.then == "stop"
    writer.write({"event": "stopped" if stopping else "saved", "at_step": step, "why": asked.why})
    then = "stopping here: the next start resumes from it" if stopping else "training goes on"
    progress.say(f"saved the checkpoint of step {step} (asked by {asked.why}); {then}", stop=stopping)


def train(
    engine: Engine, writer: MetricsWriter, rank: int, first_step: int = 1, checkpoints: Checkpointing | None = None
) -> dict[str, Any] | None:
    """Run steps ``first_step``..``train.steps``; returns the summary record (identical on every rank), or None
    when the ranks stopped early because a save-and-stop was asked (its checkpoint saved).

    ``checkpoints`` (after its ``start``, which resumes and gives ``first_step``) saves when due or asked,
    guards each step with the watchdog and injects the configured fault.
    """
    checkpoints = checkpoints or Checkpointing(engine, rank)
    cfg, dims = engine.cfg, engine.dims
    peak = peak_flops(engine.device, cfg.train.precision)
    mfu_scale = flops_per_token(engine.model_cfg, cfg.train.seq_len) / (peak * dims.world_size) if peak else None
    progress = ProgressReport(cfg.train.steps, cfg.train.log_every, enabled=rank == 0, first_step=first_step)
    started = time.perf_counter()
    records = []
    pending: list[tuple[StepResult, dict[str, Any]]] = []
    interval_start = time.perf_counter()
    clock = StepClock(engine.device)
    shown: dict[str, float] = {}  # the newest read step's figures, for the launcher's status line
    # the checkpoint a replacement would resume from: the one resumed, 0 (the start) before the first save
    saved_step = first_step - 1 if cfg.checkpoint.dir is not None else None
    for step in range(first_step, cfg.train.steps + 1):
        with checkpoints.step(step):
            with clock:
                result, record = train_one_step(engine, step, mfu_scale)
            measured = clock.compute_s  # None on an accelerator (compute.py): a slow fault goes by the step's time
            added = checkpoints.fault.slow_down(step, rank, result.seconds if measured is None else measured)
        pending.append((result, record))
        asked = checkpoints.asked(step)  # every rank the same answer: they all save this step, or none does
        saving = checkpoints.due(step) or asked is not None
        if read_due(cfg, step, first_step, record.get("val_loss") is not None, saving):
            fill_pending(engine, pending, time.perf_counter() - interval_start, mfu_scale)
            for _, done in pending:
                records.append(done)
                writer.write(done)
                progress.update(done)
            pending.clear()
            shown = status_metrics(records[-1])
        checkpoints.after_step(step, asked=asked is not None)
        saved_step = step if saving else saved_step
        # every rank: the launcher's --hang-timeout counts from the last step, its straggler watch compares compute
        compute_s = None if measured is None else measured + added  # the slow fault's spin is compute too
        distlaunch.progress(
            step=step,
            compute_s=compute_s,
            saved_step=saved_step,
            save_s=checkpoints.save_s,
            total_steps=cfg.train.steps,
            metrics=shown,
        )
        if asked is not None:
            answer_request(asked, step, writer, progress)
            if asked.then == "stop":
                return None  # every rank stops here; the next start resumes at step + 1
        if not pending:
            interval_start = time.perf_counter()
    summary = summarize(engine, records, mfu_scale)
    summary["wall_s"] = time.perf_counter() - started
    if rank == 0 and writer.path is not None and records:  # no steps run: the last run's curve stays
        curve = write_loss_curve(records, writer.path.with_name("loss_curve.png")) if curve_wanted() else None
        summary["loss_curve"] = str(curve) if curve else None
    progress.finish(summary)
    return summary


def open_outputs(cfg: TrainingConfig, rank: int, metrics_file: Path | None) -> tuple[MetricsWriter, int | None]:
    """Rank 0 creates ``checkpoint.dir`` and holds it for this job (the descriptor of its lock, to close at
    the end), and opens the metrics file before anything is built, so a place it cannot write, or one
    another job trains into, is one line at the start instead of a traceback at the first save, hours
    later. Collective: every rank gets rank 0's refusal and stops with it."""
    writer, refusal, lock = MetricsWriter(None, enabled=False), None, None
    if rank == 0:
        try:
            if cfg.checkpoint.dir is not None:
                root = Path(cfg.checkpoint.dir).expanduser()
                create_checkpoint_dir(root)
                job = os.environ.get("DISTLAUNCH_JOB_ID")
                lock = hold_checkpoint_dir(
                    root, f"{f'job {job}' if job else 'a job'} (rank 0, pid {os.getpid()} on {socket.gethostname()})"
                )
            tracking = open_tracking(cfg.train.report_to, metrics_file, cfg.checkpoint.dir)
            writer = MetricsWriter(metrics_file, enabled=True, tracking=tracking)
        except DistlaunchError as err:
            refusal = err
    shared = [refusal]
    dist.broadcast_object_list(shared, src=0)
    if shared[0] is not None:
        if lock is not None:
            os.close(lock)
        raise shared[0]
    return writer, lock


def run(cfg: TrainingConfig, env: DistEnv, metrics_file: Path | None) -> dict[str, Any] | None:
    """Validate the layout, start the process group, train, and tear down. None when a resumed
    checkpoint already reaches ``train.steps`` (nothing is trained and nothing is written to the
    metrics: its last summary stays the run's), or when the ranks stopped after a save asked of them."""
    dims: ParallelDims = resolve_parallel_dims(cfg, model_config(cfg.model.preset, cfg.data.path), env.world_size)
    device = pick_device(env.local_rank, env.backend)
    distlaunch.progress(status="joining the process group")
    init_process_group(env, device)
    writer, lock = MetricsWriter(None, enabled=False), None
    try:
        writer, lock = open_outputs(cfg, env.rank, metrics_file)
        distlaunch.progress(status="building the model")
        engine = Engine(cfg, dims, build_mesh(dims, device), device)
        checkpoints = Checkpointing(engine, env.rank)
        if cfg.checkpoint.dir is not None:
            distlaunch.progress(status="reading the checkpoint")
        first_step = checkpoints.start()  # resumes from a checkpoint when there is one to resume
        # what the status line says until the first step is done: torch.compile does its work there
        compiling = compile_enabled(cfg.train.compile, device)
        distlaunch.progress(status="first step, compiling" if compiling else "first step")
        if first_step > cfg.train.steps:  # the checkpoint already reaches the last step (start said so)
            return None
        writer.write(
            {
                "event": "start",
                "first_step": first_step,  # 1, or the step after the checkpoint resumed (each tracker starts there)
                "layout": spelling(dims, pipeline=False),
                "world_size": dims.world_size,
                "device": str(device),
                "config": cfg.model_dump(),
            }
        )
        summary = train(engine, writer, env.rank, first_step, checkpoints)
        if summary is not None:  # None: stopped after a save asked of it; the run's summary comes at its end
            writer.write(summary)
        return summary
    finally:
        writer.close()
        if lock is not None:
            os.close(lock)  # checkpoint.dir is free for the next job (a restart's rank 0 included)
        if dist.is_initialized():
            dist.destroy_process_group()
        if device.type == "cuda":
            torch.cuda.empty_cache()
