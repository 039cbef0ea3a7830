"""distlaunch: start distributed PyTorch jobs on one machine, many machines over SSH, or Slurm."""

from __future__ import annotations

__version__ = "0.1.0"

import contextlib as _contextlib
import json as _json
import math as _math
import os as _os
import time as _time
from collections import deque as _deque

from distlaunch import saverequest as _saverequest
from distlaunch.saverequest import SaveRequest, save_request

PROGRESS_WINDOW = 50  # compute_s samples a rank's report summarises (its median): the straggler watch's window
_PROGRESS_EVERY_S = 0.1  # a rank's file is rewritten at most this often, except when a checkpoint was saved
MAX_METRICS, MAX_NAME, MAX_STATUS = 8, 32, 48  # a report stays small: the agent reads at most 4 KiB of it


class _ProgressFile:
    """One rank's progress, as its agent reads it: the newest step, the median of its last ``PROGRESS_WINDOW``
    compute times (seconds outside collectives a step), and its newest saved checkpoint step, as one JSON object
    replaced atomically in ``$DISTLAUNCH_PROGRESS_FILE``. The agent reads it once a second; the launcher's hang
    watch counts each new one as progress, its straggler watch compares the ranks' compute times."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.saved_step: int | None = None
        self.window: _deque[float] = _deque(maxlen=PROGRESS_WINDOW)
        self.save_s: float | None = None  # how long the newest save took (the launcher's SIGTERM budget reads it)
        self.answered = 0  # the newest save request (its id) a reported save answered
        # the step of the save that answered it: a later save (a periodic one) may be reported before the agent
        # reads the file again, and the launcher must not take that one for the answer
        self.answered_step: int | None = None
        self.total_steps: int | None = None
        self.metrics: dict[str, float] = {}  # what the launcher's status line shows (loss, tokens/s, MFU)
        self.status: str | None = None  # what the rank is doing before its next step ("compiling")
        self.written_at = -_math.inf

    def note(self, step, compute_s, saved_step, save_s=None, total_steps=None, metrics=None, status=None) -> None:
        if step is not None and int(step) != self.step:
            self.step = int(step)
            self.status = None  # a step done: whatever came before it is over
        if total_steps is not None:
            self.total_steps = int(total_steps)
        if metrics:
            self.metrics = {
                str(k)[:MAX_NAME]: round(float(v), 6)
                for k, v in list(metrics.items())[:MAX_METRICS]
                if isinstance(v, (int, float)) and _math.isfinite(v)
            }
        # a new status goes out at once, like a save: it is said once, before a long silence (compiling)
        said = status is not None and (str(status)[:MAX_STATUS] or None) != self.status
        if said:
            self.status = str(status)[:MAX_STATUS] or None  # "": the rank says it is done with it
        if compute_s is not None and _math.isfinite(compute_s) and compute_s >= 0:
            self.window.append(float(compute_s))
        # a new checkpoint goes out at once: it is what a replacement resumes from (--on-straggler replace)
        saved = saved_step is not None and int(saved_step) != self.saved_step
        if saved:
            self.saved_step = int(saved_step)
            answered = _saverequest.answered()
            if answered != self.answered:
                self.answered, self.answered_step = answered, self.saved_step
        if save_s is not None and _math.isfinite(save_s) and save_s >= 0:
            self.save_s = float(save_s)
        if saved:
            self.record_saved()
        path = _os.environ.get("DISTLAUNCH_PROGRESS_FILE")
        now = _time.monotonic()
        if not path or (not (saved or said) and now - self.written_at < _PROGRESS_EVERY_S):
            return
        self.written_at = now
        self.write(path)

    def report(self) -> dict:
        ordered = sorted(self.window)
        mid = len(ordered) // 2
        median = None if not ordered else ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        return {
            "step": self.step,
            "compute_s": None if median is None else round(median, 6),
            "n": len(ordered),
            "saved_step": self.saved_step,
            "save_s": None if self.save_s is None else round(self.save_s, 3),
            "answered": self.answered,
            "answered_step": self.answered_step,
            "total_steps": self.total_steps,
            "metrics": self.metrics,
            "status": self.status,
            "at": _time.time(),
        }

    def write(self, path: str) -> None:
        """Replace the file whole: the agent reads all of it or the previous one, never half."""
        _replace(path, self.report())

    def record_saved(self) -> None:
        """Where no agent reads this rank's progress (under srun), replace ``$DISTLAUNCH_SAVED_FILE`` with its
        newest checkpoint: a small record in the job's folder, which ``distlaunch checkpoint slurm-N`` reads for
        every rank. Its folder is made inside the job's, only where that exists (a job distlaunch recorded)."""
        path = _os.environ.get("DISTLAUNCH_SAVED_FILE")
        if not path:
            return
        with _contextlib.suppress(OSError):  # never the job's progress file over this one
            with _contextlib.suppress(FileExistsError):
                _os.mkdir(_os.path.dirname(path))  # not makedirs: no job folder is made for a job nobody recorded
            _replace(path, {"saved_step": self.saved_step, "save_s": self.save_s, "at": _time.time()})


def _replace(path: str, report: dict) -> None:
    """Replace a JSON file whole (a temporary file beside it, then a rename): a reader sees all of it or the
    previous one, never half."""
    tmp = f"{path}.{_os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(_json.dumps(report))
    _os.replace(tmp, path)


_progress = _ProgressFile()


def progress(
    step: int | None = None,
    compute_s: float | None = None,
    saved_step: int | None = None,
    save_s: float | None = None,
    *,
    total_steps: int | None = None,
    metrics: dict[str, float] | None = None,
    status: str | None = None,
) -> None:
    """Tell distlaunch that this rank is making progress; cheap: call it every step.

    Every call counts for ``--hang-timeout``. ``step``: the step just done; ``compute_s``: the seconds this rank
    spent on it outside collectives (its own compute, not waiting for the others), which ``distlaunch`` compares
    across ranks to name a straggler; ``saved_step``: the step of the newest checkpoint saved (it answers a pending
    save request, see ``checkpoint_requested``); ``save_s``: how long that save took, which decides whether a save
    fits in the grace period after a SIGTERM.

    What the launcher's status line shows on a terminal (rank 0's, or the lowest rank's that reports them):
    ``total_steps`` (for step/total and the ETA); ``metrics``, a few numbers by name, of which it shows ``loss``,
    ``tokens_per_s`` and ``mfu`` (a fraction); ``status``, a few words of what the rank does before its next step
    ("loading data", "compiling"), shown until it reports a new step. Never raises."""
    with _contextlib.suppress(Exception):  # progress reports are best effort: never fail the rank over one
        _progress.note(step, compute_s, saved_step, save_s, total_steps, metrics, status)


def checkpoint_requested() -> bool:
    """Whether a checkpoint was asked of this job and this rank has not reported one since; cheap: call it every
    step (the first call also arms the save signal where ``distlaunch slurm run`` forwards one).

    Asked by a save signal (Slurm's warning before a time limit), a SIGTERM with time to save, ``distlaunch
    checkpoint JOB`` or ``distlaunch stop --checkpoint JOB``. Save, then report it with
    ``distlaunch.progress(saved_step=...)``; when the request says the job stops after the save
    (``save_request().then == "stop"``), distlaunch stops the ranks once the save is reported. Ranks see a request
    at slightly different steps: agree on one first (an all-reduce of the flag, docs/surviving-failures.md)."""
    return save_request() is not None


__all__ = ["SaveRequest", "checkpoint_requested", "progress", "save_request"]
