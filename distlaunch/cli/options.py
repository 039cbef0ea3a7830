"""The launch options of ``run``, ``train``, ``doctor``, ``hosts`` and ``slurm``, each declared once as a typer
annotation with its parser; groups.py says which commands take which (``HOST_OPTIONS``: every command that
reaches hosts). ``refused`` is a word of another command that means something else here: one line says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

try:  # typer >= 0.22 carries its own copy of click
    from typer._click.core import ParameterSource
except ImportError:  # pragma: no cover - older typer uses click itself
    from click.core import ParameterSource

from distlaunch.cli import panels as h
from distlaunch.contract.hostname import host_problem
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.program import parse_preload
from distlaunch.launcher.planning.spec import parse_backend, parse_log_size, parse_nproc, parse_seconds
from distlaunch.launcher.supervising.requests import parse_forward_signals, parse_save_signal
from distlaunch.placement import parse_cpu_bind


def given(flag: str, example: str, required: bool = False) -> Callable[[str], str]:
    """A parser that refuses an empty value: an unset shell variable (``--workdir "$WORKDIR"``) would otherwise
    mean the current folder, which nobody means by typing nothing."""

    def parse(raw: str) -> str:
        if not raw.strip():
            raise UsageError(f"{flag} is empty", f"give {example}" + ("" if required else f", or leave {flag} out"))
        return raw

    return parse


def user_path(flag: str, example: str, required: bool = False) -> Callable[[str], Path]:
    """A parser for a path option: given (see ``given``), with ``~`` expanded (the shell leaves it alone in
    ``--log-dir=~/logs``, and a path the launcher checks must be the one the ranks write)."""
    check = given(flag, example, required)
    return lambda raw: Path(check(raw)).expanduser()


Program = Annotated[
    list[str],
    typer.Argument(
        help="SCRIPT [ARGS]... (or MODULE [ARGS]... with -m). Everything after SCRIPT goes to the script.",
        show_default=False,
    ),
]
Module = Annotated[
    bool, typer.Option("-m", "--module", help="Run PROGRAM as a module, like python -m.", rich_help_panel=h.RUN)
]
NoPython = Annotated[
    bool, typer.Option("--no-python", help="Run PROGRAM as an executable, not through Python.", rich_help_panel=h.RUN)
]
Hostfile = Annotated[
    Path | None,
    typer.Option(
        "-H",
        "--hostfile",
        metavar="FILE",
        parser=user_path("-H", "a hostfile, e.g. -H hosts"),
        help="Hostfile: 'node1 slots=8', 'node1:8' or 'node1' per line. Default: this machine only.",
        rich_help_panel=h.HOSTS,
    ),
]
NprocPerNode = Annotated[
    int | None,
    typer.Option(
        "-n",
        "--nproc-per-node",
        parser=parse_nproc,
        metavar="N|auto|gpu",
        help="Ranks per host: N; auto: each host's GPUs, or 1; gpu: each host's GPUs, the same on every host "
        "(the hosts count them at start). Default: the host's slots, else auto.",
        rich_help_panel=h.HOSTS,
    ),
]
ParallelOpt = Annotated[
    str | None,
    typer.Option(
        "--parallel",
        metavar="SPEC",
        help="Parallel layout, e.g. 'dp=2,tp=2,pp=2,zero=1' (dp may be 'auto'). dp*tp*pp must equal the world size.",
        rich_help_panel=h.LAYOUT,
    ),
]
Include = Annotated[
    str | None,
    typer.Option(
        "-i",
        "--include",
        metavar="HOSTS",
        help="Only these hosts/slots: 'node1:0,1@node2'.",
        rich_help_panel=h.HOSTS,
    ),
]
Exclude = Annotated[
    str | None,
    typer.Option(
        "-e",
        "--exclude",
        metavar="HOSTS",
        help="Leave out hosts/slots: 'node3@node1:7'.",
        rich_help_panel=h.HOSTS,
    ),
]


def check_master_addr(value: str | None) -> str | None:
    """A --master-addr that is no host name or IP address fails here, in one line, not on every rank after
    the rendezvous timeout."""
    problem = host_problem(value) if value is not None else None
    if problem is not None:
        raise UsageError(
            f"--master-addr: {problem[0]}", "give rank 0's host name or IP address as every host reaches it"
        )
    return value


MasterAddr = Annotated[
    str | None,
    typer.Option(
        "--master-addr",
        metavar="ADDR",
        help="Address of rank 0 as every host reaches it (default: the first host's address; under Slurm: the"
        " step's first node).",
        rich_help_panel=h.CONNECT,
        callback=check_master_addr,
    ),
]
MasterPort = Annotated[
    str,
    typer.Option(
        "--master-port",
        metavar="PORT|auto",
        help="Rendezvous port: an integer or 'auto' (a free port; under Slurm: one derived from the job and step id).",
        rich_help_panel=h.CONNECT,
    ),
]
Backend = Annotated[
    str,
    typer.Option(
        "--backend",
        parser=parse_backend,
        metavar="auto|nccl|gloo",
        help="auto: nccl where every host has GPUs, gloo where none has (the hosts tell at start; hosts that "
        "disagree are refused).",
        rich_help_panel=h.LAYOUT,
    ),
]


def check_cpu_bind(text: str) -> str:
    """``--cpu-bind``: a policy, or per-local-rank CPU lists whose syntax is checked here (their CPUs on each host)."""
    parse_cpu_bind(text)
    return text.strip()


CpuBind = Annotated[
    str,
    typer.Option(
        "--cpu-bind",
        metavar="auto|none|numa|cores|LIST",
        parser=check_cpu_bind,
        help="Each rank's CPUs on its host: auto (its GPU's NUMA node, else an equal share), none, numa, cores, or"
        " LIST (0-3:4-7: one set per local rank). A binding Slurm made is kept.",
        rich_help_panel=h.RUN,
    ),
]
Preload = Annotated[
    str,
    typer.Option(
        "--preload",
        metavar="auto|none|MODULES",
        parser=parse_preload,
        help="Modules each host imports once, its ranks then forked from that process instead of each importing "
        "them: auto (the bundled engine's, for the engine; nothing for other programs), none, or names (torch,numpy).",
        rich_help_panel=h.RUN,
    ),
]
MaxRestarts = Annotated[
    int,
    typer.Option(
        "--max-restarts",
        metavar="K",
        min=0,
        help="Restart the whole job up to K times after a rank fails (the ranks read which try it is in "
        "DISTLAUNCH_RESTART_COUNT).",
        rich_help_panel=h.FAULTS,
    ),
]


LogDir = Annotated[
    Path | None,
    typer.Option(
        "--log-dir",
        metavar="DIR",
        parser=user_path("--log-dir", "a folder, e.g. --log-dir logs"),
        help="Keep every rank's log in DIR/<job id>/rank<N>.log (time-stamped, with a header) instead of the"
        " job's folder in the job store (DISTLAUNCH_STATE_DIR), where only the 20 newest jobs keep theirs.",
        rich_help_panel=h.OUTPUT,
    ),
]
LogMaxSize = Annotated[
    int,
    typer.Option(
        "--log-max-size",
        metavar="SIZE",
        parser=parse_log_size,
        help="A rank's log this big is rotated to rank<N>.log.1 (replacing the part before), so each rank keeps"
        " at most twice SIZE, its newest lines: 64MiB, 1GiB, ... at least 64KiB; 0: no limit.",
        rich_help_panel=h.OUTPUT,
    ),
]
Env = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        metavar="KEY[=VALUE]",
        help="Set KEY=VALUE in every rank's environment; KEY alone forwards this launcher's value (repeatable).",
        rich_help_panel=h.RUN,
    ),
]
SshConfig = Annotated[
    Path | None,
    typer.Option(
        "--ssh-config",
        metavar="FILE",
        parser=user_path("--ssh-config", "an OpenSSH client config file"),
        help="OpenSSH client config to use instead of ~/.ssh/config.",
        rich_help_panel=h.CONNECT,
    ),
]
AcceptNewHostKeys = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        help="Accept and record SSH host keys not yet in known_hosts (default: refuse them and print the"
        " ssh-keyscan line). Changed keys are always refused.",
        rich_help_panel=h.CONNECT,
    ),
]
RemotePython = Annotated[
    str | None,
    typer.Option(
        "--remote-python",
        metavar="PYTHON",
        help="Python on remote hosts that runs distlaunch there (the agent; doctor's and hosts' probe) and, unless"
        " --python is given, the ranks (default: the launcher's own path).",
        rich_help_panel=h.CONNECT,
    ),
]
StartTimeout = Annotated[
    float,
    typer.Option(
        "--start-timeout",
        metavar="SECONDS",
        min=1,
        help="How long a host's Python may take to start and answer before it counts as hung (slow shared "
        "filesystems, loaded hosts).",
        rich_help_panel=h.CONNECT,
    ),
]
Workdir = Annotated[
    str | None,
    typer.Option(
        "--workdir",
        metavar="DIR",
        parser=given("--workdir", "a folder, e.g. --workdir /shared/project"),
        help="Working directory of the ranks on every host (default: the launcher's current directory).",
        rich_help_panel=h.RUN,
    ),
]
Python = Annotated[
    str | None,
    typer.Option(
        "--python",
        metavar="PYTHON",
        help="Python interpreter that runs each rank (default: the launcher's own).",
        rich_help_panel=h.RUN,
    ),
]
GracePeriod = Annotated[
    float,
    typer.Option(
        "--grace-period",
        parser=parse_seconds,
        metavar="SECONDS",
        help="Seconds between SIGTERM and SIGKILL when stopping ranks.",
        rich_help_panel=h.FAULTS,
    ),
]
Detach = Annotated[
    bool,
    typer.Option(
        "--detach",
        "-d",
        help="Start the job in the background, print its id (with --json: its record) and return (see: distlaunch"
        " jobs, logs, stop).",
        rich_help_panel=h.RUN,
    ),
]
HEARTBEAT_FLOOR_S = 1.0


def check_heartbeat_timeout(value: float) -> float:
    """0 (off) or at least a second. Heartbeats go every third of the timeout: below a second one late
    wake-up of a busy host's launcher or agent (measured: 0.01 s stopped a healthy job at 0.1 s, exit 3)
    gives up a host that is alive."""
    if 0 < value < HEARTBEAT_FLOOR_S:
        raise UsageError(
            f"--heartbeat-timeout {value:g} is too short: a busy but healthy host would be given up (exit 3)",
            f"give at least {HEARTBEAT_FLOOR_S:g} second, or 0 to turn heartbeats off; the default is 30",
        )
    return value


HeartbeatTimeout = Annotated[
    float,
    typer.Option(
        "--heartbeat-timeout",
        metavar="SECONDS",
        min=0,
        callback=check_heartbeat_timeout,
        help="Seconds without a message from a host's agent before the host counts as lost: the job stops, exit 3."
        " Agents likewise stop their ranks when the launcher is silent this long, and in per-node mode a node"
        " whose heartbeat at the rendezvous stops this long, or a rendezvous store that does not answer this"
        " long, is given up. At least 1; 0 turns heartbeats off.",
        rich_help_panel=h.FAULTS,
    ),
]
LocalRanksFilter = Annotated[
    str | None,
    typer.Option(
        "--local-ranks-filter",
        metavar="RANKS",
        help="Show only these local ranks' output on the terminal, e.g. 0 or 0,1 (the rank logs keep all).",
        rich_help_panel=h.OUTPUT,
        show_default=False,
    ),
]
HangTimeout = Annotated[
    float,
    typer.Option(
        "--hang-timeout",
        metavar="SECONDS",
        min=0,
        help="Seconds without progress (no rank output, no distlaunch.progress() call) before the job counts as"
        " hung: every rank's Python stack is gathered and summarised, saved to the job folder, then the job"
        " stops with exit 124. 0 turns it off.",
        rich_help_panel=h.FAULTS,
    ),
]

HangReport = Annotated[
    float,
    typer.Option(
        "--hang-report",
        metavar="SECONDS",
        min=0,
        help="Seconds without progress (as for --hang-timeout) before every rank's Python stack is gathered and"
        " printed once, grouped, and saved to the job folder; the job runs on, and new progress re-arms it."
        " 0 turns it off.",
        rich_help_panel=h.FAULTS,
    ),
]


def parse_on_straggler(text: str) -> str:
    """``--on-straggler``: warn or replace."""
    if text not in ("warn", "replace"):
        raise UsageError(f"--on-straggler {text!r} is not one of warn, replace", "write --on-straggler replace")
    return text


OnStraggler = Annotated[
    str,
    typer.Option(
        "--on-straggler",
        metavar="warn|replace",
        parser=parse_on_straggler,
        help="A rank whose own compute stays 1.5x the others' is named (warn); replace: at the next checkpoint its"
        " host is treated as failed (a spare takes over, or the job shrinks; without spares the job stops).",
        rich_help_panel=h.FAULTS,
    ),
]
SaveSignal = Annotated[
    str | None,
    typer.Option(
        "--save-signal",
        metavar="SIGNAL|none",
        parser=parse_save_signal,
        help="This signal to distlaunch asks every rank to save a checkpoint at its next step, then stops the job with"
        " exit 75 (saved: requeue it and it resumes there). Slurm sends it ahead of a time limit with"
        " #SBATCH --signal=B:USR1@LEAD. none: not trapped.",
        rich_help_panel=h.FAULTS,
    ),
]
ForwardSignals = Annotated[
    list[str] | None,
    typer.Option(
        "--forward-signals",
        metavar="SIG,SIG",
        parser=parse_forward_signals,
        help="Signals passed on to every rank when distlaunch gets them, e.g. USR2 (INT, TERM and HUP stop the job).",
        rich_help_panel=h.RUN,
        show_default=False,
    ),
]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the plan and start nothing. It contacts no host: what the hosts decide (backend, -n auto|gpu) "
        "is said as decided at start, unless their facts were read in the last 10 minutes (--probe reads them).",
        rich_help_panel=h.RUN,
    ),
]
Probe = Annotated[
    bool,
    typer.Option(
        "--probe",
        help="With --dry-run: run the launch's preflight (every host contacted, its inventory read) and show what "
        "the hosts decide. No rank starts.",
        rich_help_panel=h.RUN,
    ),
]
Json = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Machine-readable output: the plan with --dry-run, else the run report (rank output goes to stderr).",
        rich_help_panel=h.OUTPUT,
    ),
]
Launcher = Annotated[
    str,
    typer.Option(
        "--launcher",
        metavar="auto|slurm|agent",
        help="slurm: this srun task is one rank (RANK, WORLD_SIZE, MASTER_ADDR … from SLURM_*); agent: distlaunch"
        " starts the ranks itself (here, or over SSH); auto: slurm inside an srun task, else agent.",
        rich_help_panel=h.RUN,
    ),
]

NNodes = Annotated[
    str | None,
    typer.Option(
        "--nnodes",
        metavar="N|MIN:MAX",
        help="With -H: run on up to MAX hosts of the hostfile, in order; the rest are spares that replace a failed"
        " host, and the job shrinks while MIN remain (N is N:N; --max-restarts defaults to 3). Without -H, per-node"
        " mode: the job's node count; start distlaunch on each node with --node-rank or --rdzv-endpoint (ranks:"
        " node_rank * n + local_rank).",
        rich_help_panel=h.HOSTS,
    ),
]
NodeRank = Annotated[
    int | None,
    typer.Option(
        "--node-rank",
        metavar="N",
        help="This node's rank, 0 to NNODES-1 (needs --master-addr, --master-port).",
        rich_help_panel=h.PER_NODE,
    ),
]
NodeRankAlias = Annotated[int | None, typer.Option("--node_rank", hidden=True)]
RdzvEndpoint = Annotated[
    str | None,
    typer.Option(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="Where the nodes meet (served by the first node there); without --node-rank, ranks go by arrival."
        " Default: the master address, the master port + 1.",
        rich_help_panel=h.PER_NODE,
    ),
]
RdzvEndpointAlias = Annotated[str | None, typer.Option("--rdzv_endpoint", hidden=True)]
RdzvTimeout = Annotated[
    float,
    typer.Option(
        "--rdzv-timeout",
        metavar="SECONDS",
        help="Seconds to wait for every node to arrive.",
        rich_help_panel=h.PER_NODE,
    ),
]


def parse_local_ranks(text: str | None) -> list[int] | None:
    """'0,1' -> [0, 1]; a bad list is a usage error with the fix."""
    if text is None:
        return None
    try:
        ranks = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(
            f"--local-ranks-filter {text!r} is not a list of local ranks", "write it like 0 or 0,1"
        ) from None
    if any(r < 0 for r in ranks):
        raise UsageError(f"--local-ranks-filter {text!r} has a negative rank", "local ranks start at 0")
    return ranks


# what a launcher does
SUPERVISION = (
    "grace_period",
    "heartbeat_timeout",
    "hang_timeout",
    "hang_report",
    "log_max_size",
    "on_straggler",
    "local_ranks_filter",
    "save_signal",
    "forward_signals",
)


def refused(*flags: str, why: str, fix: str) -> Any:
    """A hidden option that only refuses itself in one line (exit 2): a word users bring from another command,
    where it means something else."""

    def refuse(value: str | None) -> str | None:
        if value is not None:
            raise UsageError(why, fix)
        return value

    return Annotated[str | None, typer.Option(*flags, hidden=True, callback=refuse)]


def given_flags(ctx: typer.Context, names: tuple[str, ...] = SUPERVISION) -> list[str]:
    """The options among ``names`` typed on the command line (not left at their default), by their long flag:
    a backend that cannot honour one refuses what was asked, never a default nobody asked for."""
    flags = []
    for param in ctx.command.params:
        if param.name in names and ctx.get_parameter_source(param.name) == ParameterSource.COMMANDLINE:
            flags.append(max(param.opts, key=len))
    return flags
