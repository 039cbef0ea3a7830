"""Plans are pure data: golden files pin their JSON (regenerate with UPDATE_GOLDEN=1 after a deliberate change)."""

import json
import os
from pathlib import Path

import pytest

from distlaunch.agent.rankenv import FLIGHT_RECORDER_VARS, in_scratch
from distlaunch.contract.layout import layout_spec
from distlaunch.contract.options import LaunchOptions
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.hostfile import parse_hostfile_text, read_hostfile
from distlaunch.launcher.planning.plan import MASK, LaunchSpec, build_plan
from distlaunch.launcher.planning.spec import make_spec

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"


def spec(hosts, parallel=None, **kw) -> LaunchSpec:
    local = [h.host for h in hosts if h.host == "localhost"]
    kw = {"master_addr": "10.0.0.1", "master_port": 29500, "job_id": "dl-golden", "local_hosts": local, **kw}
    return LaunchSpec(
        hosts=hosts, command=["python3", "train.py", "--lr", "3e-4"], parallel=layout_spec(parallel), **kw
    )


CASES = {
    "two_hosts_dp2_tp2_pp2": lambda: spec(
        read_hostfile(ROOT / "hostfiles/deepspeed.txt"),
        "dp=2,tp=2,pp=2,zero=1",
        env={"WANDB_API_KEY": "s3cret", "NCCL_DEBUG": "INFO"},
    ),
    "local_4_gloo": lambda: spec(parse_hostfile_text("localhost slots=4"), master_addr="127.0.0.1"),
    "nccl_included_slots": lambda: spec(
        [h.model_copy(update={"slots": [2, 3]}) for h in parse_hostfile_text("gpu1 slots=4\ngpu2 slots=4")],
        "tp=2",
        backend="nccl",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_matches_golden(name):
    got = json.loads(build_plan(CASES[name]()).masked().model_dump_json())
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(path.read_text())


def test_tp_groups_are_consecutive_ranks_on_one_host():
    plan = build_plan(CASES["two_hosts_dp2_tp2_pp2"]())
    host_of = {r.rank: n.host for n in plan.nodes for r in n.ranks}
    assert plan.world_size == 8
    for group in plan.groups["tp"]:
        assert group == list(range(group[0], group[0] + len(group)))
        assert len({host_of[r] for r in group}) == 1


def test_env_contract_per_rank():
    plan = build_plan(CASES["two_hosts_dp2_tp2_pp2"]())
    rank5 = plan.nodes[1].ranks[1]
    env = rank5.env
    assert (rank5.rank, rank5.local_rank) == (5, 1)
    assert {
        k: env[k]
        for k in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "NODE_RANK",
            "GROUP_RANK",
            "NNODES",
            "MASTER_ADDR",
            "MASTER_PORT",
            "DISTLAUNCH_PARALLEL",
            "DISTLAUNCH_JOB_ID",
        )
    } == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "NNODES": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "DISTLAUNCH_PARALLEL": "dp=2,tp=2,pp=2,zero=1",
        "DISTLAUNCH_JOB_ID": "dl-golden",
    }


def test_secrets_masked_only_in_the_printable_copy():
    plan = build_plan(CASES["two_hosts_dp2_tp2_pp2"]())
    assert plan.nodes[0].ranks[0].env["WANDB_API_KEY"] == "s3cret"  # the ranks still get the value
    masked = plan.masked()
    assert masked.nodes[0].ranks[0].env["WANDB_API_KEY"] == MASK
    assert masked.nodes[0].ranks[0].env["NCCL_DEBUG"] == "INFO"
    assert "s3cret" not in masked.model_dump_json()


def test_gpu_slots_become_cuda_visible_devices():
    plan = build_plan(CASES["nccl_included_slots"]())
    assert [r.device for r in plan.nodes[0].ranks] == ["cuda:0", "cuda:1"]
    assert plan.nodes[1].ranks[0].env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_uneven_hosts_refuse_spanning_tp():
    with pytest.raises(UsageError, match="spans hosts"):
        build_plan(spec(parse_hostfile_text("a slots=3\nb slots=3"), "tp=2"))


def test_a_watched_job_plans_the_flight_recorder_unless_the_user_sets_it(tmp_path, monkeypatch):
    """With a hang watch every rank gets NCCL's flight recorder, dumping in its agent's scratch folder; a value the
    user exported stays theirs (local ranks inherit it), so the plan leaves that one out."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "500")
    opts = LaunchOptions(program=["train.py"], nproc_per_node=1)
    watched = build_plan(make_spec(opts, flight_recorder=True)).nodes[0].ranks[0].env
    assert {k: v for k, v in watched.items() if k in FLIGHT_RECORDER_VARS} == {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": "<scratch>/nccl_trace_rank_",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "<scratch>/nccl_dump_pipe_rank",
    }
    assert not set(FLIGHT_RECORDER_VARS) & set(build_plan(make_spec(opts)).nodes[0].ranks[0].env)


def test_the_agent_puts_its_scratch_folder_where_the_plan_names_it():
    env = {"DISTLAUNCH_PROGRESS_FILE": "<scratch>/rank3.progress", "NOTE": "a <scratch> in the middle stays"}
    assert in_scratch(env, "/tmp/distlaunch-agent-x") == {
        "DISTLAUNCH_PROGRESS_FILE": "/tmp/distlaunch-agent-x/rank3.progress",
        "NOTE": "a <scratch> in the middle stays",
    }
