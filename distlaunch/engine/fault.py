"""Fault injection for rehearsing failures: ``fault.rank`` crashes, hangs or slows down at ``fault.step``.

- ``crash``: the rank exits with ``FAULT_EXIT`` at the start of step ``fault.step``, abruptly
  (``os._exit``: no cleanup, no process-group shutdown), as a segfault or an OOM kill would.
- ``hang``: the rank stops at the start of that step and never comes back; the step timeout
  (``train.step_timeout``) must catch it.
- ``crash-in-save``: the rank exits in the first checkpoint save at or after that step, after
  its shards are on disk and before the checkpoint is published.
- ``slow``: from that step on, the rank's own compute takes ``fault.factor`` times as long (after each
  step it computes ``factor - 1`` times that step's compute time more: CPU time, as a slower processor
  would, ``compute.spin``), as on a throttled host: its peers only wait for it in collectives, and the
  launcher names it a straggler (``--on-straggler``).

By default a fault fires only on the first try (``DISTLAUNCH_RESTART_COUNT`` 0 or unset), so a
job started with ``--max-restarts`` recovers; ``fault.every_try = true`` fires it on every try. So after a
``slow`` rank's host was replaced (``--on-straggler replace``) the job runs healthy, as it would with the slow
host gone; with ``every_try`` rank ``fault.rank`` is slow on every try, whichever host runs it.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field

from distlaunch.engine.compute import spin
from distlaunch.training.config import FaultSection
from distlaunch.training.faults import check_fault

FAULT_EXIT = 42  # exit code of an injected crash, distinct from Python's 1 and signals' 128+N


@dataclass(frozen=True)
class FaultPlan:
    """The fault this rank injects on this try, if any."""

    kind: str | None  # None: nothing to inject here
    step: int = 0
    factor: float = 1.0  # kind "slow"
    said: list[int] = field(default_factory=list, compare=False)  # kind "slow": announced once, at this step

    @classmethod
    def for_rank(cls, section: FaultSection, rank: int, world_size: int, tries: int, step_timeout: float) -> FaultPlan:
        """The configured fault if it targets ``rank`` on this try; checks the settings."""
        if tries > 0 and not section.every_try:
            return cls(None)  # unchecked: a job that shrank after the fault may no longer have fault.rank
        check_fault(section, world_size, step_timeout)
        if section.rank is None or section.rank != rank:
            return cls(None)
        return cls(section.kind, section.step, section.factor if section.kind == "slow" else 1.0)

    def at_step(self, step: int, rank: int) -> None:
        """Crash or hang here if this is the step (the start of the step, before any work)."""
        if self.kind not in ("crash", "hang") or step != self.step:
            return
        _say(
            f"fault injection: rank {rank} {'crashes' if self.kind == 'crash' else 'hangs'} at step {step} "
            f"(fault.kind={self.kind!r})"
        )
        if self.kind == "crash":
            os._exit(FAULT_EXIT)
        threading.Event().wait()  # forever: only the watchdog (or the launcher) ends this process

    def slow_down(self, step: int, rank: int, compute_s: float) -> float:
        """Kind ``slow``, from the fault step on: compute ``factor - 1`` times this step's compute more, so the
        rank's compute takes ``factor`` times as long; returns the seconds added."""
        if self.kind != "slow" or step < self.step:
            return 0.0
        if not self.said:
            self.said.append(step)
            _say(
                f"fault injection: rank {rank} computes {self.factor:g}x slower from step {step} "
                f"(fault.kind='slow', fault.factor={self.factor:g})"
            )
        extra = (self.factor - 1) * max(compute_s, 0.0)
        spin(extra)
        return extra

    def in_save(self, step: int, rank: int) -> None:
        """Crash in the middle of the save of ``step``, if it is at or after the fault step."""
        if self.kind == "crash-in-save" and step >= self.step:
            _say(
                f"fault injection: rank {rank} crashes while saving the step-{step} checkpoint, after writing "
                f"its shards and before publishing (fault.kind='crash-in-save')"
            )
            os._exit(FAULT_EXIT)


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
