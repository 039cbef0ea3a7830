"""The Slurm variables of one srun task, read into a ``SlurmStep`` (pure: give it a dict of env vars)."""

from __future__ import annotations

from collections.abc import Mapping

import hostlist
from pydantic import BaseModel

from distlaunch.errors import UsageError
from distlaunch.readable import plural

# Slurm gives special steps (batch, extern, interactive) ids from this value up; they are not srun task steps.
_SPECIAL_STEP_IDS = 0xFFFFFFF0


class SlurmStep(BaseModel):
    """Where one srun task sits in its job step: the raw facts, before any distlaunch decision."""

    job_id: str
    step_id: int
    rank: int  # SLURM_PROCID
    local_rank: int  # SLURM_LOCALID
    world_size: int  # SLURM_NTASKS (SLURM_STEP_NUM_TASKS)
    node_rank: int  # SLURM_NODEID, relative to the step's node list
    nnodes: int
    nodes: list[str]  # the step's node list, expanded, in Slurm's order (node_rank 0 first)
    tasks_per_node: list[int]  # expanded SLURM_STEP_TASKS_PER_NODE, one entry per node of the step
    distribution: str = "block"  # node-level task distribution (SLURM_DISTRIBUTION before ':')
    ranks_here: list[int] = []  # SLURM_GTIDS: the global ranks on this task's node
    node_name: str = ""  # SLURMD_NODENAME
    restart_count: int = 0  # SLURM_RESTART_COUNT: how often the batch job was requeued
    visible_gpus: list[str] | None = None  # CUDA_VISIBLE_DEVICES as this task sees it; None when unset

    @property
    def local_world_size(self) -> int:
        """Tasks (ranks) on this task's node."""
        return self.tasks_per_node[self.node_rank]


def expand_nodelist(text: str) -> list[str]:
    """Expand a Slurm hostlist such as ``gpu[01-04,07],cpu-[1-2]-ib`` into host names, in order."""
    try:
        hosts = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        raise UsageError(
            f"Slurm node list {text!r} is not a valid hostlist ({exc})",
            "check SLURM_JOB_NODELIST / SLURM_STEP_NODELIST, e.g. gpu[01-04,07]",
        ) from None
    if not hosts:
        raise UsageError(f"Slurm node list {text!r} is empty", "run inside a Slurm job step (srun ...)")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand Slurm's compressed task counts, e.g. ``2(x3),1`` → ``[2, 2, 2, 1]``."""
    try:
        counts = hostlist.parse_slurm_tasks_per_node(text)
    except (ValueError, hostlist.BadHostlist):
        counts = []
    if not counts or min(counts) < 1:
        raise UsageError(
            f"Slurm tasks per node {text!r} is not a task count list",
            "expected e.g. 4 or 2(x3),1 in SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE",
        )
    return counts


def _first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return value
    return None


def _int(environ: Mapping[str, str], *names: str, default: int | None = None, least: int = 0) -> int:
    """The first of ``names`` that is set, as an integer of at least ``least``; a UsageError names the one read."""
    name = next((n for n in names if environ.get(n) not in (None, "")), None)
    if name is None:
        if default is not None:
            return default
        raise UsageError(
            f"{names[0]} is not set: this is not an srun task",
            "start it under srun (srun distlaunch run train.py), or use distlaunch slurm run",
        )
    value = environ[name]
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{name}={value!r} is not an integer", "run inside an unmodified Slurm job step") from None
    if number < least:
        raise UsageError(f"{name}={value!r} is below {least}", "run inside an unmodified Slurm job step")
    return number


def step_id_of(environ: Mapping[str, str]) -> int | None:
    """The numeric step id of an srun task, or None outside a task step (batch script, salloc shell)."""
    value = _first(environ, "SLURM_STEP_ID", "SLURM_STEPID")
    if value is None or not value.isdigit() or int(value) >= _SPECIAL_STEP_IDS:
        return None
    return int(value)


def in_srun_step(environ: Mapping[str, str]) -> bool:
    """True inside a task started by srun; False in a batch script or salloc shell (they set SLURM_PROCID too)."""
    return "SLURM_PROCID" in environ and step_id_of(environ) is not None


def _visible_gpus(environ: Mapping[str, str]) -> list[str] | None:
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [g.strip() for g in value.split(",") if g.strip()]


def read_step(environ: Mapping[str, str]) -> SlurmStep:
    """Parse one srun task's SLURM_* variables; a UsageError says which is missing or wrong."""
    step_id = step_id_of(environ)
    job_id = _first(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    if step_id is None or job_id is None or "SLURM_PROCID" not in environ:
        raise UsageError(
            "not inside an srun task step (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID are not all set)",
            "start it with srun (srun distlaunch run train.py), or let distlaunch slurm run call srun",
        )
    nodelist = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") or ""
    nodes = expand_nodelist(nodelist)
    tasks_text = _first(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    world_size = _int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", least=1)
    nnodes = _int(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", default=len(nodes), least=1)
    tasks_per_node = expand_tasks_per_node(tasks_text) if tasks_text else [world_size // nnodes] * nnodes
    gtids = environ.get("SLURM_GTIDS", "")
    step = SlurmStep(
        job_id=job_id,
        step_id=step_id,
        rank=_int(environ, "SLURM_PROCID"),
        local_rank=_int(environ, "SLURM_LOCALID"),
        world_size=world_size,
        node_rank=_int(environ, "SLURM_NODEID"),
        nnodes=nnodes,
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        distribution=(environ.get("SLURM_DISTRIBUTION") or "block").split(":")[0],
        ranks_here=[int(r) for r in gtids.split(",") if r.strip().isdigit()],
        node_name=environ.get("SLURMD_NODENAME", ""),
        restart_count=_int(environ, "SLURM_RESTART_COUNT", default=0),
        visible_gpus=_visible_gpus(environ),
    )
    _check_consistent(step)
    return step


def _check_consistent(step: SlurmStep) -> None:
    if (
        len(step.nodes) != step.nnodes
        or len(step.tasks_per_node) != step.nnodes
        or sum(step.tasks_per_node) != step.world_size
    ):
        raise UsageError(
            f"inconsistent Slurm step: {plural(step.nnodes, 'node')} {step.nodes}, tasks per node {step.tasks_per_node}, "
            f"{plural(step.world_size, 'task')}",
            "do not override SLURM_* variables by hand; let srun set them",
        )
    if not (
        0 <= step.rank < step.world_size
        and 0 <= step.node_rank < step.nnodes
        and 0 <= step.local_rank < step.local_world_size
    ):
        raise UsageError(
            f"inconsistent Slurm task: SLURM_PROCID={step.rank} of {step.world_size}, SLURM_NODEID={step.node_rank} "
            f"of {step.nnodes}, SLURM_LOCALID={step.local_rank}",
            "do not override SLURM_* variables by hand",
        )


def node_of_rank(step: SlurmStep) -> list[int] | None:
    """Node index of every rank under the step's distribution (block or cyclic); None when Slurm's layout is other."""
    if step.distribution == "block":
        return [node for node, count in enumerate(step.tasks_per_node) for _ in range(count)]
    if step.distribution == "cyclic":
        # Round robin over the nodes, skipping nodes that already hold all their tasks.
        left, layout = list(step.tasks_per_node), []
        while len(layout) < step.world_size:
            for node in range(step.nnodes):
                if left[node]:
                    layout.append(node)
                    left[node] -= 1
        return layout
    return None
