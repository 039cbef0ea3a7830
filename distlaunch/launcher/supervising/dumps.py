"""Where an attempt keeps what it gathers from its ranks (their stacks, their NCCL flight recorder dumps), and
the watch that stores the dumps agents send (protocol ``nccl-trace``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from distlaunch import protocol as p
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.supervising.nccl_trace import READ_HINT, BadTrace, cut_note, store_nccl_trace
from distlaunch.launcher.supervising.ranklogs import made_logs_folder
from distlaunch.launcher.supervising.watch import Watch
from distlaunch.readable import ranges


class AttemptFolder:
    """Where this attempt's stacks and NCCL flight recorder dumps go, in the job's folder (<log-dir>/<job id>,
    else the job's folder in the job store): ``stacks``, ``stacks-restart1`` for the first restart, and so on."""

    def __init__(self, plan: LaunchPlan, log_dir: Path | None, restart_count: int):
        self.plan, self.log_dir, self.restart_count = plan, log_dir, restart_count
        self._job: Path | None = None

    def path(self, name: str = "stacks") -> Path:
        """This attempt's folder called ``name`` (its job folder is made on the first call)."""
        if self._job is None:
            self._job = made_logs_folder(self.plan, self.log_dir)
        restart = self.restart_count
        return self._job / (f"{name}-restart{restart}" if restart else name)


class FlightRecorderDumps(Watch):
    """Stores the ranks' NCCL flight recorder dumps in the attempt's folder and, at the end, says where they are."""

    def __init__(self, folder: AttemptFolder, notice: Callable[[str], None]):
        self.folder, self.notice = folder, notice
        self.ranks: list[int | None] = []  # ranks whose dumps were stored

    def on_event(self, node_rank: int, event: dict) -> None:
        """Store a dump's piece."""
        if event.get("ev") == p.NCCL_TRACE:
            self.store(event)

    def store(self, event: dict) -> None:
        """Store a rank's flight recorder dump; a full disk or a broken event costs the dump, never the job."""
        try:
            path = store_nccl_trace(self.folder.path(), event)
            note = cut_note(event, path) if event.get("last", True) else None
        except (OSError, BadTrace) as exc:
            self.notice(f"cannot store the NCCL flight recorder dump of rank {event.get('rank')}: {exc}")
            return
        if not event.get("last", True):
            return  # more pieces follow
        self.ranks.append(event.get("rank"))
        if note:
            self.notice(note)

    def finish(self) -> None:
        """Say where the dumps are, and how to read them."""
        if not self.ranks:
            return
        ranks = sorted(r for r in self.ranks if r is not None)
        folder = self.folder.path()
        self.notice(
            f"NCCL flight recorder dumps{f' of ranks {ranges(ranks)}' if ranks else ''}: {folder} "
            f"(read them with: {READ_HINT.format(folder=folder)})"
        )
