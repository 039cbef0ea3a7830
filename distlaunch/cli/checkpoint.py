"""``distlaunch checkpoint inspect|export``: look into a training checkpoint, or turn it into one file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from distlaunch.backends.recorded import find_job
from distlaunch.backends.registry import of_record
from distlaunch.cli.render import print_json
from distlaunch.data.source import describe_data
from distlaunch.readable import plural
from distlaunch.training.checkpoint.report import CheckpointReport, inspect_checkpoint, verify_folder


class _JobOrCommand(TyperGroup):
    """``distlaunch checkpoint JOB`` asks a running job for a checkpoint; ``distlaunch checkpoint inspect|verify|export
    PATH`` looks into one. A first word that is no command is a job: it goes to ``save``."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["save", *args]
        return super().resolve_command(ctx, args)


checkpoint_app = typer.Typer(
    name="checkpoint",
    cls=_JobOrCommand,
    no_args_is_help=True,
    help="Save a checkpoint of a running job now (distlaunch checkpoint JOB), or inspect, verify or export a training"
    " checkpoint (docs/checkpointing.md).",
)
CheckpointPath = Annotated[
    Path,
    typer.Argument(
        help="A checkpoint.dir (its latest checkpoint) or one of its step_N directories.", show_default=False
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def render_checkpoint(report: CheckpointReport, console: Console) -> None:
    """The manifest as a table of components, then the checkpoints beside it, then any damage."""
    console.print(f"[bold]{report.path}[/bold]")
    if report.pointer_problem:
        console.print(f"[yellow]warning[/yellow] {report.pointer_problem}", soft_wrap=True)
    for problem in report.damage:
        console.print(f"[red]damaged[/red] {problem}", soft_wrap=True)
    if report.meta is None:
        return
    meta, layout = report.meta, report.meta.layout
    console.print(
        f"step {meta.step}, model {meta.preset}, written by dp={layout.dp},tp={layout.tp},pp={layout.pp},"
        f"zero={layout.zero} ({plural(layout.world_size, 'rank')})"
    )
    if meta.data is not None:
        console.print(f"trained on {describe_data(meta.data.path)}, vocabulary {meta.data.vocab_size:,}")
    console.print(f"saved {meta.saved_at} in {meta.save_seconds:g}s by job {meta.job}, torch {meta.torch_version}")
    table = Table(title=f"{_mib(meta.files_bytes)} on disk")
    for col in ("component", "entries", "elements", "tensor bytes"):
        table.add_column(col, justify="left" if col == "component" else "right")
    for name, size in meta.components.items():
        table.add_row(name, str(size.entries), f"{size.numel:,}", _mib(size.bytes))
    console.print(table)
    console.print(f"train state parts: {', '.join(meta.extras) or 'none'}")
    if report.checksums:
        console.print(
            f"{plural(report.checksums, 'file')} with recorded sizes and SHA-256 (check them: distlaunch checkpoint verify)"
        )
    else:
        console.print("[yellow]no checksums recorded[/yellow] (written by an older distlaunch)")
    steps = ", ".join(
        f"{c.step}{' (latest)' if c.path == report.latest else ''}{' (damaged)' if c.damage else ''}"
        for c in report.checkpoints
    )
    console.print(f"checkpoints in this directory: {steps}")
    for leftover in report.leftovers:
        console.print(f"[yellow]unfinished save[/yellow] {leftover} (never read; the next save deletes it)")


@checkpoint_app.command("save")
def save(
    job: Annotated[str, typer.Argument(help="A running job's id, or a unique prefix of one.", show_default=False)],
    timeout: Annotated[
        float,
        typer.Option("--timeout", metavar="SECONDS", help="Seconds to wait for the job to report the save.", min=1),
    ] = 600.0,
    json_output: Json = False,
) -> int:
    """Ask a running job to save a checkpoint at its next step, and wait for it; the job trains on (also: distlaunch checkpoint JOB).

    Every rank saves the same step (distlaunch train with checkpoint.dir; a script:
    distlaunch.checkpoint_requested()).

    Exit code: 0 once the save is reported, 1 when the job saved none within --timeout, 2 for a job that is
    unknown, not running or run elsewhere."""
    record = find_job(job, last_known_ok=True)
    saved = of_record(record).checkpoint(record, "continue", timeout)
    if json_output:
        print_json(saved)
        return 0
    took = f" in {saved.save_s:.1f}s" if saved.save_s is not None else ""
    Console().print(
        f"job {saved.job_id} saved the checkpoint of step {saved.step}{took}; it trains on", highlight=False
    )
    return 0


@checkpoint_app.command("inspect")
def inspect(path: CheckpointPath, json_output: Json = False) -> int:
    """Show a checkpoint's step, layout and size per component, and missing or truncated files (no torch)."""
    report = inspect_checkpoint(path)
    print_json(report) if json_output else render_checkpoint(report, Console())
    return 0


def _index_problems(checkpoint: Path) -> list[str]:
    from distlaunch.engine.checkpoint.safe import index_problems  # torch: only for this command

    return index_problems(checkpoint)


@checkpoint_app.command("verify")
def verify(
    path: Annotated[
        Path,
        typer.Argument(help="A checkpoint.dir (every checkpoint in it) or one step_N directory.", show_default=False),
    ],
    json_output: Json = False,
) -> int:
    """Check every file against the size and SHA-256 recorded at save; exit 0 intact, 1 damaged, 2 not found."""
    report = verify_folder(path, _index_problems)
    if json_output:
        print_json(report)
    else:
        console = Console(highlight=False, soft_wrap=True)
        if report.pointer_problem:
            console.print(f"[yellow]warning[/yellow] {report.pointer_problem}")
        for c in report.checkpoints:
            if c.problems:
                console.print(f"[red]damaged[/red] {c.path}: {'; '.join(c.problems)}")
            elif c.files:
                console.print(f"[green]ok[/green] {c.path} ({plural(c.files, 'file')}, {_mib(c.bytes)})")
            else:
                console.print(
                    f"[yellow]unverified[/yellow] {c.path}: no checksums recorded (written by an older distlaunch), "
                    f"so its {plural(c.unverified, 'file')} could not be verified; their sizes fit the index"
                )
    return 0 if report.ok else 1


@checkpoint_app.command("export")
def export(
    path: CheckpointPath,
    output: Annotated[
        Path,
        typer.Argument(help="Output file: .safetensors (default format) or .pt/.pth (torch.save).", show_default=False),
    ],
    json_output: Json = False,
) -> int:
    """Write the checkpoint's model weights as one state dict the plain single-process GPT loads."""
    from distlaunch.engine.checkpoint.export import export_checkpoint  # torch: only for this command

    report = export_checkpoint(path, output)
    for warning in report.warnings:
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[yellow]warning:[/yellow] {warning}")
    if json_output:
        print_json(report)
    else:
        Console(soft_wrap=True).print(
            f"wrote {report.output} ({report.format}, {report.tensors} tensors, {_mib(report.bytes)}) "
            f"from step {report.step} of {report.source}"
        )
    return 0
