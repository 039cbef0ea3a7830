"""torchrun's whole per-rank environment on every backend, and @record error files in the root-cause table."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from distlaunch.contract.layout import layout_spec
from distlaunch.contract.options import LaunchOptions
from distlaunch.launcher.elastic.pernode import node_plan
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.plan import LaunchSpec, build_plan
from distlaunch.launcher.planning.spec import make_spec
from distlaunch.slurm.env import map_rank
from distlaunch.slurm.step import read_step
from distlaunch.slurm.task import task_env
from tests.helpers import run_cli
from tests.slurm.test_slurm_env import task_env as srun_task_env

TORCHRUN_KEYS = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
}


def test_local_per_node_and_srun_step_ranks_carry_the_same_variables(tmp_path, monkeypatch):
    for name in ("OMP_NUM_THREADS", "PYTHONUNBUFFERED", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("")
    for backend in ("gloo", "nccl"):
        opts = LaunchOptions(program=[str(script)], nproc_per_node=2, backend=backend, parallel="tp=2")
        local = build_plan(make_spec(opts)).nodes[0].ranks[1].env
        srun = task_env(
            map_rank(
                read_step(srun_task_env(1, 0, 1)),
                "gpu07",
                backend=backend,
                parallel=layout_spec("tp=2"),
                gpus_here=2,
            ),
            opts,
            {},
        )
        per_node = node_plan(opts, nnodes=2, node_rank=1).nodes[0].ranks[1].env  # torchrun --nnodes form
        local.pop("CUDA_VISIBLE_DEVICES", None)  # local nccl names the slots' GPUs; under srun, Slurm does
        assert srun.pop("DISTLAUNCH_SAVED_FILE").endswith("/jobs/slurm-42/saved/rank1.json")  # no agent: its record
        per_node.pop("CUDA_VISIBLE_DEVICES", None)
        assert set(local) == set(srun) == set(per_node), backend
        assert per_node["RANK"] == "3" and per_node["GROUP_RANK"] == "1"
        assert set(local) >= TORCHRUN_KEYS
        assert ("TORCH_NCCL_ASYNC_ERROR_HANDLING" in local) == (backend == "nccl")
        for env in (local, srun):
            assert env["ROLE_RANK"] == env["RANK"] == "1"
            assert env["TORCHELASTIC_RUN_ID"] == env["DISTLAUNCH_JOB_ID"]
            assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
            assert env["PYTHONUNBUFFERED"] == "1"


def test_every_rank_gets_its_own_error_file_and_the_restart_budget():
    spec = LaunchSpec(
        hosts=[HostSlots(host="a", slots=[0, 1]), HostSlots(host="b", slots=[0, 1])],
        command=["python", "x.py"],
        job_id="dl-test",
        max_restarts=3,
    )
    ranks = [r for node in build_plan(spec).nodes for r in node.ranks]
    assert len({r.env["TORCHELASTIC_ERROR_FILE"] for r in ranks}) == 4
    assert {r.env["TORCHELASTIC_MAX_RESTARTS"] for r in ranks} == {"3"}
    assert [r.env["GROUP_WORLD_SIZE"] for r in ranks] == ["2"] * 4


ELASTIC = """
import json, os
import torch.distributed as dist
dist.init_process_group("gloo")
t = __import__("torch").ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
keys = ["TORCHELASTIC_RUN_ID", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS"]
print("ELASTIC " + json.dumps({"launched": dist.is_torchelastic_launched(), "sum": t.item(),
                               **{k: os.environ[k] for k in keys}}))
dist.destroy_process_group()
"""


def test_torch_sees_a_torchelastic_launch_and_one_world(tmp_path):
    (tmp_path / "elastic.py").write_text(ELASTIC)
    out = run_cli("run", "-n", "2", "--max-restarts", "1", str(tmp_path / "elastic.py"), timeout=180)
    assert out.returncode == 0, out.stderr
    seen = [json.loads(line.split("ELASTIC ", 1)[1]) for line in out.stdout.splitlines() if "ELASTIC " in line]
    assert len(seen) == 2
    for s in seen:
        assert s["launched"] is True and s["sum"] == 3.0
        assert s["GROUP_WORLD_SIZE"] == "1" and s["ROLE_WORLD_SIZE"] == "2"
        assert s["TORCHELASTIC_RESTART_COUNT"] == "0" and s["TORCHELASTIC_MAX_RESTARTS"] == "1"


RECORDED = textwrap.dedent(
    """
    import os, sys
    from torch.distributed.elastic.multiprocessing.errors import record

    def load(step):
        raise ValueError(f"bad shard {step} on rank {os.environ['RANK']}")

    @record
    def main():
        if os.environ["RANK"] == "1":
            print("some output before the error")
            load(7)

    if __name__ == "__main__":
        main()
    """
)


def test_a_recorded_exception_is_the_root_cause(tmp_path: Path):
    (tmp_path / "recorded.py").write_text(RECORDED)
    out = run_cli("run", "-n", "2", "--json", str(tmp_path / "recorded.py"), timeout=180)
    assert out.returncode == 1, out.stderr
    assert "ValueError: bad shard 7 on rank 1" in out.stderr
    assert "in load" in out.stderr and "raise ValueError" in out.stderr
    assert "Traceback" not in out.stderr.split("root cause first")[-1]
    failure = json.loads(out.stdout)["failures"][0]
    assert failure["rank"] == 1
    assert failure["error"]["type"] == "ValueError"
    assert failure["error"]["message"] == "bad shard 7 on rank 1"
    assert "recorded.py" in failure["error"]["frame"] and "in load" in failure["error"]["frame"]
    job = json.loads(out.stdout)["job_id"]
    assert not Path(f"/tmp/distlaunch-{job}-rank1-error.json").exists()  # read once, then removed


def test_without_an_error_file_the_table_shows_the_output_tail(tmp_path: Path):
    (tmp_path / "plain.py").write_text("import sys\nprint('last words')\nsys.exit(4)\n")
    out = run_cli("run", "-n", "1", "--json", str(tmp_path / "plain.py"), timeout=120)
    assert out.returncode == 4
    failure = json.loads(out.stdout)["failures"][0]
    assert failure["error"] is None and failure["tail"] == ["last words"]
    assert "last words" in out.stderr.split("root cause first")[-1]


def test_a_dry_run_inside_an_srun_step_shows_every_added_variable(tmp_path, monkeypatch):
    from tests.helpers import invoke

    monkeypatch.chdir(tmp_path)
    environ = {**srun_task_env(1, 0, 1), "MASTER_ADDR": "10.0.0.7", "OMP_NUM_THREADS": "", "PYTHONUNBUFFERED": ""}
    for name in ("OMP_NUM_THREADS", "PYTHONUNBUFFERED"):
        monkeypatch.delenv(name, raising=False)
        environ.pop(name)
    r = invoke(["run", "--dry-run", "--json", "--env", "DLTEST_X=1", "train.py"], env=environ)
    assert r.exit_code == 0, r.stderr
    env = json.loads(r.stdout)["env"]
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTHONUNBUFFERED"] == "1" and env["DLTEST_X"] == "1"
    assert set(env) >= TORCHRUN_KEYS and "SLURM_PROCID" not in env


def test_sbatch_dry_run_json_is_json(tmp_path, monkeypatch):
    from tests.helpers import invoke

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    r = invoke(["slurm", "sbatch", "-N", "2", "--ntasks-per-node", "2", "--dry-run", "--json", "train.py"])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["script"].startswith("#!") and "train.py" in out["script"] and isinstance(out["job"], dict)
