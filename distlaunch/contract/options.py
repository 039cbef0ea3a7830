"""The core launch options, as the user typed them: what every backend, the doctor and the job records share."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator


class LaunchOptions(BaseModel):
    """The launch options shared by ``run``, ``train`` and ``slurm``, as the user typed them."""

    program: list[str]  # SCRIPT [ARGS...] (or MODULE [ARGS...] with module=True)
    module: bool = False
    no_python: bool = False
    hostfile: Path | None = None
    nproc_per_node: int | None = None
    parallel: str | None = None
    include: str | None = None
    exclude: str | None = None
    master_addr: str | None = None
    master_port: str = "auto"
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    env: list[str] = Field(default_factory=list)
    python: str = ""  # the ranks' interpreter; "": --remote-python when given, else the launcher's own
    ssh_config: Path | None = None
    accept_new_host_keys: bool = False  # record unknown SSH host keys instead of refusing them
    remote_python: str | None = None  # the interpreter that runs the agent on remote hosts (default: sys.executable)
    max_restarts: int = 0  # ranks see it as TORCHELASTIC_MAX_RESTARTS

    @model_validator(mode="after")
    def _interpreter(self) -> LaunchOptions:
        """One rule for the ranks' interpreter: --python, else --remote-python, else the launcher's own."""
        self.python = self.python or self.remote_python or sys.executable
        return self
