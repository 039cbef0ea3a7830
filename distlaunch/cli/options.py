"""Launch options shared by ``run``, ``train`` and ``slurm``, declared once as typer annotations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

LAUNCH = "Launch options"

Hostfile = Annotated[Optional[Path], typer.Option("-H", "--hostfile", help="Hostfile: 'node1 slots=8', 'node1:8' or 'node1' per line. Default: this machine only.", rich_help_panel=LAUNCH)]
NprocPerNode = Annotated[Optional[int], typer.Option("-n", "--nproc-per-node", help="Processes per host (default: the host's slots; without a hostfile, the GPUs here or 1).", rich_help_panel=LAUNCH)]
ParallelOpt = Annotated[Optional[str], typer.Option("--parallel", help="Parallel layout, e.g. 'dp=2,tp=2,pp=2,zero=1' (dp may be 'auto'). dp*tp*pp must equal the world size.", rich_help_panel=LAUNCH)]
Include = Annotated[Optional[str], typer.Option("-i", "--include", help="Use only these hosts/slots, e.g. 'node1:0,1@node2'.", rich_help_panel=LAUNCH)]
Exclude = Annotated[Optional[str], typer.Option("-e", "--exclude", help="Leave out these hosts/slots, e.g. 'node3@node1:7'.", rich_help_panel=LAUNCH)]
MasterAddr = Annotated[Optional[str], typer.Option("--master-addr", help="Address of rank 0 as every host reaches it (default: the first host's address).", rich_help_panel=LAUNCH)]
MasterPort = Annotated[str, typer.Option("--master-port", help="Rendezvous port: an integer or 'auto' (a free port).", rich_help_panel=LAUNCH)]
Backend = Annotated[str, typer.Option("--backend", help="auto | nccl | gloo (auto: nccl where GPUs are found, else gloo).", rich_help_panel=LAUNCH)]
MaxRestarts = Annotated[int, typer.Option("--max-restarts", min=0, help="Restart the whole job up to K times after a rank fails (DISTLAUNCH_RESTART_COUNT tells ranks which try it is).", rich_help_panel=LAUNCH)]
LogDir = Annotated[Optional[Path], typer.Option("--log-dir", help="Keep one log file per rank (rank<N>.log) in this folder.", rich_help_panel=LAUNCH)]
Env = Annotated[Optional[list[str]], typer.Option("--env", help="Set KEY=VALUE in every rank's environment (repeatable).", rich_help_panel=LAUNCH)]
SshConfig = Annotated[Optional[Path], typer.Option("--ssh-config", help="OpenSSH client config to use instead of ~/.ssh/config.", rich_help_panel=LAUNCH)]
AcceptNewHostKeys = Annotated[bool, typer.Option("--accept-new-host-keys", help="Accept and record SSH host keys not yet in known_hosts (default: refuse them and print the ssh-keyscan line). Changed keys are always refused.", rich_help_panel=LAUNCH)]
RemotePython = Annotated[Optional[str], typer.Option("--remote-python", help="Python on remote hosts that runs the agent and, unless --python is given, the ranks (default: the launcher's own path).", rich_help_panel=LAUNCH)]
Workdir = Annotated[Optional[str], typer.Option("--workdir", help="Working directory of the ranks on every host (default: the launcher's current directory).", rich_help_panel=LAUNCH)]
Python = Annotated[Optional[str], typer.Option("--python", help="Python interpreter that runs each rank (default: the launcher's own).", rich_help_panel=LAUNCH)]
GracePeriod = Annotated[float, typer.Option("--grace-period", min=0, help="Seconds between SIGTERM and SIGKILL when stopping ranks.", rich_help_panel=LAUNCH)]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan and start nothing.", rich_help_panel=LAUNCH)]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output: the plan with --dry-run, else the run report (rank output goes to stderr).", rich_help_panel=LAUNCH)]
Launcher = Annotated[str, typer.Option("--launcher", help="auto | slurm | agent. slurm: this srun task is one rank (RANK, WORLD_SIZE, MASTER_ADDR … from SLURM_*); agent: distlaunch starts the ranks itself (here, or over SSH); auto: slurm inside an srun task, else agent.", rich_help_panel=LAUNCH)]
