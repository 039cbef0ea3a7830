"""What the launcher asks of the ranks themselves: a save (each rank's request file, which
``distlaunch.checkpoint_requested()`` reads) and signals passed on to them (``--forward-signals``).

Standard library only, as the whole agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

from distlaunch.agent.ranks import Rank
from distlaunch.agent.scratch import REQUEST, rank_file


class RankRequests:
    def __init__(self, scratch: str):
        self.scratch = scratch

    def save(self, ranks: list[Rank], message: dict) -> None:
        """Replace every running rank's request file with this save request, whole (written beside, renamed)."""
        request = {key: message.get(key) for key in ("id", "then", "why")}
        for rank in ranks:
            if rank.returncode is not None:
                continue
            path = rank_file(self.scratch, rank.rank, REQUEST)
            with contextlib.suppress(OSError):  # a full scratch disk: this rank misses the request, the save times out
                with open(f"{path}.tmp", "w", encoding="utf-8") as f:
                    f.write(json.dumps(request))
                os.replace(f"{path}.tmp", path)

    def signal(self, ranks: list[Rank], name: object) -> None:
        """Send the signal ``name`` (USR1) to every running rank's own process: its children (data loader
        workers) are the rank's to tell, and may not survive a signal they do not expect."""
        sig = getattr(signal, f"SIG{name}", None) if isinstance(name, str) else None
        if not isinstance(sig, signal.Signals):
            return
        for rank in ranks:
            if rank.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(rank.proc.pid, sig)
