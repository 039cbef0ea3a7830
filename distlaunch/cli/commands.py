"""The commands of ``distlaunch``, each imported only when it runs.

Every command's module brings its own libraries (SSH, Slurm parsing, Kubernetes manifests, the data pipeline,
rich tables, the pydantic models of its plans). Imported all at once they cost more than the interpreter's own
start, on every call, ``--help`` included. So the root group knows each command by name only: the module that
defines it is imported when the command is asked for, and the command list of ``--help`` is drawn from the
table below without importing any of them. ``tests/launcher/test_cli_imports.py`` checks that each entry's help
is its command's own, and which modules each command imports.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import Context
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import Context

import typer
from typer.core import TyperCommand, TyperGroup

from distlaunch import interrupts

# Everything after SCRIPT belongs to the script, as with torchrun and python itself.
# torchrun's underscore spellings (--nproc_per_node, --master_addr, --max_restarts ...) are accepted as aliases.
UNDERSCORES = {"token_normalize_func": lambda name: name.replace("_", "-")}
SCRIPT_CONTEXT = {"allow_interspersed_args": False, **UNDERSCORES}


class Entry(NamedTuple):
    module: str
    attr: str  # a command function, or a Typer of subcommands
    help: str  # what ``distlaunch --help`` lists: the command's own first line (a test holds them equal)
    context: dict | None = None


COMMANDS: dict[str, Entry] = {
    "run": Entry(
        "distlaunch.cli.run",
        "run",
        "Start SCRIPT on every rank of every host, stream their output, stop them all if one fails.",
        SCRIPT_CONTEXT,
    ),
    "doctor": Entry(
        "distlaunch.cli.doctor",
        "doctor",
        "Check DNS, SSH, Python/torch/NCCL versions, GPUs, the master's port and reachability, interfaces, "
        "/dev/shm and clocks on every host; print what to fix.",
        UNDERSCORES,
    ),
    "hosts": Entry(
        "distlaunch.cli.hosts",
        "hosts",
        "Show what every host has: GPUs (model, memory, NUMA node), CPUs and NUMA nodes, interfaces, InfiniBand, "
        "driver and NCCL.",
        UNDERSCORES,
    ),
    "train": Entry(
        "distlaunch.cli.train",
        "train",
        "Train the bundled GPT on every rank: config checked first, then run's launch.",
        UNDERSCORES,
    ),
    "jobs": Entry(
        "distlaunch.cli.jobs", "jobs", "List jobs, newest first: id, backend, hosts, ranks, state, age, exit code."
    ),
    "status": Entry(
        "distlaunch.cli.jobs",
        "status",
        "Show one job in full: command, plan, state per host, restarts, the root cause when it failed.",
    ),
    "logs": Entry(
        "distlaunch.cli.jobs",
        "logs",
        "Print a job's rank-prefixed output (its rank logs, a detached job's output, a Slurm job's output file, "
        "a Kubernetes job's pods).",
    ),
    "stop": Entry(
        "distlaunch.cli.jobs",
        "stop",
        "Stop a running job like Ctrl-C: every rank on every host gets SIGTERM, a grace period, then SIGKILL.",
    ),
    "stacks": Entry(
        "distlaunch.cli.jobs",
        "stacks",
        "Show where every rank of a running job is now (grouped stacks); the job keeps running.",
    ),
    "slurm": Entry(
        "distlaunch.cli.slurm",
        "slurm_app",
        "Run on a Slurm cluster, one rank per Slurm task: an srun wrapper and sbatch scripts.",
    ),
    "checkpoint": Entry(
        "distlaunch.cli.checkpoint",
        "checkpoint_app",
        "Save a checkpoint of a running job now (distlaunch checkpoint JOB), or inspect, verify or export a "
        "training checkpoint (docs/checkpointing.md).",
    ),
    "k8s": Entry(
        "distlaunch.cli.k8s", "k8s_app", "Run a job on Kubernetes: an Indexed Job, one pod per node, no operator."
    ),
    "data": Entry(
        "distlaunch.cli.data", "data_app", "Prepare datasets for distlaunch train, and verify a copy (docs/data.md)."
    ),
}


def load(name: str):
    """The click command of ``name``, its module imported now."""
    entry = COMMANDS[name]
    with interrupts.held():  # a Ctrl-C inside pydantic's schema building would read as an internal error
        found = getattr(importlib.import_module(entry.module), entry.attr)
        if isinstance(found, typer.Typer):
            return typer.main.get_group(found)
        holder = typer.Typer(add_completion=False)  # one command alone: typer hands back that command itself
        holder.command(name, context_settings=entry.context)(found)
        return typer.main.get_command(holder)


class LazyCommands(TyperGroup):
    """The root group: commands by name, each loaded on first use; ``--help`` lists them from ``COMMANDS``."""

    listing = False  # while the help is drawn: stand-ins that carry the help line, nothing imported

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str):
        if cmd_name not in COMMANDS:
            return None
        if self.listing:
            return TyperCommand(cmd_name, short_help=COMMANDS[cmd_name].help)  # whole, wrapped, never cut
        if cmd_name not in self.commands:
            self.commands[cmd_name] = load(cmd_name)
        return self.commands[cmd_name]

    def format_help(self, ctx: Context, formatter) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False
