"""``distlaunch checkpoint inspect|export``: look into a training checkpoint, or turn it into one file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from distlaunch.cli.render import print_json
from distlaunch.engine.checkpoint.report import CheckpointReport, inspect_checkpoint

checkpoint_app = typer.Typer(name="checkpoint", no_args_is_help=True,
                             help="Inspect a training checkpoint or export it as one state dict (docs/checkpointing.md).")
CheckpointPath = Annotated[Path, typer.Argument(help="A checkpoint.dir (its latest checkpoint) or one of its step_N directories.", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def render_checkpoint(report: CheckpointReport, console: Console) -> None:
    """The manifest as a table of components, then the checkpoints beside it."""
    meta, layout = report.meta, report.meta.layout
    console.print(f"[bold]{report.path}[/bold]")
    console.print(f"step {meta.step}, model {meta.preset}, written by dp={layout.dp},tp={layout.tp},pp={layout.pp},"
                  f"zero={layout.zero} ({layout.world_size} ranks)")
    console.print(f"saved {meta.saved_at} in {meta.save_seconds:g}s by job {meta.job}, torch {meta.torch_version}")
    table = Table(title=f"{_mib(meta.files_bytes)} on disk")
    for col in ("component", "entries", "elements", "tensor bytes"):
        table.add_column(col, justify="left" if col == "component" else "right")
    for name, size in meta.components.items():
        table.add_row(name, str(size.entries), f"{size.numel:,}", _mib(size.bytes))
    console.print(table)
    console.print(f"train state parts: {', '.join(meta.extras) or 'none'}")
    steps = ", ".join(f"{c.step}{' (latest)' if c.path == report.latest else ''}" for c in report.checkpoints)
    console.print(f"checkpoints in this directory: {steps}")
    for leftover in report.leftovers:
        console.print(f"[yellow]unfinished save[/yellow] {leftover} (never read; the next save deletes it)")


@checkpoint_app.command("inspect")
def inspect(path: CheckpointPath, json_output: Json = False) -> int:
    """Show a checkpoint's step, layout and size per component (reads meta.json only; no torch)."""
    report = inspect_checkpoint(path)
    print_json(report) if json_output else render_checkpoint(report, Console())
    return 0


@checkpoint_app.command("export")
def export(path: CheckpointPath,
           output: Annotated[Path, typer.Argument(help="Output file: .safetensors (default format) or .pt/.pth (torch.save).", show_default=False)],
           json_output: Json = False) -> int:
    """Write the checkpoint's model weights as one state dict the plain single-process GPT loads."""
    from distlaunch.engine.checkpoint.export import export_checkpoint  # torch: only for this command

    report = export_checkpoint(path, output)
    if json_output:
        print_json(report)
    else:
        Console().print(f"wrote {report.output} ({report.format}, {report.tensors} tensors, {_mib(report.bytes)}) "
                        f"from step {report.step} of {report.source}")
    return 0
