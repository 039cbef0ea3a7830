"""TensorBoard and Weights & Biases (``train.report_to``): rank 0 sends them what metrics.jsonl carries.

Both get every step's figures (loss, lr, grad norm, tokens/s, MFU where known, memory, the eval loss), the
resolved config and the layout at each start, and the summary at the end. ``Tracking`` is fed the records of
metrics.jsonl as they are written (``MetricsWriter``), so the three never disagree.

- TensorBoard: event files in ``tensorboard/`` beside metrics.jsonl (``--log-dir DIR``: ``DIR/tensorboard/``),
  written with ``torch.utils.tensorboard``; a job without a metrics place is refused at start.
- W&B: ``wandb.init`` as the user's WANDB_* settings say (WANDB_MODE online or offline, WANDB_PROJECT, default
  "distlaunch", WANDB_DIR, default the folder of metrics.jsonl).

One job is one run across restarts, shrinks, spares and requeues, each step in it once, the step axis only
moving forward. A start that resumes the checkpoint of step 15 after a crash at step 17 runs 16 and 17 again:

- TensorBoard: ``purge_step`` is the first step of each start, so TensorBoard drops the earlier attempt's
  events from step 16 on, and the curve is that of the attempt that went on.
- W&B: a run's history only grows (a rewind needs W&B's server, which offline mode has not), so a step is sent
  only past the highest step already sent to the run (``wandb_run.py``): 16 and 17 keep the first attempt's
  values, which a resume from the same checkpoint reproduces anyway.

A tracker that fails (W&B cannot reach its server, a full disk) is one warning on rank 0, and the training goes
on without it: a run is worth more than its charts. Torch-free at import (each writer imports its package when
it opens), so ``distlaunch train`` makes the same checks before any rank starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from distlaunch.engine.wandb_run import WandbRunRecord, pick_run
from distlaunch.readable import plural
from distlaunch.training.tracking import TENSORBOARD_FOLDER, check_event_folder, check_packages

DEFAULT_PROJECT = "distlaunch"
# metrics.jsonl key -> the name both trackers show it under (grouped as TensorBoard and W&B group by prefix)
SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "loss_scale": "train/loss_scale",
    "val_loss": "eval/val_loss",
    "tokens_per_s": "perf/tokens_per_s",
    "mfu": "perf/mfu",
    "step_time_s": "perf/step_time_s",
    "mem_bytes": "memory/state_bytes",
    "device_peak_bytes": "memory/device_peak_bytes",
}


def step_scalars(record: dict[str, Any]) -> dict[str, float]:
    """A step's figures under the trackers' names; what is unknown (MFU on a CPU) is left out."""
    values = {tag: record[key] for key, tag in SCALARS.items() if _number(record.get(key))}
    values.update({f"memory/{part}_bytes": n for part, n in (record.get("mem") or {}).items() if part != "total"})
    return {tag: float(value) for tag, value in values.items()}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def flat_config(start: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as ``section.key`` values (TensorBoard's hparams take no nesting, nor lists)."""
    flat = {
        f"{section}.{key}": ",".join(value) if isinstance(value, list) else value
        for section, table in start["config"].items()
        for key, value in table.items()
    }
    return {**flat, "layout": start["layout"], "world_size": start["world_size"]}


def _shown_as_code(value: Any) -> str:
    """JSON as a markdown code block (TensorBoard's text tab renders markdown)."""
    return textwrap.indent(json.dumps(value, indent=2), "    ")


class TensorBoardWriter:
    """Event files in ``folder``, from the start record's ``first_step`` on (``purge_step``: module docstring)."""

    name = "tensorboard"

    def __init__(self, folder: Path, start: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        first = start["first_step"]
        self.writer = SummaryWriter(str(folder), purge_step=first)
        self.writer.add_text("config", _shown_as_code(start["config"]), first)
        self.writer.add_text(
            "layout", f"{start['layout']} ({plural(start['world_size'], 'rank')}, {start['device']})", first
        )
        experiment, session_start, self.session_end = hparams(flat_config(start), {"train/loss": 0, "eval/val_loss": 0})
        for summary in (experiment, session_start):
            self.writer.file_writer.add_summary(summary)
        self.writer.flush()

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # on disk before the next step: a crash loses no step already shown

    def finish(self, summary: dict[str, Any]) -> None:
        self.writer.add_text("summary", _shown_as_code(summary), summary["steps"])
        self.writer.file_writer.add_summary(self.session_end)

    def close(self, ended: bool) -> None:
        self.writer.close()


class WandbWriter:
    """The job's W&B run (``wandb_run.py`` says which), resumed by every start."""

    name = "wandb"

    def __init__(self, record: WandbRunRecord, store: Path | None, folder: Path | None, start: dict[str, Any], env):
        import wandb

        self.record, self.store = record, store
        record.save(store)  # the id is the job's from its first start on, even if no step is logged yet
        try:
            self.run = wandb.init(
                project=env.get("WANDB_PROJECT") or DEFAULT_PROJECT,
                dir=str(folder) if folder is not None and not env.get("WANDB_DIR") else None,
                id=record.run_id,
                resume="allow",
                config={**start["config"], "layout": start["layout"], "world_size": start["world_size"]},
                allow_val_change=True,  # a resumed job may have another layout (it shrank) or other devices
            )
        except Exception:
            with contextlib.suppress(Exception):
                wandb.teardown()  # its service process would outlive this start (close says why)
            raise
        if not self.run.offline:  # offline, only the record knows what earlier attempts sent
            # online, W&B's server says how far the run's history reaches: what it received, which is less than
            # what was sent where a crash cut W&B's upload short; the steps past it that this start runs again
            # are sent again
            record.logged_step = max(self.run.starting_step - 1, 0) if self.run.resumed else 0

    def log(self, step: int, values: dict[str, float]) -> None:
        if step <= self.record.logged_step:
            return  # sent by an earlier attempt of the job: W&B history only moves forward
        self.record.logged_step = step
        self.record.save(self.store)  # before it is sent: a crash in between loses this point, never repeats it
        self.run.log(values, step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if k != "event" and isinstance(v, (int, float, str))})

    def close(self, ended: bool) -> None:
        import wandb

        self.run.finish(exit_code=0 if ended else 1)  # 1: marked failed until a later start resumes it
        wandb.teardown()  # the engine leaves with os._exit: no atexit hook would stop W&B's service process


class Tracking:
    """Rank 0's trackers, fed every record of metrics.jsonl (``write``); they open at the start record.
    Creating it checks that every tracker asked for can work (UsageError otherwise)."""

    def __init__(
        self,
        report_to: list[str],
        metrics_file: Path | None,
        checkpoint_dir: str | None,
        environ: Mapping[str, str] | None = None,
    ):
        check_packages(report_to)
        check_event_folder(report_to, metrics_file)
        self.report_to, self.metrics_file = report_to, metrics_file
        self.checkpoint_dir = Path(checkpoint_dir).expanduser() if checkpoint_dir is not None else None
        self.env = os.environ if environ is None else environ
        self.writers: list[TensorBoardWriter | WandbWriter] = []
        self.ended = False  # the summary was written, or the job stopped to be resumed: the run did not fail

    def write(self, record: dict[str, Any]) -> None:
        """Send one metrics.jsonl record to every tracker still working."""
        event = record.get("event")
        if event == "start":
            self._open(record)
        elif "step" in record:
            values = step_scalars(record)
            self._each(lambda writer: writer.log(record["step"], values))
        elif event == "summary":
            self.ended = True
            self._each(lambda writer: writer.finish(record))
        elif event == "stopped":
            self.ended = True

    def close(self) -> None:
        """Close every tracker (safe to call twice)."""
        writers, self.writers = self.writers, []
        for writer in writers:
            try:
                writer.close(self.ended)
            except Exception as err:  # the training is over or stopping: say so, and close the others
                _warn(f"{writer.name} could not close", err, "its last records may be lost")

    def _open(self, start: dict[str, Any]) -> None:
        folder = self.metrics_file.parent if self.metrics_file is not None else None
        for tracker in self.report_to:
            try:
                if tracker == "tensorboard":
                    self.writers.append(TensorBoardWriter(folder / TENSORBOARD_FOLDER, start))
                else:
                    # checkpoint.dir is what every attempt that continues the job shares; without one, a
                    # restart of this launch starts over, and the log folder is what it shares
                    store = self.checkpoint_dir or folder
                    resumed = self.checkpoint_dir is not None and start["first_step"] > 1
                    record = pick_run(store, resumed, self.env)
                    self.writers.append(WandbWriter(record, store, folder, start, self.env))
            except Exception as err:  # a tracker never fails the training: W&B's server unreachable, a full disk
                _warn(f"{tracker} could not start", err, "the training goes on without it")

    def _each(self, call) -> None:
        for writer in list(self.writers):
            try:
                call(writer)
            except Exception as err:  # as in _open
                self.writers.remove(writer)
                _warn(f"{writer.name} failed", err, "nothing more is sent to it; the training goes on")
                with contextlib.suppress(Exception):  # said once already
                    writer.close(False)


def _warn(what: str, err: BaseException, then: str) -> None:
    """One line on rank 0's stderr: what failed, the first line of why, and what happens now."""
    lines = str(err).strip().splitlines()
    print(f"warning: {what} ({type(err).__name__}: {lines[0] if lines else ''}): {then}", file=sys.stderr, flush=True)


def open_tracking(report_to: list[str], metrics_file: Path | None, checkpoint_dir: str | None) -> Tracking | None:
    """Rank 0's trackers for ``train.report_to`` (None when it names none), checked now, opened at the start."""
    return Tracking(report_to, metrics_file, checkpoint_dir) if report_to else None
