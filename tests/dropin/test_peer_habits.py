"""Habits from torchrun, DeepSpeed, accelerate, Horovod and mpirun, through the real CLI; bad input never crashes."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import invoke, run_cli

ENV_DUMP = str(Path(__file__).parent.parent / "launcher" / "scripts" / "env_dump.py")


def plan_of(*args: str, env: dict | None = None) -> dict:
    r = invoke(["run", "--dry-run", "--json", *args], env=env)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def one_error_line(args: list[str], env: dict | None = None) -> str:
    r = invoke(args, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (r.exit_code, r.stderr)
    assert "internal error" not in lines[0] and "Traceback" not in r.stderr
    return lines[0]


@pytest.mark.parametrize("interpreter", ["python3", sys.executable])
def test_an_interpreter_named_as_the_program_runs_the_script(interpreter):
    out = run_cli("run", "-n", "2", "--", interpreter, ENV_DUMP, "a", timeout=120)
    assert out.returncode == 0, out.stderr
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in out.stdout.splitlines() if "ENV " in line]
    assert sorted(e["RANK"] for e in envs) == ["0", "1"] and all(e["argv"] == ["a"] for e in envs)


def test_the_interpreter_form_is_planned_as_given_and_its_script_checked(tmp_path):
    plan = plan_of("-n", "2", "python", ENV_DUMP)
    assert plan["nodes"][0]["ranks"][0]["argv"] == ["python", ENV_DUMP]
    assert "nothere.py' does not exist" in one_error_line(["run", "--dry-run", "python", str(tmp_path / "nothere.py")])


def test_a_script_with_a_foreign_shebang_runs_directly(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/sh\necho "SH rank $RANK of $WORLD_SIZE"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    out = run_cli("run", "-n", "2", str(script), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "SH rank 0 of 2" in out.stdout and "SH rank 1 of 2" in out.stdout


def test_mpiruns_np_names_the_distlaunch_spelling():
    line = one_error_line(["run", "-np", "4", "train.py"])
    assert "-n 4" in line and "per host" in line


def test_torchrun_underscore_spellings_are_aliases():
    plan = plan_of("--nproc_per_node", "3", "--master_port", "29876", "--master_addr", "127.0.0.2", ENV_DUMP)
    assert plan["world_size"] == 3 and plan["master_port"] == 29876 and plan["master_addr"] == "127.0.0.2"
    assert plan_of("--max_restarts", "2", ENV_DUMP)["nodes"][0]["ranks"][0]["env"]["TORCHELASTIC_MAX_RESTARTS"] == "2"


def test_nproc_per_node_auto_and_gpu():
    assert plan_of("--nproc-per-node", "auto", ENV_DUMP)["world_size"] == (
        len(os.listdir("/proc/driver/nvidia/gpus")) if os.path.isdir("/proc/driver/nvidia/gpus") else 1
    )
    if not os.path.isdir("/proc/driver/nvidia/gpus"):
        assert "no GPU" in one_error_line(["run", "--nproc-per-node", "gpu", ENV_DUMP])


def test_horovods_inline_host_list(tmp_path):
    plan = plan_of("-H", "node1:2,node2:2", ENV_DUMP)
    assert [(n["host"], len(n["ranks"])) for n in plan["nodes"]] == [("node1", 2), ("node2", 2)]
    hostfile = tmp_path / "h:1"  # a file of that name wins over the inline reading
    hostfile.write_text("localhost slots=1\n")
    assert plan_of("-H", str(hostfile), ENV_DUMP)["world_size"] == 1


def test_env_name_forwards_the_launchers_value():
    plan = plan_of("--env", "DLTEST_FORWARDED", ENV_DUMP, env={"DLTEST_FORWARDED": "v a l"})
    assert plan["nodes"][0]["ranks"][0]["env"]["DLTEST_FORWARDED"] == "v a l"
    assert "not set here" in one_error_line(["run", "--env", "DLTEST_UNSET_NAME", ENV_DUMP])


@pytest.mark.parametrize(
    "command, flag, tool, equivalent",
    [
        ("train", "--node-rank", "torchrun", "--node-rank I"),
        ("run", "--tee", "torchrun", "always shown"),
        ("run", "--num_gpus", "deepspeed", "-n N"),
        ("run", "--num_nodes", "deepspeed", "-H"),
        ("run", "--run_path", "torchrun", "runs SCRIPT as python does"),
        ("run", "--use_env", "torch.distributed.launch", "LOCAL_RANK"),
        ("run", "--local_rank", "torch.distributed.launch", "LOCAL_RANK from the environment"),
    ],
)
def test_peer_flags_get_their_equivalent_not_a_guess(command, flag, tool, equivalent):
    line = one_error_line([command, flag, "2", "x.py"])
    assert tool in line and equivalent in line and "Possible options" not in line


@pytest.mark.parametrize(
    "hostfile, args",
    [
        ("node1 slots=1000000000000\n", []),
        ("0:99999999999999999999\n", []),
        ("node1 slots=10000000\n", []),
        (None, ["-n", "99999999999999999999"]),
        (None, ["-n", "1000000", "--dry-run"]),
        (None, ["--backend", "mpi"]),
        (None, ["--grace-period", "inf"]),
    ],
)
def test_out_of_range_input_is_one_line(tmp_path, hostfile, args):
    extra = []
    if hostfile is not None:
        (tmp_path / "hosts").write_text(hostfile)
        extra = ["-H", str(tmp_path / "hosts")]
    one_error_line(["run", *extra, *args, ENV_DUMP])


@pytest.mark.parametrize(
    "args, given",
    [
        (["--max-restarts", "-1"], "'-1'"),
        (["--hang-timeout=-5"], "'-5'"),
        (["--rdzv-timeout", "soon"], "'soon'"),  # (--nnodes MIN:MAX has its own lines: test_cli)
    ],
)
def test_a_value_refused_by_its_type_or_range_is_named(args, given):
    """The type and range checks say what they expected; the line also says what they got."""
    line = one_error_line(["run", *args, ENV_DUMP])
    assert f"(got {given})" in line


def test_the_rank_ceiling_can_be_raised(tmp_path):
    (tmp_path / "hosts").write_text("localhost slots=70000\n")
    assert "ceiling of 65,536" in one_error_line(["run", "-H", str(tmp_path / "hosts"), "--dry-run", ENV_DUMP])
    assert "ceiling of 100" in one_error_line(["run", "-n", "101", ENV_DUMP], env={"DISTLAUNCH_MAX_RANKS": "100"})


def test_a_config_that_is_a_directory_or_binary_is_one_line(tmp_path):
    assert "is a directory" in one_error_line(["train", str(tmp_path), "--dry-run"])
    (tmp_path / "bin.toml").write_bytes(bytes(range(256)))
    assert "UTF-8" in one_error_line(["train", str(tmp_path / "bin.toml"), "--dry-run"])


_text = st.text(alphabet=st.sampled_from("node12 :=,slots@.-_x9\n#\t0"), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    hostfile=_text,
    parallel=st.text(alphabet=st.sampled_from("dptz=,0129auto-"), max_size=20),
    option=st.sampled_from(["-n", "--master-port", "--backend", "--grace-period", "--include", "--env", "--parallel"]),
    value=st.text(alphabet=st.sampled_from("0123456789-.einfa=:@,x"), min_size=1, max_size=25),
)
def test_fuzzed_input_is_exit_0_or_one_line_exit_2(tmp_path, hostfile, parallel, option, value):
    (tmp_path / "hosts").write_text(hostfile)
    args = ["run", "--dry-run", "-H", str(tmp_path / "hosts"), "--parallel", parallel, option, value, ENV_DUMP]
    r = invoke(args)
    assert r.exit_code in (0, 2), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    if r.exit_code == 2:
        assert len(r.stderr.strip().splitlines()) == 1


@settings(max_examples=25, deadline=None)
@given(
    key=st.sampled_from(["parallel.tp", "parallel.dp", "parallel.pp", "model.n_layer", "train.steps", "nope"]),
    value=st.text(alphabet=st.sampled_from('0123456789-.e"[]x'), min_size=1, max_size=12),
)
def test_fuzzed_train_set_is_exit_0_or_one_line_exit_2(key, value):
    r = invoke(["train", "--dry-run", "--set", f"{key}={value}"])
    assert r.exit_code in (0, 2), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
