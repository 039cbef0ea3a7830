"""``distlaunch run`` inside an srun task: map the task to its rank and exec the script (the task becomes the rank)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import NoReturn

from distlaunch.contract.endpoint import parse_port
from distlaunch.contract.env import launcher_defaults, parse_env
from distlaunch.contract.layout import layout_spec
from distlaunch.contract.options import LaunchOptions
from distlaunch.errors import UsageError
from distlaunch.hostprobe import inventory
from distlaunch.launcher.planning.decisions import local_gpu_count, local_inventory, local_nproc
from distlaunch.launcher.planning.netcards import NETWORK_VARS, decide
from distlaunch.launcher.planning.program import build_command, check_script
from distlaunch.placement import rank_cpus, rank_gpu, slurm_bound
from distlaunch.saverequest import rank_signals
from distlaunch.slurm.address import master_address
from distlaunch.slurm.env import SlurmRank, map_rank
from distlaunch.slurm.saves import saved_file_env
from distlaunch.slurm.step import read_step


def check_task_options(opts: LaunchOptions) -> None:
    """Options that choose hosts have no meaning under srun: Slurm placed the tasks already."""
    for flag, value in (
        ("-H/--hostfile", opts.hostfile),
        ("-i/--include", opts.include),
        ("-e/--exclude", opts.exclude),
    ):
        if value:
            raise UsageError(
                f"{flag} {value} cannot be used under srun: Slurm has placed the tasks",
                "choose nodes with srun/sbatch (-N, --nodelist, --exclude), or use --launcher agent",
            )


def master_port_for(opts: LaunchOptions, environ: Mapping[str, str]) -> int | None:
    """--master-port, else an exported MASTER_PORT, else None (derived from the job id)."""
    if opts.master_port != "auto":
        return parse_port(opts.master_port)
    exported = environ.get("MASTER_PORT")
    if exported:
        return parse_port(exported, "MASTER_PORT")
    return None


def rank_for_task(opts: LaunchOptions, environ: Mapping[str, str]) -> SlurmRank:
    """Read this srun task's SLURM_* variables and map them to a checked rank."""
    check_task_options(opts)
    step = read_step(environ)
    rank = map_rank(
        step,
        master_address(step.nodes[0], opts.master_addr, environ),
        master_port=master_port_for(opts, environ),
        parallel=layout_spec(opts.parallel),
        backend=opts.backend,
        gpus_here=local_gpu_count(),  # the task runs on its host: its own inventory decides
        nproc_per_node=local_nproc(opts.nproc_per_node),
    )
    return rank.model_copy(update={"argv": build_command(opts), "cpu_bind": opts.cpu_bind})


def task_env(
    rank: SlurmRank, opts: LaunchOptions, environ: Mapping[str, str], notice: Callable[[str], None] | None = None
) -> dict[str, str]:
    """The task's environment, plus --env, plus the rank contract (which wins), plus where the rank records its
    saved checkpoints for ``distlaunch checkpoint slurm-N`` (slurm/saves.py), plus its network cards (each
    choice said through ``notice``)."""
    env = dict(environ)
    env.update(parse_env(opts.env))
    users = {name: env[name] for name in NETWORK_VARS if name in env}  # before distlaunch adds any
    env.update(launcher_defaults(rank.backend, rank.local_world_size, env))
    env.update(rank.env)
    env.update(saved_file_env(rank))
    env.update(task_network(rank, users, notice or (lambda line: None)))
    return env


def task_network(rank: SlurmRank, users: dict[str, str], notice: Callable[[str], None]) -> dict[str, str]:
    """The network variables of this task's rank, by the launch's rule (planning/netcards.py) from its own host's
    inventory, as a per-node launch decides: every task of a node decides alike. The user's own (``users``: the
    task's environment and --env) win; one naming an interface this host does not have is a UsageError."""
    net = decide(rank.master_addr, {rank.node: local_inventory()}, {rank.node: users})
    for line in net.lines:
        notice(line)
    return net.env.get(rank.node, {})


def ignore_save_signal(environ: Mapping[str, str]) -> None:
    """The save signal (``DISTLAUNCH_SAVE_SIGNAL``, from ``distlaunch slurm run``) is ignored until the program
    traps it (an ignored signal stays ignored across the exec; a handler the program sets replaces that): a rank
    still importing torch when Slurm's warning comes must not die of it (it is sent again: slurm/savesignal.py),
    nor a program that never looks at it. The bundled engine traps it from its start, a script at its first
    ``distlaunch.checkpoint_requested()``."""
    for sig in rank_signals(environ):  # save and stop; save and train on
        signal.signal(sig, signal.SIG_IGN)


def bind_task(rank: SlurmRank, opts: LaunchOptions, env: Mapping[str, str]) -> None:
    """Place this task on its node's CPUs by --cpu-bind, as an agent places a rank (placement.py), unless Slurm
    bound it already (srun --cpu-bind): that binding is kept. The exec keeps the affinity."""
    if slurm_bound(env):
        return
    host = inventory()
    try:
        cpus = rank_cpus(
            opts.cpu_bind, host, rank.local_rank, rank.local_world_size, rank_gpu(env, rank.local_rank, host)
        )
    except UsageError as exc:
        exc.message += f" on {rank.node}"
        raise
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def say(line: str) -> None:
    """A notice of distlaunch's own in the task's stderr, as a launch prints them."""
    sys.stderr.write(f"distlaunch: {line}\n")


def exec_rank(rank: SlurmRank, opts: LaunchOptions, environ: Mapping[str, str]) -> NoReturn:
    """Replace this process by the rank's program: no extra process sits between srun and the script."""
    command = rank.argv
    check_script(
        opts,
        f" on {rank.node} (cwd {os.getcwd()})",
        "use a path every node can see (a shared filesystem), or -m MODULE",
    )
    env = task_env(rank, opts, environ, say if rank.local_rank == 0 else None)  # a node's choice, said once
    bind_task(rank, opts, env)
    ignore_save_signal(env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        raise UsageError(
            f"cannot start {command[0]!r} on {rank.node}: {exc.strerror}",
            "check --python and the script path on every node",
        ) from None
