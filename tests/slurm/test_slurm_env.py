"""The pure side of running inside an srun task: SLURM_* variables → the rank environment, and hostlists."""

from __future__ import annotations

import pytest

from distlaunch.contract.endpoint import STEP_PORTS
from distlaunch.contract.endpoint import step_port as derived_port
from distlaunch.contract.layout import layout_spec
from distlaunch.errors import UsageError
from distlaunch.slurm.address import master_address, node_addr_from_scontrol
from distlaunch.slurm.env import map_rank
from distlaunch.slurm.step import expand_nodelist, expand_tasks_per_node, in_srun_step, node_of_rank, read_step


def task_env(rank: int, node_id: int, local_id: int, **extra: str) -> dict[str, str]:
    """What srun -N 2 --ntasks-per-node 2 gives task ``rank`` (as seen on the test cluster)."""
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local_id),
        "SLURM_NODEID": str(node_id),
        "SLURM_NTASKS": "4",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURMD_NODENAME": f"gpu0{7 + node_id}",
    }
    return {**env, **extra}


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node1", ["node1"]),
        ("node[1-2]", ["node1", "node2"]),
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("gpu[09-11]", ["gpu09", "gpu10", "gpu11"]),
        ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("n[3,1-2]", ["n3", "n1", "n2"]),  # Slurm's order is kept: node_rank 0 is the first host listed
    ],
)
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-", "gpu[3-1]", ""])
def test_bad_nodelist_is_a_usage_error(text):
    with pytest.raises(UsageError, match=r"hostlist|empty"):
        expand_nodelist(text)


@pytest.mark.parametrize("text, counts", [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("3,1", [3, 1]), ("8(x2)", [8, 8])])
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


def test_every_task_of_a_step_maps_to_its_rank():
    envs = [task_env(0, 0, 0), task_env(1, 0, 1), task_env(2, 1, 0), task_env(3, 1, 1)]
    ranks = [map_rank(read_step(e), "10.0.0.7") for e in envs]
    assert [r.env["RANK"] for r in ranks] == ["0", "1", "2", "3"]
    assert [r.env["LOCAL_RANK"] for r in ranks] == ["0", "1", "0", "1"]
    assert [r.env["NODE_RANK"] for r in ranks] == [r.env["GROUP_RANK"] for r in ranks] == ["0", "0", "1", "1"]
    assert {r.env["WORLD_SIZE"] for r in ranks} == {"4"} and {r.env["LOCAL_WORLD_SIZE"] for r in ranks} == {"2"}
    assert {r.env["NNODES"] for r in ranks} == {"2"}
    # Every task agrees on the rendezvous without talking to the others.
    assert {(r.env["MASTER_ADDR"], r.env["MASTER_PORT"], r.env["DISTLAUNCH_JOB_ID"]) for r in ranks} == {
        ("10.0.0.7", str(derived_port("42", 0)), "slurm-42.0")
    }
    assert ranks[0].env["DISTLAUNCH_PARALLEL"] == "dp=4,tp=1,pp=1,zero=0"
    assert ranks[0].env["DISTLAUNCH_BACKEND"] == "gloo" and ranks[0].env["DISTLAUNCH_RESTART_COUNT"] == "0"
    assert [r.node for r in ranks] == ["gpu07", "gpu07", "gpu08", "gpu08"]


def test_uneven_tasks_per_node_give_each_node_its_local_world_size():
    env = task_env(3, 1, 0, SLURM_STEP_TASKS_PER_NODE="3,1", SLURM_TASKS_PER_NODE="3,1")
    rank = map_rank(read_step(env), "h")
    assert rank.local_world_size == 1 and rank.env["LOCAL_WORLD_SIZE"] == "1"
    assert read_step(task_env(1, 0, 1, SLURM_STEP_TASKS_PER_NODE="3,1")).local_world_size == 3


def test_step_variables_win_over_job_variables():
    # A step on 1 of the job's 2 nodes: the step's node list and counts are the ones that matter.
    env = task_env(
        0,
        0,
        0,
        SLURM_STEP_NODELIST="gpu08",
        SLURM_STEP_NUM_NODES="1",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_TASKS_PER_NODE="2",
    )
    step = read_step(env)
    assert (step.nodes, step.nnodes, step.world_size) == (["gpu08"], 1, 2)


def test_restart_count_comes_from_a_requeued_job():
    assert map_rank(read_step(task_env(0, 0, 0, SLURM_RESTART_COUNT="2")), "h").env["DISTLAUNCH_RESTART_COUNT"] == "2"


def test_ports_differ_between_jobs_and_steps_and_stay_in_range():
    ports = {derived_port(str(job), step) for job in range(1000, 1100) for step in range(4)}
    assert len(ports) == 400
    assert all(p in STEP_PORTS for p in ports)
    assert derived_port("4294967295", 3) < 32768  # below the kernel's ephemeral ports


def test_given_port_and_address_win():
    rank = map_rank(read_step(task_env(0, 0, 0)), "10.1.1.1", master_port=29999)
    assert (rank.env["MASTER_ADDR"], rank.env["MASTER_PORT"]) == ("10.1.1.1", "29999")
    assert master_address("gpu07", "given", {"MASTER_ADDR": "exported"}) == "given"
    assert master_address("gpu07", None, {"MASTER_ADDR": "exported"}) == "exported"


def test_unresolvable_node_falls_back_to_node_addr():
    assert master_address("localhost", None, {}) == "localhost"  # resolves: the name is kept
    line = "NodeName=node1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=localhost Version=22.05.8"
    assert node_addr_from_scontrol(line) == "127.0.0.1"
    assert node_addr_from_scontrol("NodeName=x NodeHostName=y") is None


def test_batch_script_and_salloc_shell_are_not_srun_tasks():
    batch = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # no step id
    assert not in_srun_step(batch)
    assert not in_srun_step({**batch, "SLURM_STEP_ID": "4294967294"})  # the batch step's id
    assert in_srun_step(task_env(0, 0, 0))
    with pytest.raises(UsageError, match="not inside an srun task step"):
        read_step(batch)


def test_tampered_variables_are_refused():
    with pytest.raises(UsageError, match="inconsistent Slurm step"):
        read_step(task_env(0, 0, 0, SLURM_NTASKS="5", SLURM_STEP_NUM_TASKS="5"))
    with pytest.raises(UsageError, match="SLURM_PROCID='x' is not an integer"):
        read_step(task_env(0, 0, 0, SLURM_PROCID="x"))
    bare = {k: v for k, v in task_env(0, 0, 0).items() if not k.startswith(("SLURM_STEP_NUM", "SLURM_STEP_TASKS"))}
    with pytest.raises(UsageError, match="SLURM_NNODES='0' is below 1"):  # was a ZeroDivisionError
        read_step({**bare, "SLURM_NNODES": "0"})
    with pytest.raises(UsageError, match="SLURM_NTASKS='abc' is not an integer"):  # named the unset step variable
        read_step({**bare, "SLURM_NTASKS": "abc"})


def test_layouts_of_block_and_cyclic_distribution():
    block = read_step(task_env(0, 0, 0, SLURM_STEP_TASKS_PER_NODE="2,1", SLURM_NTASKS="3"))
    assert node_of_rank(block) == [0, 0, 1]
    cyclic = read_step(
        task_env(0, 0, 0, SLURM_STEP_TASKS_PER_NODE="2,1", SLURM_NTASKS="3", SLURM_DISTRIBUTION="cyclic:block")
    )
    assert node_of_rank(cyclic) == [0, 1, 0]  # as srun -m cyclic placed them on the test cluster
    assert node_of_rank(read_step(task_env(0, 0, 0, SLURM_DISTRIBUTION="plane"))) is None


def test_parallel_spec_is_resolved_against_slurm_ntasks():
    rank = map_rank(read_step(task_env(0, 0, 0)), "h", parallel=layout_spec("dp=auto,tp=2"))
    assert rank.env["DISTLAUNCH_PARALLEL"] == "dp=2,tp=2,pp=1,zero=0"
