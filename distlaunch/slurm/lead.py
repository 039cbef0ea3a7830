"""How far ahead of its time limit Slurm warns a batch job: LEAD in ``#SBATCH --signal=B:USR1@LEAD``.

LEAD is computed, not guessed. For the bundled engine (``-m distlaunch.engine`` with its config and ``--set``):
the engine's save-on-request time from the planner (``training/planner/saving.py``: the bytes a node writes over a
conservative write bandwidth, plus two steps timed from their FLOPs), plus ``SLURM_SIGNAL_RESOLUTION_S``, rounded
up to whole seconds. For any other program: ``DEFAULT_SAVE_S`` plus the same resolution. ``--signal-lead``
replaces it.

Slurm checks time limits every 30 seconds and sends the warning at the first check that finds the job within
LEAD (plus that 30 s period) of its end; its documentation says the signal "may be sent up to 60 seconds earlier
than specified". The 60 s are added all the same: a warning that comes early costs a minute of the
allocation, one that comes too late costs every step since the last checkpoint.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel

from distlaunch.contract.options import ProgramOptions
from distlaunch.errors import UsageError
from distlaunch.training import argv
from distlaunch.training.planner.saving import DEFAULT_SAVE_S, SaveEstimate, program_save_estimate

SLURM_SIGNAL_RESOLUTION_S = 60  # "may be sent up to 60 seconds earlier than specified" (sbatch --signal)
SLURM_CHECK_PERIOD_S = 30  # slurmctld looks at time limits this often (its PERIODIC_TIMEOUT)
READY_S = 10  # a run's first seconds, while distlaunch slurm run starts and cannot take the signal yet
MAX_LEAD_S = 65535  # sbatch --signal takes 0..65535 seconds
_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


class SignalLead(BaseModel):
    """The warning ahead of the time limit: which signal, how many seconds before, and how that was found."""

    signal: str  # USR1: as in #SBATCH --signal=B:USR1@LEAD
    lead_s: int
    source: Literal["engine config", "default", "--signal-lead"]
    save_s: float | None  # the save part: the engine's estimate, or DEFAULT_SAVE_S (None: --signal-lead)
    resolution_s: int = SLURM_SIGNAL_RESOLUTION_S
    estimate: SaveEstimate | None = None  # the engine's, part by part
    how: str  # the sum, in words

    @property
    def directive(self) -> str:
        """``B:USR1@62``: to the batch shell (distlaunch slurm run), which passes it on to every rank."""
        return f"B:{self.signal}@{self.lead_s}"


def is_engine(opts: ProgramOptions) -> bool:
    """The program is the bundled engine (``-m distlaunch.engine``), which saves when asked."""
    return argv.is_engine(opts.module, opts.program)


def engine_estimate(
    opts: ProgramOptions, parallel: str | None, world_size: int, ranks_per_node: int, gpus: bool
) -> SaveEstimate | None:
    """The engine's save-on-request time for this job, or None for another program (or argv the engine refuses)."""
    return program_save_estimate(
        opts.module, opts.program, parallel, world_size, ranks_per_node, gpus, "a file system every node sees"
    )


def signal_lead(signal: str, given: int | None, estimate: SaveEstimate | None) -> SignalLead:
    """LEAD from ``--signal-lead`` (``given``), else from the engine's estimate, else the default."""
    if given is not None:
        check_lead(given)
        return SignalLead(
            signal=signal, lead_s=given, source="--signal-lead", save_s=None, how=f"--signal-lead {given}"
        )
    save_s, source = (estimate.seconds, "engine config") if estimate else (float(DEFAULT_SAVE_S), "default")
    lead = math.ceil(save_s + SLURM_SIGNAL_RESOLUTION_S)
    part = estimate.describe() if estimate else f"{DEFAULT_SAVE_S} s to save (not the bundled engine: a default)"
    how = f"ceil({part} + {SLURM_SIGNAL_RESOLUTION_S} s Slurm's signal resolution) = {lead} s"
    return SignalLead(signal=signal, lead_s=lead, source=source, save_s=save_s, estimate=estimate, how=how)


def parse_signal_lead(text: str) -> int:
    """``--signal-lead`` as typed: whole seconds (``check_lead`` checks the range, 1..65535, what sbatch --signal
    takes)."""
    if not text.strip().isdigit():
        raise UsageError(
            f"--signal-lead {text!r} is not a whole number of seconds",
            f"give the seconds the job needs to save and stop, 1 to {MAX_LEAD_S}, e.g. --signal-lead 300",
        )
    return int(text)


def check_lead(seconds: int) -> None:
    """sbatch takes 0..65535; 0 would warn at the very end, when there is no time left to save."""
    if not 1 <= seconds <= MAX_LEAD_S:
        raise UsageError(
            f"--signal-lead {seconds} is out of range: Slurm warns the job 1 to {MAX_LEAD_S} seconds before its end",
            "give the seconds the job needs to save and stop, e.g. --signal-lead 300, or leave it out to compute it",
        )


def time_limit_s(text: str | None) -> int | None:
    """Seconds of a Slurm time limit (``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``,
    ``days-hours:minutes``, ``days-hours:minutes:seconds``); None for none, UNLIMITED, or a form sbatch will judge."""
    match = _TIME.match((text or "").strip())
    if not match:
        return None
    days, a, b, c = (int(match[k]) if match[k] else None for k in ("days", "a", "b", "c"))
    if days is not None:  # days-hours[:minutes[:seconds]]
        seconds = ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    elif c is not None:
        seconds = (a * 60 + b) * 60 + c
    else:
        seconds = a * 60 + (b or 0)  # minutes[:seconds]
    return -(-seconds // 60) * 60  # Slurm keeps whole minutes, rounded up


def check_time_limit(lead: SignalLead, time: str | None) -> None:
    """Slurm checks time limits every 30 s, so the warning may come up to 30 s before LEAD: it must still come after
    a run's first seconds, when distlaunch slurm run is ready for it (else the run dies of it, unsaved)."""
    limit = time_limit_s(time)
    latest = None if limit is None else limit - SLURM_CHECK_PERIOD_S - READY_S
    if latest is None or lead.lead_s <= latest:
        return
    shorter = f"a --signal-lead of at most {latest} s, " if latest >= 1 else ""
    raise UsageError(
        f"--time {time} is {limit} s, and the save signal {lead.lead_s} s before the end ({lead.how}) may come "
        f"{SLURM_CHECK_PERIOD_S} s before that (Slurm checks time limits every {SLURM_CHECK_PERIOD_S} s): within the "
        f"first {READY_S} s of a run, before distlaunch is ready for it",
        f"give a --time of at least {lead.lead_s + SLURM_CHECK_PERIOD_S + READY_S} s, {shorter}or --no-requeue",
    )
