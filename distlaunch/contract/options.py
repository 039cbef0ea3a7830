"""The core launch options, as the user typed them: what every backend, the doctor and the job records share."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from distlaunch import protocol as p

BackendName = Literal["auto", "nccl", "gloo"]
NprocWord = Literal["auto", "gpu"]  # -n counted by each host's GPUs (launcher/planning/decisions.py)
Nproc = int | NprocWord | None  # -n as typed: a number, auto, gpu, or nothing (the hostfile's slots)
OnStraggler = Literal["warn", "replace"]  # --on-straggler: say so, or also take its host out at a checkpoint
DEFAULT_MAX_BYTES = 64 << 20  # --log-max-size: per rank, twice that on disk with the previous part
"""``--backend``, one type in every options model (the CLI refuses anything else: ``launcher.spec.parse_backend``)."""
# --save-signal: what Slurm's warning ahead of a time limit sends (#SBATCH --signal=B:USR1@LEAD), for run, train and
# slurm run|sbatch alike
DEFAULT_SAVE_SIGNAL = "USR1"


class SharedOptions(BaseModel):
    """The options every launching command takes (run, train, doctor, slurm run|sbatch), as the user typed them:
    the ranks per host, the layout, the master, the backend and the ranks' environment."""

    nproc_per_node: Nproc = None
    parallel: str | None = None
    master_addr: str | None = None
    master_port: str = "auto"  # an integer, or auto
    backend: BackendName = "auto"
    env: list[str] = Field(default_factory=list)  # --env KEY=VALUE, or KEY alone: the launcher's value


class HostOptions(SharedOptions):
    """The shared options, and the hosts they run on: a hostfile (or this machine), reached over SSH (run, train,
    doctor)."""

    hostfile: Path | None = None
    include: str | None = None
    exclude: str | None = None
    ssh_config: Path | None = None
    accept_new_host_keys: bool = False  # record unknown SSH host keys instead of refusing them


class ProgramOptions(BaseModel):
    """What every rank runs (run, train, slurm run|sbatch)."""

    program: list[str]  # SCRIPT [ARGS...] (or MODULE [ARGS...] with module=True)
    module: bool = False
    no_python: bool = False


class NodeRange(BaseModel):
    """``--nnodes MIN:MAX`` with a hostfile: the job runs on up to ``max_nodes`` hosts of the hostfile, in order;
    the hosts after them are spares. It goes on while at least ``min_nodes`` healthy hosts remain."""

    min_nodes: int
    max_nodes: int

    def __str__(self) -> str:
        return f"{self.min_nodes}:{self.max_nodes}"


class LaunchOptions(ProgramOptions, HostOptions):
    """The launch options shared by ``run``, ``train`` and ``slurm``, as the user typed them."""

    python: str = ""  # the ranks' interpreter; "": --remote-python when given, else the launcher's own
    remote_python: str | None = None  # the interpreter that runs the agent on remote hosts (default: sys.executable)
    max_restarts: int = 0  # ranks see it as TORCHELASTIC_MAX_RESTARTS
    nodes: NodeRange | None = None  # --nnodes MIN:MAX with a hostfile: spares, shrinking (launcher/elastic/healing.py)
    cpu_bind: str = "auto"  # --cpu-bind: where each rank runs on its host's CPUs (distlaunch/placement.py)
    preload: str = "auto"  # --preload: modules each host imports once before forking its ranks (agent/warm.py)

    @model_validator(mode="after")
    def _interpreter(self) -> LaunchOptions:
        """One rule for the ranks' interpreter: --python, else --remote-python, else the launcher's own."""
        self.python = self.python or self.remote_python or sys.executable
        return self


class ExecOptions(BaseModel):
    """How a job is supervised, as the user typed it (run, train): stopping, restarts, logs, the watches and the
    signals. Each default is written here only; the CLI's options take theirs from these fields."""

    grace_period: float = p.GRACE_PERIOD_S  # seconds between SIGTERM and SIGKILL when stopping ranks
    max_restarts: int = 0
    log_dir: Path | None = None  # the rank logs' folder is <log_dir>/<job id>; None: the job's folder in the job store
    log_max_size: int = DEFAULT_MAX_BYTES  # a rank log this big is rotated (one previous part kept); 0: never
    workdir: str | None = None
    heartbeat_timeout: float = 30.0  # a host silent this long is given up (exit 3); 0: never
    local_ranks_filter: list[int] | None = None  # show only these local ranks' output (log files keep all)
    hang_timeout: float = 0.0  # no output and no distlaunch.progress() this long: stacks, stop, exit 124; 0: off
    hang_report: float = 1800.0  # the same, but the stacks are only printed (once per stall), the job runs on; 0: off
    on_straggler: OnStraggler = "warn"  # a rank named a straggler: say so; replace: also take its host out
    save_signal: str | None = DEFAULT_SAVE_SIGNAL  # a checkpoint from every rank, then a stop (75); None: not trapped
    forward_signals: list[str] = []  # signals passed on to every rank (USR2, ...)

    @property
    def flight_recorder(self) -> bool:
        """Whether the ranks get NCCL's flight recorder: under a hang watch, whose stacks its dumps go with (the
        agent turns it on by the same rule)."""
        return bool(self.hang_timeout)


class NodeOptions(BaseModel):
    """The per-node options as the user typed them."""

    nnodes: int
    node_rank: int | None = None
    rdzv_endpoint: str | None = None  # HOST:PORT of the nodes' store (default: master address, master port + 1)
    rdzv_timeout: float = 300.0
