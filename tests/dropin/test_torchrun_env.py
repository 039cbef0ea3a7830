"""torchrun's whole per-rank environment on every backend, and @record error files in the root-cause table."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from fixtures.slurm import slurm_cluster  # noqa: F401

from distlaunch.agent.rankenv import SCRATCH_MARK, rank_vars
from distlaunch.agent.ranks import LOGIN_VARS
from distlaunch.agent.scratch import SCRATCH_PREFIX
from distlaunch.contract.endpoint import free_port
from distlaunch.contract.layout import layout_spec
from distlaunch.contract.options import LaunchOptions
from distlaunch.launcher.elastic.pernode import node_plan
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.plan import LaunchSpec, build_plan
from distlaunch.launcher.planning.program import build_command
from distlaunch.launcher.planning.spec import make_spec
from distlaunch.slurm.env import map_rank
from distlaunch.slurm.step import read_step
from distlaunch.slurm.task import task_env
from tests.helpers import distlaunch_cmd, finish, run_cli
from tests.launcher.test_pernode import node_env, start_node, static_args
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
        for name in rank_vars(1, build_command(opts), SCRATCH_MARK):  # the files of the rank's agent, which srun lacks
            assert local.pop(name) == per_node.pop(name).replace("rank3", "rank1"), name
        assert set(local) == set(srun) == set(per_node), backend
        assert per_node["RANK"] == "3" and per_node["GROUP_RANK"] == "1"
        assert set(local) >= TORCHRUN_KEYS
        assert ("TORCH_NCCL_ASYNC_ERROR_HANDLING" in local) == (backend == "nccl")
        for env in (local, srun):
            assert env["ROLE_RANK"] == env["RANK"] == "1"
            assert env["TORCHELASTIC_RUN_ID"] == env["DISTLAUNCH_JOB_ID"]
            assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
            assert env["PYTHONUNBUFFERED"] == "1"


ENV_DUMP = "import json, os\nprint('RANKENV ' + json.dumps(dict(os.environ)), flush=True)\n"
# rankboot.py arms faulthandler with these, then takes them out of the environment before the program runs
TAKEN_BY_RANKBOOT = {"DISTLAUNCH_STACKS_FILE", "DISTLAUNCH_STACKS_SIGNAL"}
# what every srun step has of its own: its id, the ports srun listens on for it, each task's pid
STEP_VARS = frozenset(
    {"SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_LAUNCHER_PORT", "SLURM_SRUN_COMM_PORT", "SLURM_TASK_PID"}
)
# Python's own: where the locale is C, an interpreter sets this at its start (PEP 538), a remote rank's too
PYTHON_SETS = {"LC_CTYPE"}


@dataclass
class Ranks:
    """One job's ranks as its dry run planned them and as they ran: each rank's environment by global rank, the
    job ids of both (drawn per launch), and what a rank inherits besides the plan (``names_only``: inherited
    variables whose values differ per run, compared by name)."""

    planned: dict[int, dict[str, str]]
    real: dict[int, dict[str, str]]
    planned_job: str
    real_job: str
    inherited: dict[int, dict[str, str]]  # by rank
    names_only: frozenset[str] = frozenset()
    inherited_names: frozenset[str] | None = None  # a remote login's: names only (None: ``inherited``)


def planned_ranks(out: subprocess.CompletedProcess) -> tuple[dict[int, dict[str, str]], str]:
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    return {r["rank"]: r["env"] for node in plan["nodes"] for r in node["ranks"]}, plan["job_id"]


def real_ranks(*outputs: str, rank: str = "RANK") -> dict[int, dict[str, str]]:
    """The environments ENV_DUMP printed, by ``rank`` (an srun task's own: SLURM_PROCID)."""
    lines = [line.split("RANKENV ", 1)[1] for out in outputs for line in out.splitlines() if "RANKENV " in line]
    return {int(env[rank]): env for env in map(json.loads, lines)}


def dry_run(args: list[str], env: dict[str, str]) -> tuple[dict[int, dict[str, str]], str]:
    """``distlaunch run ARGS --dry-run --json``'s ranks, each rank's environment, and its job id."""
    argv = distlaunch_cmd("run", *args[:-1], "--dry-run", "--json", args[-1])
    return planned_ranks(subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env))


def agent_job(tmp_path: Path, *args: str, dry: tuple[str, ...] = ()) -> Ranks:
    """``distlaunch run ARGS envdump.py``, dry (with ``dry`` added) and for real, in this process's environment."""
    script = tmp_path / "envdump.py"
    script.write_text(ENV_DUMP)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    planned, planned_job = dry_run([*dry, *args, str(script)], env)
    done = subprocess.run(
        distlaunch_cmd("run", *args, str(script)), capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr
    real = real_ranks(done.stdout)
    return Ranks(planned, real, planned_job, real[0]["DISTLAUNCH_JOB_ID"], dict.fromkeys(real, env))


def local_ranks(tmp_path: Path, request) -> Ranks:
    port = str(free_port())
    return agent_job(tmp_path, "-n", "2", "--master-port", port, "--hang-timeout", "600")  # + the flight recorder


def ssh_ranks(tmp_path: Path, request) -> Ranks:
    cluster = request.getfixturevalue("sshd_cluster")
    hosts = cluster.write_hostfile(tmp_path / "hosts", nhosts=2, slots=1)
    args = ("-H", str(hosts), "--ssh-config", str(cluster.ssh_config), "--master-port", str(free_port()))
    ranks = agent_job(tmp_path, *args, dry=("--probe",))  # the hosts' decisions (backend), as the launch makes them
    # a remote rank keeps only these of its login's environment (docs/multinode.md), their values the host's
    return replace(ranks, inherited_names=frozenset({*LOGIN_VARS, *PYTHON_SETS}))


def per_node_ranks(tmp_path: Path, request) -> Ranks:
    script = tmp_path / "envdump.py"
    script.write_text(ENV_DUMP)
    port, store = free_port(), free_port()
    nodes = [static_args(2, node_rank, port, store, n=1) for node_rank in (0, 1)]
    plans = [dry_run([*args, str(script)], node_env()) for args in nodes]
    results = finish([start_node(*args, str(script)) for args in nodes])
    assert [code for code, _, _ in results] == [0, 0], results
    real = real_ranks(*(out for _, out, _ in results))
    # each node's dry run draws its own job id; the real nodes share node 0's
    job = plans[0][1]
    planned = {rank: _with_job(env, other, job) for ranks, other in plans for rank, env in ranks.items()}
    return Ranks(planned, real, job, real[0]["DISTLAUNCH_JOB_ID"], dict.fromkeys(real, node_env()))


def _with_job(env: dict[str, str], job: str, instead: str) -> dict[str, str]:
    return {k: v.replace(job, instead) for k, v in env.items()}


def srun_ranks(tmp_path: Path, request) -> Ranks:
    """One batch job of three steps on one node, two tasks each: the dry run, the real ranks, and the tasks' own
    environment without distlaunch (what a rank inherits from srun)."""
    cluster = request.getfixturevalue("slurm_cluster")
    (tmp_path / "envdump.py").write_text(ENV_DUMP)
    run = shlex.join(distlaunch_cmd("run", "--master-port", str(free_port())))
    (tmp_path / "steps.sh").write_text(
        "#!/bin/bash\nset -e\n"
        f"srun -o plan-%t.json {run} --dry-run --json envdump.py\n"
        f"srun -o real-%t.txt {run} envdump.py\n"
        f"srun -o plain-%t.txt {shlex.quote(sys.executable)} envdump.py\n"
    )
    argv = ["sbatch", "--wait", "-N", "1", "--ntasks-per-node", "2", "-o", "job.log", "steps.sh"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=cluster.env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + (tmp_path / "job.log").read_text()
    plans = [json.loads((tmp_path / f"plan-{t}.json").read_text()) for t in (0, 1)]  # each task's rank
    real = real_ranks(*((tmp_path / f"real-{t}.txt").read_text() for t in (0, 1)))
    plain = real_ranks(*((tmp_path / f"plain-{t}.txt").read_text() for t in (0, 1)), rank="SLURM_PROCID")
    job = plans[0]["job_id"]  # slurm-<job>.<step>: the dry run's step; the real ranks run in the next one
    planned = {plan["rank"]: plan["env"] for plan in plans}
    return Ranks(planned, real, job, real[0]["DISTLAUNCH_JOB_ID"], plain, STEP_VARS)


@pytest.mark.parametrize("ranks_of", [local_ranks, ssh_ranks, per_node_ranks, srun_ranks], ids=lambda f: f.__name__)
def test_a_dry_runs_plan_is_every_variable_a_real_rank_gets(ranks_of, tmp_path, request):
    """``--dry-run --json`` against the environment each real rank printed (os.environ), for every backend that
    runs here. Every planned variable reaches the rank with the planned value: the job id as the run drew it, and
    ``<scratch>`` as the rank's agent made it (a folder made on its host when the agent starts). Every other
    variable the rank has is one it inherited (the launcher's environment, a remote login's, an srun task's)."""
    ranks = ranks_of(tmp_path, request)
    assert sorted(ranks.real) == sorted(ranks.planned) and len(ranks.planned) == 2
    for rank, planned in ranks.planned.items():
        real = ranks.real[rank]
        scratch = os.path.dirname(real.get("DISTLAUNCH_PROGRESS_FILE", ""))  # the agent's, on the rank's host
        if ranks_of is not srun_ranks:
            assert os.path.basename(scratch).startswith(SCRATCH_PREFIX), real
        expected = {k: v.replace(ranks.planned_job, ranks.real_job) for k, v in planned.items()}
        expected = {
            k: scratch + v.removeprefix(SCRATCH_MARK) if v.startswith(SCRATCH_MARK) else v for k, v in expected.items()
        }
        missing = set(expected) - set(real)
        assert missing == (TAKEN_BY_RANKBOOT if ranks_of is not srun_ranks else set()), (rank, missing)
        assert {k: real[k] for k in expected if k in real} == {k: v for k, v in expected.items() if k in real}, rank
        others = {k: v for k, v in real.items() if k not in expected}
        if ranks.inherited_names is not None:
            assert set(others) <= ranks.inherited_names, (rank, set(others) - ranks.inherited_names)
            continue
        assert set(others) <= set(ranks.inherited[rank]), (rank, set(others) - set(ranks.inherited[rank]))
        compared = {k: v for k, v in others.items() if k not in ranks.names_only}
        assert compared == {k: ranks.inherited[rank][k] for k in compared}, rank


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
