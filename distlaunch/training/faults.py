"""The ``fault.*`` settings a job can inject, checked without torch (``distlaunch train`` refuses them before any
rank starts, as each rank would), and which try of a job this is. The injection itself is the engine's
(``distlaunch.engine.fault``)."""

from __future__ import annotations

import os

from distlaunch.errors import UsageError
from distlaunch.readable import plural
from distlaunch.training.config import FaultSection


def restart_count(environ: dict[str, str] | None = None) -> int:
    """Which try this is: distlaunch's DISTLAUNCH_RESTART_COUNT, else torchrun's."""
    env = os.environ if environ is None else environ
    for name in ("DISTLAUNCH_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def check_fault(section: FaultSection, world_size: int, step_timeout: float) -> None:
    """The fault settings a job of ``world_size`` ranks can inject (UsageError otherwise); torch-free, so
    ``distlaunch train`` refuses them before any rank starts, as each rank would."""
    if section.rank is None and section.step is None:
        return
    if section.rank is None or section.step is None:
        raise UsageError(
            "fault.rank and fault.step must be set together", "for example --set fault.rank=1 --set fault.step=12"
        )
    if section.rank >= world_size:
        raise UsageError(
            f"fault.rank={section.rank} but the job has {plural(world_size, 'rank')}",
            f"use a rank in [0, {world_size})",
        )
    if section.kind == "slow" and section.factor <= 1:
        raise UsageError(
            f"fault.factor={section.factor:g} would not slow rank {section.rank} down (fault.kind='slow')",
            "give a factor above 1, for example --set fault.factor=2",
        )
    if section.kind == "hang" and step_timeout <= 0:
        raise UsageError(
            "fault.kind='hang' with train.step_timeout=0 would hang forever",
            "set train.step_timeout (seconds) so the hang is detected",
        )
