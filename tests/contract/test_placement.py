"""The placement rule (distlaunch/placement.py) on host inventories as the probe writes them: which CPUs each
rank gets under every --cpu-bind, always inside the usable CPUs, and the one-line refusals."""

from __future__ import annotations

import pytest

from distlaunch.errors import UsageError
from distlaunch.placement import check_sets, describe, parse_cpu_bind, rank_cpus, rank_gpu, slurm_bound

# two NUMA nodes of 4 CPUs, a GPU on each; the probing process may use every CPU
GPU_HOST = {
    "gpus": [{"index": 0, "numa_node": 1}, {"index": 1, "numa_node": 0}],
    "affinity": "0-7",
    "numa_nodes": [{"id": 0, "cpus": "0-3"}, {"id": 1, "cpus": "4-7"}],
}
CPU_HOST = {**GPU_HOST, "gpus": []}


def test_a_rank_with_a_gpu_gets_its_gpus_numa_node():
    assert rank_cpus("auto", GPU_HOST, 0, 2, gpu=0) == [4, 5, 6, 7]
    assert rank_cpus("auto", GPU_HOST, 1, 2, gpu=1) == [0, 1, 2, 3]
    assert rank_cpus("numa", GPU_HOST, 0, 2, gpu=0) == [4, 5, 6, 7]


def test_without_a_gpu_auto_and_cores_share_the_cpus_out_and_numa_the_nodes():
    assert [rank_cpus("auto", CPU_HOST, r, 4) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [rank_cpus("cores", GPU_HOST, r, 2, gpu=r) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [rank_cpus("numa", CPU_HOST, r, 4) for r in range(4)] == [[0, 1, 2, 3]] * 2 + [[4, 5, 6, 7]] * 2
    assert [rank_cpus("cores", CPU_HOST, r, 3) for r in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert [rank_cpus("cores", {"affinity": "0-1"}, r, 3) for r in range(3)] == [[0], [1], [0]]  # more ranks than CPUs


def test_a_binding_stays_inside_the_cpus_a_taskset_left():
    tasksetted = {**GPU_HOST, "affinity": "2-5"}
    assert rank_cpus("auto", tasksetted, 0, 2, gpu=0) == [4, 5]  # the GPU's node, as far as the taskset allows
    assert [rank_cpus("cores", tasksetted, r, 2) for r in range(2)] == [[2, 3], [4, 5]]
    with pytest.raises(UsageError, match="names CPU 0-1, outside the usable CPUs 2-5"):
        rank_cpus("0-1:2", tasksetted, 0, 2)


def test_none_and_a_list():
    assert rank_cpus("none", GPU_HOST, 0, 2, gpu=0) is None
    assert [rank_cpus("0,2:1,3", CPU_HOST, r, 2) for r in range(2)] == [[0, 2], [1, 3]]


@pytest.mark.parametrize("text", ["", "0-", "a:b", "0-3:", "3-1", "numa:0", "0;1"])
def test_bad_syntax_is_one_usage_error(text):
    with pytest.raises(UsageError, match="is not none, numa, cores or a list of CPU sets") as caught:
        parse_cpu_bind(text)
    assert "0-3:4-7" in caught.value.hint


def test_a_list_must_fit_the_host():
    with pytest.raises(UsageError, match="gives 1 CPU set for 2 ranks"):
        check_sets("0", 2, None)  # the count is known wherever the plan is
    with pytest.raises(UsageError, match="gives 3 CPU sets, more than the 2 usable CPUs"):
        check_sets("0:1:0", 2, [0, 1])
    check_sets("0:1:0", 2, None)  # the host's CPUs are not known here: its agent checks them
    check_sets("numa", 9, [0])


def test_the_gpu_a_rank_uses_is_its_local_rank_of_the_visible_ones():
    nccl = {"DISTLAUNCH_BACKEND": "nccl", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert rank_gpu(nccl, 1, GPU_HOST) == 3
    assert rank_gpu({"DISTLAUNCH_BACKEND": "nccl"}, 1, GPU_HOST) == 1
    assert rank_gpu({"DISTLAUNCH_BACKEND": "gloo", "CUDA_VISIBLE_DEVICES": "0"}, 0, GPU_HOST) is None
    assert rank_gpu(nccl, 0, CPU_HOST) is None


def test_a_binding_slurm_set_is_recognised():
    assert slurm_bound({"SLURM_CPU_BIND_TYPE": "mask_cpu:"})
    assert slurm_bound({"SLURM_CPU_BIND_TYPE": "cores"})
    assert not slurm_bound({"SLURM_CPU_BIND_TYPE": "none"})
    assert not slurm_bound({})


def test_the_plan_says_each_policy():
    assert describe("0-3:4-7") == "local rank 0 on CPUs 0-3, 1 on 4-7"
    assert "NUMA node" in describe("auto") and "equal share" in describe("auto")
