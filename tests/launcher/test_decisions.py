"""The hosts decide: the backend, -n auto|gpu and the planner's GPU memory from the inventories the hosts report,
and one line naming the host that disagrees (launcher/planning/decisions.py)."""

from __future__ import annotations

import pytest

from distlaunch.contract.inventory import HostInventory
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.decisions import decide


def host(gpus: int, memory_mib: int | None = None) -> HostInventory:
    return HostInventory.model_validate(
        {"gpus": [{"index": i, "model": "H100", "memory_mib": memory_mib} for i in range(gpus)]}
    )


def refused(inventories, backend="auto", nproc=None) -> str:
    with pytest.raises(UsageError) as caught:
        decide(inventories, backend, nproc, "the hosts")
    return str(caught.value)


def test_auto_is_nccl_where_every_host_has_gpus_and_gloo_where_none_has():
    assert decide({"a": host(8), "b": host(8)}, "auto", None, "the hosts").backend == "nccl"
    assert decide({"a": host(0), "b": host(0)}, "auto", None, "the hosts").backend == "gloo"


def test_hosts_with_and_without_gpus_are_refused_naming_the_odd_host_and_the_override():
    message = refused({"a": host(8), "b": host(8), "c": host(0)})
    assert message.startswith("--backend auto: c has 0 GPUs but a has 8 GPUs") and "--backend gloo" in message
    assert refused({"a": host(0), "b": host(0), "c": host(4)}).startswith("--backend auto: c has 4 GPUs but a has 0")
    assert decide({"a": host(8), "c": host(0)}, "gloo", None, "the hosts").backend == "gloo"  # the override


def test_n_gpu_counts_each_hosts_gpus_and_refuses_different_counts():
    assert decide({"a": host(4), "b": host(4)}, "auto", "gpu", "x").ranks == {"a": 4, "b": 4}
    message = refused({"a": host(8), "b": host(8), "c": host(4)}, nproc="gpu")
    assert message.startswith("--nproc-per-node gpu: c has 4 GPUs but a has 8") and "-n 4" in message
    assert "b has no GPU" in refused({"a": host(2), "b": host(0)}, backend="gloo", nproc="gpu")
    assert decide({"a": host(2), "b": host(0)}, "gloo", "auto", "x").ranks == {"a": 2, "b": 1}
    assert decide({"a": host(2)}, "auto", 3, "x").ranks == {}  # a number: the user's, not the GPUs'


def test_the_planner_counts_on_the_smallest_gpu_of_the_hosts():
    decided = decide({"a": host(2, 81559), "b": host(2, 40960)}, "auto", None, "x")
    assert (decided.gpu_memory_mib, decided.gpu_memory_host) == (40960, "b")
    assert decide({"a": host(2, 81559), "b": host(2)}, "auto", None, "x").gpu_memory_mib is None  # one unknown


def test_a_host_without_an_inventory_is_one_line_only_where_it_matters():
    assert "b did not report its GPUs" in refused({"a": host(2), "b": None})
    assert decide({"a": host(2), "b": None}, "gloo", 2, "x").backend == "gloo"


def with_memory(mib: int | None) -> HostInventory:
    return HostInventory.model_validate({"memory_mib": mib})


def test_a_cpu_rank_counts_on_the_smallest_share_of_a_hosts_memory_naming_the_host():
    decided = decide({"a": with_memory(65536), "b": with_memory(8192)}, "gloo", 2, "the hosts")
    assert decided.host_memory_per_rank({"a": 2, "b": 2}) == (4 << 30, "MemTotal of b / 2 ranks")
    # per rank, not per host: 64 GiB over 16 ranks is less than 8 GiB over 1
    assert decided.host_memory_per_rank({"a": 16, "b": 1}) == (4 << 30, "MemTotal of a / 16 ranks")
    unknown = decide({"a": with_memory(65536), "b": with_memory(None)}, "gloo", 2, "the hosts")
    assert unknown.host_memory_per_rank({"a": 2, "b": 2}) == (None, "unknown: b did not report its memory")
    assert decided.host_memory_per_rank({"a": 2, "c": 2})[0] is None  # a host the decisions never heard of


def test_a_plan_the_hosts_decide_alike_is_kept_with_their_facts_as_read_now():
    """A host's free memory changes by the second, its decisions do not: the plan stays the one it was (a
    per-node plan, rebuilt from the options, would lose its node), with the facts read at start."""
    from pathlib import Path

    from distlaunch.contract.options import ExecOptions, LaunchOptions
    from distlaunch.launcher.running.launch import decided_plan, plan_for

    opts = LaunchOptions(program=[str(Path(__file__).parents[1] / "remote" / "ok_rank.py")], nproc_per_node=1)
    plan = plan_for(opts)
    host = plan.nodes[0].host
    stale = plan.decisions.inventories[host].model_copy(update={"memory_available_mib": 1})
    plan = plan.model_copy(update={"decisions": plan.decisions.model_copy(update={"inventories": {host: stale}})})
    plan.nodes[0].ranks[0].env["MARK"] = "this plan"
    decided = decided_plan(plan, opts, ExecOptions(), None)
    assert decided.nodes[0].ranks[0].env["MARK"] == "this plan"
    assert decided.decisions.inventories[host].memory_available_mib != 1
