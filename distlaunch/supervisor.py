"""The supervisor of a detached job: ``python -m distlaunch.supervisor JOB_DIR``, the program's second entry
point beside the CLI (``distlaunch``, ``python -m distlaunch``).

``run --detach`` starts it (``launcher/running/detach.py``) in a session of its own. It runs the plan in the
job's folder through the same ``launch`` as a foreground run and prints what a terminal would have shown into
``output.log`` (its stdout), with the CLI's own rendering: it is a command without a terminal.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from distlaunch import interrupts
from distlaunch.errors import DistlaunchError, Interrupted


def main(folder: Path) -> int:
    """The supervisor's life: signals caught from its first moment (``distlaunch/interrupts.py``), the job run,
    its exit code (128 + a signal that ended it before the job's own trap took the signals)."""
    interrupts.install()
    try:
        code = supervise(folder)
    except Interrupted as stop:  # before the job's trap, or after the job: the record says how the job ended
        code = _interrupted(stop.signum)
    return code


def _interrupted(signum: int) -> int:
    interrupts.answer()
    print(f"distlaunch: the supervisor was interrupted by {interrupts.signal_name(signum)}", flush=True)
    return 128 + signum


def supervise(folder: Path) -> int:
    """In the supervisor: run the job described in ``folder`` and return its exit code."""
    with interrupts.held():  # the CLI's libraries load whole
        from rich.console import Console

        from distlaunch.cli import notices
        from distlaunch.cli.output import RankPrinter
        from distlaunch.cli.render import render_report
        from distlaunch.jobs.store import ERRORS_FILE, LAUNCH_FILE
        from distlaunch.launcher.running.detach import DetachedLaunch
        from distlaunch.launcher.running.launch import launch
    notices.install()  # the library's notices go where a terminal's would: output.log (its stderr is that file)
    spec = DetachedLaunch.model_validate_json((folder / LAUNCH_FILE).read_bytes())
    # output.log reads like the terminal would have (stdout is that file); errors.log keeps the stderr lines
    # and distlaunch's notices alone, for 'distlaunch logs --stderr'.
    with open(folder / ERRORS_FILE, "a", encoding="utf-8") as errors:
        err = _Tee(sys.stdout, errors)
        sink = RankPrinter(
            multi_host=spec.plan.nnodes > 1, out=sys.stdout, err=err, color=False, job_id=spec.plan.job_id
        )
        try:
            report = launch(spec.plan, spec.opts, spec.exec_opts, sink, command=spec.command)
        except DistlaunchError as exc:
            sink.notice(str(exc))
            return exc.exit_code
        finally:
            sink.close()
    console = Console(file=sys.stdout, width=120, no_color=True)
    lost = sink.unsent_note()
    if lost and sink.err.failed:  # output.log's disk filled up: its notice was lost too; the job's end freed room
        console.print(f"distlaunch: {lost}", soft_wrap=True)
    render_report(report, console)
    return report.exit_code


class _Tee:
    """A text stream that writes to two: one write per line keeps lines whole in both."""

    def __init__(self, *streams: TextIO):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()

    def isatty(self) -> bool:
        return False


if __name__ == "__main__":
    interrupts.leave(main(Path(sys.argv[1])), _interrupted)
