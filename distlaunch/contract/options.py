"""The core launch options, as the user typed them: what every backend, the doctor and the job records share."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

BackendName = Literal["auto", "nccl", "gloo"]
"""``--backend``, one type in every options model (the CLI refuses anything else: ``launcher.spec.parse_backend``)."""


class SharedOptions(BaseModel):
    """The options every launching command takes (run, train, doctor, slurm run|sbatch), as the user typed them:
    the ranks per host, the layout, the master, the backend and the ranks' environment."""

    nproc_per_node: int | None = None
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
    accept_new_host_keys: bool = False  # record unknown SSH host keys instead of refusing them
    remote_python: str | None = None  # the interpreter that runs the agent on remote hosts (default: sys.executable)
    max_restarts: int = 0  # ranks see it as TORCHELASTIC_MAX_RESTARTS
    nodes: NodeRange | None = None  # --nnodes MIN:MAX with a hostfile: spares, shrinking (launcher/elastic.py)

    @model_validator(mode="after")
    def _interpreter(self) -> LaunchOptions:
        """One rule for the ranks' interpreter: --python, else --remote-python, else the launcher's own."""
        self.python = self.python or self.remote_python or sys.executable
        return self
