"""The mistakes people make on Slurm, each caught before a GPU hour is spent, with the values and the fix."""

from __future__ import annotations

import pytest

from distlaunch.contract.layout import layout_spec
from distlaunch.errors import ExitCode, UsageError
from distlaunch.slurm.env import map_rank
from distlaunch.slurm.job import SlurmJobOptions, resolve_job
from distlaunch.slurm.step import read_step
from tests.slurm.test_slurm_env import task_env

NODE_GPUS = "0,1,2,3"


def gpu_task(local_id: int, visible: str, per_node: int = 4) -> dict[str, str]:
    """Task ``local_id`` of a step with ``per_node`` tasks on each of 2 nodes, seeing CUDA_VISIBLE_DEVICES=visible."""
    return task_env(
        local_id,
        0,
        local_id,
        SLURM_NTASKS=str(2 * per_node),
        SLURM_STEP_TASKS_PER_NODE=f"{per_node}(x2)",
        CUDA_VISIBLE_DEVICES=visible,
    )


def test_nproc_per_node_inside_a_step_is_the_classic_mistake():
    with pytest.raises(UsageError) as err:
        map_rank(read_step(task_env(0, 0, 0)), "h", nproc_per_node=8)
    assert "-n/--nproc-per-node 8 inside a Slurm step of 2 tasks" in str(err.value)
    assert "2 tasks × 8 processes would be 16 ranks per node" in str(err.value)
    assert "srun --ntasks-per-node=8" in err.value.hint
    assert err.value.exit_code == ExitCode.USAGE
    map_rank(read_step(task_env(0, 0, 0)), "h", nproc_per_node=2)  # saying what srun does is fine


def test_parallel_spec_that_does_not_match_slurm_ntasks():
    with pytest.raises(UsageError, match=r"dp\(2\)\*tp\(2\)\*pp\(2\) = 8 != world size 4") as err:
        map_rank(read_step(task_env(0, 0, 0)), "h", parallel=layout_spec("dp=2,tp=2,pp=2"))
    assert "srun -N 2 --ntasks-per-node 4" in err.value.hint
    with pytest.raises(UsageError, match=r"dp=auto: world size 4 is not divisible by tp\(3\)\*pp\(1\)=3"):
        map_rank(read_step(task_env(0, 0, 0)), "h", parallel=layout_spec("tp=3"))


def test_tensor_parallel_group_spanning_nodes():
    with pytest.raises(UsageError, match=r"tp=4: tensor-parallel group of ranks 0..3 spans nodes \(gpu07, gpu08"):
        map_rank(read_step(task_env(0, 0, 0)), "h", parallel=layout_spec("tp=4"))
    cyclic = task_env(0, 0, 0, SLURM_DISTRIBUTION="cyclic")  # ranks 0,2 on gpu07 and 1,3 on gpu08
    with pytest.raises(UsageError, match="distribution cyclic"):
        map_rank(read_step(cyclic), "h", parallel=layout_spec("tp=2"))
    plane = task_env(2, 1, 0, SLURM_DISTRIBUTION="plane", SLURM_GTIDS="2,3")  # only this node's ranks are known
    map_rank(read_step(plane), "h", parallel=layout_spec("tp=2"))
    with pytest.raises(UsageError, match="spans nodes"):
        map_rank(read_step({**plane, "SLURM_GTIDS": "1,2"}), "h", parallel=layout_spec("tp=2"))


def test_every_task_sees_the_node_gpus_and_picks_its_own():
    rank = map_rank(read_step(gpu_task(3, NODE_GPUS)), "h")
    assert rank.backend == "nccl" and rank.env["LOCAL_RANK"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in rank.env  # Slurm owns it; distlaunch leaves it alone


def test_gpu_bound_per_task_does_not_match_local_rank():
    with pytest.raises(UsageError) as err:
        map_rank(read_step(gpu_task(2, "2")), "h")
    assert "rank 2 (SLURM_LOCALID=2) on gpu07 sees one GPU (CUDA_VISIBLE_DEVICES=2) but its node runs 4 ranks" in str(
        err.value
    )
    assert "--gpu-bind=none" in err.value.hint


def test_fewer_gpus_than_ranks_on_a_node():
    with pytest.raises(UsageError, match=r"8 ranks on this node but 4 GPUs visible") as err:
        map_rank(read_step(gpu_task(0, NODE_GPUS, per_node=8)), "h")
    assert "--gpus-per-node=8" in err.value.hint and "--ntasks-per-node=4" in err.value.hint


def test_the_same_gpu_given_twice():
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES=0,0,1,1 on gpu07 names GPU 0, 1 more than once"):
        map_rank(read_step(gpu_task(0, "0,0,1,1")), "h")


def test_gloo_ignores_gpus_and_no_gpus_means_gloo():
    assert map_rank(read_step(gpu_task(2, "2")), "h", backend="gloo").backend == "gloo"
    assert map_rank(read_step(task_env(0, 0, 0, CUDA_VISIBLE_DEVICES="")), "h").backend == "gloo"


def job(**kw) -> SlurmJobOptions:
    return SlurmJobOptions(program=["distlaunch.examples.allreduce"], module=True, python="python3", **kw)


def test_ntasks_per_node_and_nproc_per_node_must_agree():
    with pytest.raises(UsageError) as err:
        resolve_job(job(nodes=2, ntasks_per_node=4, nproc_per_node=8), {})
    assert "4 tasks × 8 processes would be 32 ranks per node" in str(err.value)
    assert err.value.hint == "give one of them: --ntasks-per-node 8"
    assert resolve_job(job(nodes=2, nproc_per_node=8), {}).world_size == 16


def test_job_shape_errors():
    with pytest.raises(UsageError, match=r"--ntasks 6 != -N 2 × --ntasks-per-node 4 = 8"):
        resolve_job(job(nodes=2, ntasks_per_node=4, ntasks=6), {})
    with pytest.raises(UsageError, match="--ntasks 5 does not split evenly over 2 node"):
        resolve_job(job(nodes=2, ntasks=5), {})
    with pytest.raises(UsageError, match="-N/--nodes 0 must be at least 1"):
        resolve_job(job(nodes=0), {})


def test_an_allocation_made_with_ntasks_gives_its_tasks_per_node():
    # sbatch -N2 -n4 (no --ntasks-per-node): 2 per node, not 1 (SLURM_NTASKS_PER_NODE is not set then)
    allocation = {"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert resolve_job(job(), allocation).world_size == 4
    assert resolve_job(job(), {"SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "3"}).world_size == 3
    assert resolve_job(job(nodes=1), allocation).world_size == 1  # a run on part of it: not the allocation's count
    with pytest.raises(UsageError, match=r"the allocation has 3 tasks \(SLURM_NTASKS\) on 2 nodes"):
        resolve_job(job(), {"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "3"})
    assert resolve_job(job(ntasks_per_node=1), {"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "3"}).world_size == 2


def test_job_gpus_one_per_rank():
    with pytest.raises(
        UsageError, match="--ntasks-per-node 8 with --gpus-per-node 4: two ranks would be given the same GPU"
    ):
        resolve_job(job(nodes=1, ntasks_per_node=8, gpus_per_node=4), {})
    with pytest.raises(UsageError, match=r"--gpus-per-node 8 with --ntasks-per-node 4: 4 GPUs per node would idle"):
        resolve_job(job(nodes=1, ntasks_per_node=4, gpus_per_node=8), {})
    assert resolve_job(job(nodes=2, gpus_per_node=4), {}).ntasks_per_node == 4  # one task per GPU by default


def test_job_parallel_errors():
    with pytest.raises(UsageError, match=r"dp\(2\)\*tp\(2\)\*pp\(2\) = 8 != world size 4") as err:
        resolve_job(job(nodes=2, ntasks_per_node=2, parallel="dp=2,tp=2,pp=2"), {})
    assert err.value.hint == "use dp=auto, or start -N 2 --ntasks-per-node 4"
    with pytest.raises(UsageError, match=r"tensor-parallel group of ranks 4\.\.7 would span nodes"):
        resolve_job(job(nodes=2, ntasks_per_node=6, parallel="tp=4"), {})


def test_inside_an_allocation_the_shape_comes_from_it():
    alloc = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_GPUS_PER_NODE": "a100:2",
        "SLURM_CPUS_PER_TASK": "6",
    }
    resolved = resolve_job(job(), alloc)
    assert (resolved.nodes, resolved.ntasks_per_node, resolved.world_size, resolved.gpus_per_node) == (3, 2, 6, 2)
    assert resolved.allocation == "7"
    assert "--cpus-per-task=6" in resolved.srun  # srun >= 22.05 does not inherit it by itself
