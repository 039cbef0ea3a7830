"""One srun task → one distlaunch rank: the torchrun-compatible environment, and the checks that catch a wrong step.

``map_rank`` is pure: it takes a parsed ``SlurmStep`` and the already resolved master address, so it is unit-tested
with plain dicts of SLURM_* variables.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel

from distlaunch.contract.endpoint import step_port
from distlaunch.contract.env import contract_env
from distlaunch.contract.layout import Layout, LayoutSpec, groups, resolve_layout, tp_group_across_nodes
from distlaunch.contract.plan import View, rank_device
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.decisions import decide_backend
from distlaunch.launcher.planning.plan import NodePlan, RankPlan, mask_env
from distlaunch.readable import plural
from distlaunch.slurm.step import SlurmStep, node_of_rank

# Derived ports stay below Linux's ephemeral range (32768+), where the kernel hands out client ports.


class SlurmRank(BaseModel):
    """One srun task as a distlaunch rank, with the environment the script is exec'd with. A
    ``contract.plan.Plan`` of one node holding one rank: the dry-run draws it as the task it becomes."""

    view: ClassVar[View] = "task"
    job_id: str  # DISTLAUNCH_JOB_ID: slurm-<job>.<step>
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    nnodes: int
    node: str
    master_addr: str
    master_port: int
    backend: Literal["gloo", "nccl"]
    parallel: Layout
    env: dict[str, str]  # the rank contract: MASTER_ADDR ... DISTLAUNCH_RESTART_COUNT
    argv: list[str] = []  # the program the task execs into
    cpu_bind: str = "auto"  # --cpu-bind, which the task applies to itself unless Slurm bound it (slurm/task.py)
    preload: list[str] = []  # the Plan protocol's --preload: under srun each task is its rank, nothing is forked

    def masked(self) -> SlurmRank:
        """A copy safe to print: secret-looking env values hidden."""
        return self.model_copy(update={"env": mask_env(self.env)})

    @property
    def nodes(self) -> list[NodePlan]:
        """This task's node, holding this task's rank only: Slurm placed the others."""
        device = rank_device(self.backend, self.local_rank)
        rank = RankPlan(rank=self.rank, local_rank=self.local_rank, device=device, env=self.env, argv=self.argv)
        return [NodePlan(host=self.node, address=self.node, node_rank=self.node_rank, ranks=[rank])]

    @property
    def groups(self) -> dict[str, list[list[int]]]:
        """The whole step's process groups, as every task computes them from the layout."""
        return groups(self.parallel)

    @property
    def spares(self) -> None:
        """An srun step has none: Slurm requeues a job, it does not replace a node."""
        return None


def check_nproc_per_node(step: SlurmStep, nproc_per_node: int | None) -> None:
    """Under srun each task is one rank: ``-n 8`` on a step of 4 tasks per node would mean 32 ranks per node."""
    if nproc_per_node is None or nproc_per_node == step.local_world_size:
        return
    raise UsageError(
        f"-n/--nproc-per-node {nproc_per_node} inside a Slurm step of {plural(step.local_world_size, 'task')} on {step.node_name or 'this node'}: "
        f"under srun every task is one rank, so {plural(step.local_world_size, 'task')} × {plural(nproc_per_node, 'process', 'processes')} would be "
        f"{step.local_world_size * nproc_per_node} ranks per node",
        f"drop -n and let srun start one task per rank: srun --ntasks-per-node={nproc_per_node} distlaunch run ...",
    )


def srun_shape(ntasks: int, nnodes: int) -> str:
    """The srun options that start ``ntasks`` tasks, spread evenly over ``nnodes`` nodes when they divide."""
    if ntasks % nnodes == 0:
        return f"srun -N {nnodes} --ntasks-per-node {ntasks // nnodes}"
    return f"srun -n {ntasks}"


def resolve_step_parallel(spec: LayoutSpec, step: SlurmStep) -> Layout:
    """Resolve --parallel against SLURM_NTASKS, with a fix that names srun's options."""
    layout = resolve_layout(spec, step.world_size, lambda n: f"{n} tasks: {srun_shape(n, step.nnodes)}")
    check_tp_within_nodes(layout, step)
    return layout


def _nodes_of(step: SlurmStep) -> dict[int, int]:
    """Node index per rank: the whole step for block/cyclic, else only this node's ranks (SLURM_GTIDS)."""
    layout = node_of_rank(step)
    if layout is not None:
        return dict(enumerate(layout))
    return {r: step.node_rank for r in step.ranks_here}


def check_tp_within_nodes(layout: Layout, step: SlurmStep) -> None:
    """A tensor-parallel group across nodes puts per-layer all-reduces on the network: refuse it."""
    node_of = _nodes_of(step)
    group = tp_group_across_nodes(layout, node_of.get)
    if group is not None:
        known = sorted({node_of[r] for r in group if r in node_of})
        names = ", ".join(step.nodes[n] for n in known)
        raise UsageError(
            f"--parallel tp={layout.tp}: tensor-parallel group of ranks {group[0]}..{group[-1]} spans nodes "
            f"({names}{', …' if len(known) < 2 else ''}; tasks per node {step.tasks_per_node}, "
            f"distribution {step.distribution})",
            f"use --ntasks-per-node a multiple of {layout.tp} with block distribution, or lower tp",
        )


def check_gpu_binding(step: SlurmStep, gpus_here: int) -> None:
    """Each rank uses cuda:LOCAL_RANK, so every task must see its node's GPUs, one per rank, none twice."""
    visible = step.visible_gpus if step.visible_gpus is not None else [str(i) for i in range(gpus_here)]
    shown = f"CUDA_VISIBLE_DEVICES={','.join(visible)}"
    repeated = sorted({g for g in visible if visible.count(g) > 1})
    if repeated:
        raise UsageError(
            f"{shown} on {step.node_name or 'this node'} names GPU {', '.join(repeated)} more than once: "
            "two ranks would be given the same GPU",
            "list every GPU once (or leave CUDA_VISIBLE_DEVICES to Slurm)",
        )
    lws = step.local_world_size
    if len(visible) >= lws:
        return
    where = f"rank {step.rank} (SLURM_LOCALID={step.local_rank}) on {step.node_name or 'this node'}"
    if len(visible) == 1:
        raise UsageError(
            f"{where} sees one GPU ({shown}) but its node runs {lws} ranks: srun bound each task to its own "
            "GPU, so cuda:LOCAL_RANK does not exist for LOCAL_RANK ≥ 1",
            "let every task see the node's GPUs: srun --gpus-per-node=N --gpu-bind=none (distlaunch slurm run "
            "does this) instead of --gpus-per-task",
        )
    raise UsageError(
        f"{where}: {plural(lws, 'rank')} on this node but {plural(len(visible), 'GPU')} visible ({shown}): ranks would share a "
        "GPU or find none",
        f"ask for one GPU per rank (--gpus-per-node={lws}) or run --ntasks-per-node={len(visible)}",
    )


def pick_backend(backend: str, step: SlurmStep, gpus_here: int) -> Literal["gloo", "nccl"]:
    """``auto``: nccl when this task sees a GPU (Slurm's CUDA_VISIBLE_DEVICES, else the driver), else gloo: the
    rule every host decides by (launcher/planning/decisions.py), this task's node being its host."""
    seen = len(step.visible_gpus) if step.visible_gpus is not None else gpus_here
    return decide_backend(backend, {step.node_name or "this node": seen})


def map_rank(
    step: SlurmStep,
    master_addr: str,
    *,
    master_port: int | None = None,
    parallel: LayoutSpec = LayoutSpec(),
    backend: str = "auto",
    gpus_here: int = 0,
    nproc_per_node: int | None = None,
) -> SlurmRank:
    """Map SLURM_PROCID/LOCALID/NTASKS/NODEID/NNODES onto RANK/LOCAL_RANK/WORLD_SIZE/NODE_RANK/NNODES, after checks."""
    check_nproc_per_node(step, nproc_per_node)
    resolved = resolve_step_parallel(parallel, step)
    chosen = pick_backend(backend, step, gpus_here)
    if chosen == "nccl":
        check_gpu_binding(step, gpus_here)
    port = master_port if master_port is not None else step_port(step.job_id, step.step_id)
    job_id = f"slurm-{step.job_id}.{step.step_id}"
    env = contract_env(
        master_addr=master_addr,
        master_port=port,
        world_size=step.world_size,
        rank=step.rank,
        local_rank=step.local_rank,
        local_world_size=step.local_world_size,
        node_rank=step.node_rank,
        nnodes=step.nnodes,
        job_id=job_id,
        parallel=resolved,
        backend=chosen,
        restart_count=step.restart_count,
    )
    return SlurmRank(
        job_id=job_id,
        rank=step.rank,
        local_rank=step.local_rank,
        world_size=step.world_size,
        local_world_size=step.local_world_size,
        node_rank=step.node_rank,
        nnodes=step.nnodes,
        node=step.nodes[step.node_rank],
        master_addr=master_addr,
        master_port=port,
        backend=chosen,
        parallel=resolved,
        env=env,
    )
