"""The oldest PyTorch the engine runs on, checked by every rank before it builds anything.

Older releases fail deep inside a step, or hang there. Measured with the engine's tests: 2.10's
vocabulary-parallel embedding fails an assertion after a resume into tp2, 2.7's pipeline schedules
wait for ever on the engine's stages, and 2.6's ``distribute_tensor`` lacks ``src_data_rank``; the
suite passes on 2.11 and 2.13. Each host of a multi-host job brings its own torch, which pip never
checked against pyproject's floor, so each rank checks it and says it in one line. pyproject's
``torch>=`` is this value (tests/engine/test_torch_floor.py holds them equal).
"""

from __future__ import annotations

import re
import socket

from distlaunch.errors import UsageError

TORCH_FLOOR = (2, 11)


def floor_text() -> str:
    """The floor as pyproject and the error line write it: "2.11"."""
    return ".".join(map(str, TORCH_FLOOR))


def check_torch(version: str) -> None:
    """``version`` (``torch.__version__``) is at least the floor; pre-releases of the floor pass."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match and (int(match[1]), int(match[2])) < TORCH_FLOOR:
        raise UsageError(
            f"torch {version} on {socket.gethostname()} is older than {floor_text()}, the oldest the engine runs on",
            f"install torch>={floor_text()} for the Python this host runs ranks with",
        )
