"""Flags users bring from torchrun, DeepSpeed, accelerate, Horovod and mpirun, and what distlaunch calls them."""

from __future__ import annotations

from distlaunch.errors import UsageError

HOSTS = "use -H/--hostfile FILE (or -H node1:2,node2:2): distlaunch starts every node itself"
PER_NODE = "use -H FILE (distlaunch starts every node), or 'distlaunch run --nnodes N --node-rank I' on each node"

# flag (dashes, as typed or after underscores became dashes) -> (tool, distlaunch equivalent)
PEER_FLAGS: dict[str, tuple[str, str]] = {
    "--nnodes": ("torchrun", PER_NODE),  # run has them (per-node mode); train, doctor and slurm do not
    "--node-rank": ("torchrun", PER_NODE),
    "--standalone": ("torchrun", "not needed: without -H, distlaunch runs on this machine only"),
    "--rdzv-endpoint": ("torchrun", "use --master-addr ADDR --master-port PORT, or 'distlaunch run --rdzv-endpoint'"),
    "--rdzv-backend": ("torchrun", "not needed: ranks meet at --master-addr/--master-port"),
    "--rdzv-id": ("torchrun", "not needed: distlaunch draws a job id (TORCHELASTIC_RUN_ID)"),
    "--tee": ("torchrun", "not needed: rank output is always shown and kept in files: distlaunch logs JOB"),
    "--redirects": ("torchrun", "not needed: each rank's output is kept in a file of its own (--log-dir DIR)"),
    "--run-path": ("torchrun", "not needed: distlaunch runs SCRIPT as python does (or -m MODULE)"),
    "--use-env": ("torch.distributed.launch", "not needed: every rank finds LOCAL_RANK in its environment"),
    "--local-rank": (
        "torch.distributed.launch",
        "ranks read LOCAL_RANK from the environment; distlaunch never adds --local_rank to a script's arguments",
    ),
    "--num-gpus": ("deepspeed", "use -n N (processes per host)"),
    "--num-nodes": ("deepspeed", HOSTS),
    "--num-processes": ("accelerate", "use -n N (processes per host)"),
    "--num-machines": ("accelerate", HOSTS),
    "--machine-rank": ("accelerate", HOSTS),
    "--main-process-ip": ("accelerate", "use --master-addr ADDR"),
    "--main-process-port": ("accelerate", "use --master-port PORT"),
    "-N": ("sbatch/srun", "use -H FILE (distlaunch starts every host), or 'distlaunch slurm run -N NODES'"),
    "--nodes": ("sbatch/srun", "use -H FILE (distlaunch starts every host), or 'distlaunch slurm run -N NODES'"),
    "--ntasks-per-node": ("sbatch/srun", "use -n N (ranks per host)"),
    "--ntasks": ("sbatch/srun", "use -n N (ranks per host; with a hostfile of H hosts the world size is H × N)"),
    "--host": ("mpirun/horovodrun", "use -H node1:2,node2:2"),
    "-x": ("mpirun", "use --env NAME (forwards NAME's value) or --env NAME=value"),
    "--bind-to": ("mpirun", "not needed: each rank is one process on its slot"),
    "--map-by": ("mpirun", "not needed: ranks fill hosts in hostfile order"),
}


def peer_equivalent(option: str, command: str) -> str:
    """The line for an unknown option: its distlaunch equivalent when another launcher spells it so."""
    known = PEER_FLAGS.get(option) or PEER_FLAGS.get(option.replace("_", "-"))
    if known:
        tool, equivalent = known
        return f"{option} is {tool}'s option, not {command}'s (hint: in distlaunch, {equivalent})"
    return f"No such option: {option} (hint: see '{command} --help')"


def check_peer_spellings(args: list[str]) -> None:
    """mpirun's ``-np N`` would parse as ``-n p``: answer it with the distlaunch spelling instead."""
    for i, arg in enumerate(args):
        if arg == "--" or arg.endswith(".py"):
            return
        if arg == "-np" or arg.startswith("-np="):
            n = arg[4:] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "N")
            n = n if n.isdigit() else "N"
            raise UsageError(
                f"-np {n} is mpirun's spelling: distlaunch writes -n {n}, and -n counts processes per host",
                f"write -n {n} (with a hostfile of H hosts the world size is H × {n})",
            )
