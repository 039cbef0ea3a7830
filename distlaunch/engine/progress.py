"""What rank 0 shows while training: a live rich progress bar on a terminal, compact lines when
the output is piped (the launcher streams whole lines), a summary table, a loss-curve PNG.

rich and matplotlib are imported only when used, so importing the engine stays light (and
matplotlib stays optional: ``pip install 'distlaunch[plot]'``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from distlaunch.readable import plural, rate, time_left

LINE_WIDTH = 71  # a piped line, with the launcher's "[rank 0] " before it, stays inside 80 columns


def compact_line(record: dict[str, Any], steps: int, eta_s: float) -> str:
    """One step as a single line (what a piped rank 0 prints every ``train.log_every`` steps), at most
    ``LINE_WIDTH`` characters: the last figures (lr, grad norm) are left out when a long step count leaves no
    room for them (metrics.jsonl has every figure of every step).
    The eval loss and an fp16 skip get lines of their own (``event_lines``)."""
    fields = [
        f"step {record['step']}/{steps}",
        f"loss {record['loss']:.4f}",
        f"{rate(record['tokens_per_s'])} tok/s",
        f"eta {time_left(eta_s)}",
        f"lr {record['lr']:.1e}",
        f"gnorm {record['grad_norm']:.2f}",
    ]
    while len("  ".join(fields)) > LINE_WIDTH and len(fields) > 2:
        fields.pop()
    return "  ".join(fields)


def event_lines(record: dict[str, Any]) -> list[str]:
    """What a step adds besides its figures: the eval loss, a step skipped on fp16 overflow."""
    lines = []
    if record.get("val_loss") is not None:
        lines.append(f"step {record['step']}: val_loss {record['val_loss']:.4f}")
    if record.get("skipped"):
        lines.append(f"step {record['step']}: skipped (fp16 overflow, loss scale halved)")
    return lines


class ProgressReport:
    """Rank 0's view of the run; every other rank holds one that prints nothing."""

    def __init__(self, steps: int, log_every: int, enabled: bool, first_step: int = 1, out: TextIO | None = None):
        self.steps, self.log_every, self.enabled = steps, log_every, enabled
        self.out = out or sys.stdout
        self.first_step = first_step
        self.started = time.perf_counter()
        self.bar = None
        if enabled and self.out.isatty():
            self._start_bar()

    def _start_bar(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[tps]} tok/s"),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
        self.task = self.bar.add_task(
            "train", total=self.steps, completed=self.first_step - 1, loss="-", lr="-", tps="-"
        )
        self.bar.start()

    def eta_s(self, step: int) -> float:
        """Seconds left, from the mean time per step of this run so far."""
        done = step - self.first_step + 1
        return (time.perf_counter() - self.started) / max(done, 1) * (self.steps - step)

    def update(self, record: dict[str, Any]) -> None:
        """Show one step's record (a redraw on a terminal, a line every log_every steps otherwise)."""
        if not self.enabled:
            return
        step = record["step"]
        if self.bar is not None:
            self.bar.update(
                self.task,
                completed=step,
                loss=f"{record['loss']:.4f}",
                lr=f"{record['lr']:.2e}",
                tps=f"{record['tokens_per_s']:.0f}",
            )
            for line in event_lines(record):
                self.bar.console.print(line, highlight=False, markup=False)
        elif step % self.log_every == 0 or step == self.steps or event_lines(record):
            lines = [compact_line(record, self.steps, self.eta_s(step)), *event_lines(record)]
            print("\n".join(lines), file=self.out, flush=True)

    def say(self, text: str, stop: bool = False) -> None:
        """A line of its own on rank 0 (above the bar on a terminal); ``stop``: the run ends here, the bar too."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(text, highlight=False, markup=False)
            if stop:
                self.bar.stop()
            return
        print(text, file=self.out, flush=True)

    def finish(self, summary: dict[str, Any]) -> None:
        """Stop the bar and print the summary table."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.stop()
        from rich.console import Console

        console = Console(file=self.out)
        console.print(summary_table(summary))
        if summary.get("loss_curve"):  # on a line of its own: a path in a table cell is cut to the width
            console.print(f"loss curve: {summary['loss_curve']}", soft_wrap=True, highlight=False, markup=False)


def summary_table(summary: dict[str, Any]):
    """The final summary as a rich table (two columns: what, value)."""
    from rich.table import Table

    table = Table(title="training summary", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    first, final = summary.get("first_loss"), summary.get("final_loss")
    loss = "-" if first is None or final is None else f"{first:.4f} -> {final:.4f}"  # "-": no step was run
    rows = [
        ("layout", f"{summary['layout'].replace(',', ' ')} ({plural(summary['world_size'], 'rank')})"),
        ("model", f"{summary['preset']} ({summary['n_params'] / 1e6:.2f}M parameters), {summary['precision']}"),
        ("steps", str(summary["steps"])),
        ("loss", loss),
        ("val_loss", "-" if summary.get("final_val_loss") is None else f"{summary['final_val_loss']:.4f}"),
        ("tokens/s (median)", f"{summary['tokens_per_s']:.0f}"),
        ("mfu", "n/a (no known peak)" if summary.get("mfu") is None else f"{summary['mfu']:.1%}"),
        ("state bytes rank 0", f"{summary['mem_bytes_per_rank'][0]['total'] / 2**20:.1f} MiB"),
        ("init peak (RSS)", init_peak_text(summary.get("init_peak_per_rank"))),
        ("wall time", f"{summary['wall_s']:.1f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def init_peak_text(peaks: list[dict[str, Any]] | None) -> str:
    """The largest resident memory a rank reached until its model was built (each rank's: the
    summary's init_peak_per_rank)."""
    known = [p["rss_bytes"] for p in peaks or [] if p and p.get("rss_bytes") is not None]
    if not known:
        return "-"
    return f"{max(known) / 2**20:.0f} MiB (the most of {plural(len(known), 'rank')})"


CURVE_VAR = "DISTLAUNCH_LOSS_CURVE"  # 0: no loss_curve.png, and no matplotlib import (about a second of CPU)


def curve_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether rank 0 draws the loss curve: unless DISTLAUNCH_LOSS_CURVE is 0 (a test suite, a job whose curve
    nobody looks at)."""
    return (os.environ if environ is None else environ).get(CURVE_VAR, "1").strip() != "0"


def write_loss_curve(records: list[dict[str, Any]], path: Path) -> Path | None:
    """Training (and held-out) loss against the step as a PNG; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], label="train")
    evals = [r for r in records if r.get("val_loss") is not None]
    if evals:
        ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # renamed when whole: a reader never sees half a PNG
    fig.savefig(partial, dpi=100, format="png")
    plt.close(fig)
    os.replace(partial, path)
    return path
