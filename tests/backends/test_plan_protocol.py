"""The dry-run draws and ``--json`` dumps a plan through ``contract.plan.Plan`` only: a plan type made here, that
has the protocol's members and nothing else (no pydantic, no backend's class), is drawn exactly as the backend's
own plan with the same content, in both views, and dumps its own JSON."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
from dataclasses import dataclass

import pytest
from rich.console import Console

from distlaunch.backends.registry import BACKENDS, named
from distlaunch.cli.render import print_json, render_plan
from distlaunch.contract.layout import Layout, layout_spec
from distlaunch.contract.plan import Plan, View
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.hostfile import parse_hostfile_text
from distlaunch.launcher.planning.plan import MASK, LaunchSpec, build_plan, mask_env
from distlaunch.slurm.env import map_rank
from distlaunch.slurm.step import read_step


@dataclass(frozen=True)
class Rank:
    rank: int
    local_rank: int
    device: str
    env: dict[str, str]
    argv: list[str]


@dataclass(frozen=True)
class Host:
    host: str


@dataclass(frozen=True)
class Node:
    host: str
    address: str
    node_rank: int
    workdir: str
    agent_python: str
    ranks: list[Rank]


@dataclass(frozen=True)
class Spares:
    min_nodes: int
    hosts: list[Host]


@dataclass(frozen=True)
class OnlyTheProtocol:
    """A plan of no backend distlaunch has: the protocol's members, and nothing more."""

    job_id: str
    world_size: int
    nnodes: int
    master_addr: str
    master_port: int
    backend: str
    parallel: Layout
    groups: dict[str, list[list[int]]]
    nodes: list[Node]
    spares: Spares | None
    cpu_bind: str
    preload: list[str]
    view: View

    def masked(self) -> OnlyTheProtocol:
        nodes = [dataclasses.replace(n, ranks=[dataclasses.replace(r, env=mask_env(r.env)) for r in n.ranks])
                 for n in self.nodes]  # fmt: skip
        return dataclasses.replace(self, nodes=nodes)

    def model_dump_json(self, *, indent: int | None = None) -> str:
        shown = {**dataclasses.asdict(self), "parallel": self.parallel.model_dump(mode="json")}
        return json.dumps(shown, indent=indent)


def copy_of(plan: Plan) -> OnlyTheProtocol:
    """``plan``'s content as read through the protocol, in a type of its own."""
    nodes = [
        Node(n.host, n.address, n.node_rank, n.workdir, n.agent_python,
             [Rank(r.rank, r.local_rank, r.device, dict(r.env), list(r.argv)) for r in n.ranks])
        for n in plan.nodes
    ]  # fmt: skip
    spares = plan.spares and Spares(plan.spares.min_nodes, [Host(h.host) for h in plan.spares.hosts])
    groups = {axis: [list(g) for g in found] for axis, found in plan.groups.items()}
    return OnlyTheProtocol(
        plan.job_id, plan.world_size, plan.nnodes, plan.master_addr, plan.master_port, plan.backend, plan.parallel,
        groups, nodes, spares, plan.cpu_bind, list(plan.preload), plan.view,
    )  # fmt: skip


def drawn(plan: Plan) -> str:
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=100, color_system=None, force_terminal=False))
    return out.getvalue()


def hosts_plan():
    hosts = parse_hostfile_text("node1 slots=2\nnode2 slots=2\nnode3 slots=2")
    spec = LaunchSpec(
        hosts=hosts[:2],
        command=["python3", "train.py", "--lr", "3e-4"],
        parallel=layout_spec("dp=2,tp=2"),
        master_addr="10.0.0.1",
        job_id="dl-protocol",
        env={"WANDB_API_KEY": "s3cret", "NCCL_DEBUG": "INFO"},
        agent_python="/usr/bin/python3",
        spares={"min_nodes": 1, "hosts": hosts[2:]},
    )
    return build_plan(spec)


def task_plan():
    env = {
        "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "gpu08",
    }  # fmt: skip
    rank = map_rank(read_step(env), "10.0.0.7")
    return rank.model_copy(update={"env": {**rank.env, "HF_TOKEN": "hf_abcdefghijkl"}, "argv": ["python3", "x.py"]})


@pytest.mark.parametrize("make", [hosts_plan, task_plan], ids=["hosts", "task"])
def test_a_plan_of_the_protocol_only_is_drawn_as_the_backends_own(make):
    plan = make()
    mine = copy_of(plan)
    assert drawn(mine) == drawn(plan)
    assert MASK in drawn(mine) and "s3cret" not in drawn(mine) and "hf_abcdefghijkl" not in drawn(mine)


def test_the_hosts_view_has_the_rows_the_groups_and_the_spares():
    text = drawn(copy_of(hosts_plan()))
    assert "Plan dl-protocol: world size 4 on 2 hosts, master 10.0.0.1:29500, backend gloo" in text
    assert "tp groups: [0,1] [2,3]" in text and "spares: node3" in text and "NCCL_DEBUG=INFO" in text


def test_the_task_view_is_one_line_of_the_rank_this_task_becomes():
    (line,) = drawn(copy_of(task_plan())).splitlines()
    assert line.startswith("[gpu08 rank 3] ") and line.endswith(" python3 x.py")
    assert f"HF_TOKEN={shlex.quote(MASK)}" in line


def test_json_is_the_plans_own_dump_masked(capsys):
    mine = copy_of(hosts_plan())
    print_json(mine.masked())
    shown = json.loads(capsys.readouterr().out)
    assert shown["job_id"] == "dl-protocol" and shown["nodes"][0]["ranks"][0]["env"]["WANDB_API_KEY"] == MASK
    assert shown["spares"]["hosts"] == [{"host": "node3"}]


@pytest.mark.parametrize("name", sorted(set(BACKENDS) - {"slurm", "k8s"}))
def test_a_backend_that_submits_nothing_says_so_in_one_line(name):
    with pytest.raises(UsageError, match="is not submitted to a scheduler"):
        named(name).submission({})
