"""``distlaunch slurm run|sbatch`` and ``run --launcher`` as a user drives them (in-process, no cluster needed)."""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path

import pytest

from distlaunch.cli.commands import load
from distlaunch.slurm.sbatch import make_output_dir, packaged_template
from tests.helpers import invoke
from tests.slurm.test_slurm_env import task_env

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).resolve().parents[2]
GPT_JOB = [
    "-N",
    "2",
    "--ntasks-per-node",
    "4",
    "--gpus-per-node",
    "4",
    "--cpus-per-task",
    "8",
    "--time",
    "2:00:00",
    "-p",
    "gpu",
    "-A",
    "proj42",
    "-J",
    "gpt",
    "--python",
    "/opt/venv/bin/python",
    "--parallel",
    "dp=auto,tp=2,pp=2",
    "--env",
    "NCCL_DEBUG=WARN",
    "--",
    "train.py",
    "--config",
    "my cfg.toml",
]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed; regenerate with UPDATE_GOLDEN=1 if deliberate"


@pytest.mark.parametrize(
    "name, args",
    [
        ("sbatch_gpt.sh", ["--output", "logs/%x-%j.out", *GPT_JOB]),
        (  # --no-requeue: the script as it was before the time-limit requeue (same golden file)
            "sbatch_minimal.sh",
            ["-N", "2", "--ntasks-per-node", "2", "--no-requeue", "--python", "python3",
             "-m", "distlaunch.examples.allreduce"],
        ),
        (  # the bundled engine: LEAD from its config (checkpoint bytes, step FLOPs), see test_slurm_requeue_cli.py
            "sbatch_engine.sh",
            ["-N", "2", "--ntasks-per-node", "4", "--gpus-per-node", "4", "-t", "12:00:00", "--python", "python3",
             "-m", "distlaunch.engine", "--set", "model.preset='125m'", "--set", "train.precision='bf16'",
             "--set", "checkpoint.dir=/shared/ckpt"],
        ),
    ],
)  # fmt: skip
def test_sbatch_dry_run_matches_golden(in_tmp, name, args):
    r = invoke(["slurm", "sbatch", "--dry-run", *args])
    assert r.exit_code == 0, r.stderr
    check_golden(name, r.stdout)


def test_slurm_run_dry_run_prints_the_srun_command(in_tmp):
    r = invoke(["slurm", "run", "--dry-run", *GPT_JOB])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == (
        "srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --kill-on-bad-exit=1 --label --gpus-per-node=4 --gpu-bind=none "
        "--cpus-per-task=8 --partition=gpu --account=proj42 --time=2:00:00 --job-name=gpt --export=ALL,NCCL_DEBUG "
        "/opt/venv/bin/python -m distlaunch run --launcher slurm --parallel dp=auto,tp=2,pp=2 -- train.py --config "
        "'my cfg.toml'\n"
    )


def test_slurm_run_dry_run_json_is_the_job(in_tmp):
    r = invoke(["slurm", "run", "--dry-run", "--json", *GPT_JOB])
    job = json.loads(r.stdout)
    assert (job["world_size"], job["parallel"]) == (8, {"dp": 2, "tp": 2, "pp": 2, "zero": 0})
    assert job["srun"][0] == "srun" and job["rank_command"][-3:] == ["train.py", "--config", "my cfg.toml"]


def test_sbatch_dry_run_json_is_what_its_help_says(in_tmp):
    r = invoke(["slurm", "sbatch", "--dry-run", "--json", "train.py"])
    assert r.exit_code == 0, r.stderr
    said = next(p.help for p in load("slurm").commands["sbatch"].params if p.name == "json_output")
    assert all(key.replace("_", " ") in said for key in json.loads(r.stdout)), said


def test_tasks_times_processes_is_one_error_line(in_tmp):
    r = invoke(["slurm", "run", "--ntasks-per-node", "4", "-n", "8", "--dry-run", "train.py"])
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(
        "error: --ntasks-per-node 4 and -n/--nproc-per-node 8 disagree"
    )
    assert "32 ranks per node" in r.stderr and "(hint: give one of them: --ntasks-per-node 8)" in r.stderr


def test_missing_script_is_caught_before_submitting(in_tmp):
    r = invoke(["slurm", "sbatch", "-N", "1", "--dry-run", "trian.py"])
    assert r.exit_code == 2 and "script 'trian.py' does not exist" in r.stderr


@pytest.mark.parametrize(
    "output, why",
    [("train.py/logs/%j.out", "train.py is a file, not a folder"), ("/proc/x/%j.out", "No such file or directory")],
)
def test_an_output_folder_that_cannot_be_made_is_one_usage_line(in_tmp, output, why):
    r = invoke(["slurm", "sbatch", "-o", output, "train.py"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    folder = output.rsplit("/", 1)[0]
    assert r.stderr.startswith(f"error: cannot create the folder {folder} of -o/--output {output}: {why} (hint: ")


def test_an_output_folder_named_with_the_jobs_own_fields_is_refused_and_known_ones_are_filled_in(in_tmp):
    # Slurm creates no folder: sub/%j/ would fail the job at launch ("JobLaunchFailure", read as a signal)
    r = invoke(["slurm", "sbatch", "-o", "sub/%j/o.txt", "train.py"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: -o/--output sub/%j/o.txt: its folder sub/%j has a field only the job knows")
    assert not (in_tmp / "sub").exists()
    make_output_dir("runs/%x/%u/o-%j.txt", job_name="exp1")
    assert (in_tmp / "runs" / "exp1" / getpass.getuser()).is_dir()


def test_sbatch_values_are_quoted_for_the_directive_parser(in_tmp):
    r = invoke(["slurm", "sbatch", "-J", 'my "run" #1', "-o", "my logs/%j.out", "-p", "gpu", "--dry-run", "train.py"])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert '#SBATCH --job-name="my \\"run\\" #1"' in lines and '#SBATCH --output="my logs/%j.out"' in lines
    assert "#SBATCH --partition=gpu" in lines  # plain values stay as they are
    (in_tmp / "a b.py").write_text("print('hi')\n")
    r = invoke(["slurm", "sbatch", "--dry-run", "a b.py"])
    assert '#SBATCH --job-name="a b"' in r.stdout.splitlines()


@pytest.mark.parametrize(
    "flag, value",
    [("-p", "gpu\nsrun rm -rf ~"), ("-J", "run\r1"), ("-A", "proj\t42"), ("-t", "1:00:00\n"), ("-o", "x\n%j.out")],
)
def test_a_control_character_in_an_sbatch_value_is_refused(in_tmp, flag, value):
    r = invoke(["slurm", "sbatch", flag, value, "--dry-run", "train.py"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{value!r} holds a control character" in r.stderr and "an #SBATCH line is one line" in r.stderr
    assert r.stdout == ""


def test_a_control_character_in_the_default_job_name_is_refused(in_tmp):
    (in_tmp / "a\nb.py").write_text("print('hi')\n")
    r = invoke(["slurm", "sbatch", "--dry-run", "a\nb.py"])
    assert r.exit_code == 2 and "the default -J/--job-name 'a\\nb' (the script's name) holds a control" in r.stderr


def test_the_repository_template_is_the_packaged_one():
    # One source of truth: templates/sbatch.sh links to the copy shipped inside the package.
    top, packaged = ROOT / "templates" / "sbatch.sh", ROOT / "distlaunch" / "templates" / "sbatch.sh"
    assert top.samefile(packaged)
    assert packaged_template() == packaged.read_text(encoding="utf-8")


def test_own_template_with_an_unknown_placeholder(in_tmp):
    (in_tmp / "my.sh").write_text("#!/bin/bash\n#SBATCH --qos={{qos}}\nsrun {{program}}\n")
    r = invoke(["slurm", "sbatch", "--template", "my.sh", "--dry-run", "train.py"])
    assert r.exit_code == 2 and "template my.sh uses an unknown placeholder {{qos}}" in r.stderr
    (in_tmp / "my.sh").write_text(
        "#!/bin/bash\n#SBATCH --nodes={{nodes}}\n#SBATCH --qos=high\n{{distlaunch}} slurm run -- {{program}}\n"
    )
    r = invoke(["slurm", "sbatch", "--template", "my.sh", "--python", "py", "--dry-run", "train.py"])
    assert r.stdout == "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --qos=high\npy -m distlaunch slurm run -- train.py\n"


def test_run_inside_an_srun_task_maps_the_task(in_tmp):
    env = {**task_env(3, 1, 1), "MASTER_ADDR": "10.0.0.7"}
    r = invoke(["run", "--dry-run", "--json", "--parallel", "tp=2", "train.py", "--lr", "1"], env=env)
    assert r.exit_code == 0, r.stderr
    rank = json.loads(r.stdout)
    assert rank["env"]["RANK"] == "3" and rank["env"]["MASTER_ADDR"] == "10.0.0.7"
    assert rank["env"]["DISTLAUNCH_PARALLEL"] == "dp=2,tp=2,pp=1,zero=0"
    assert rank["argv"][-3:] == ["train.py", "--lr", "1"]


def test_run_with_launcher_slurm_outside_a_step():
    r = invoke(["run", "--launcher", "slurm", "--dry-run", "train.py"])
    assert r.exit_code == 2 and "not inside an srun task step" in r.stderr and "srun distlaunch run" in r.stderr
    r = invoke(["run", "--launcher", "sge", "train.py"])
    assert r.exit_code == 2 and "--launcher 'sge' is not a launcher" in r.stderr


def test_options_that_pick_hosts_are_refused_under_srun(in_tmp):
    env = {**task_env(0, 0, 0), "MASTER_ADDR": "h"}
    r = invoke(["run", "-H", str(ROOT / "hostfiles" / "deepspeed.txt"), "--dry-run", "train.py"], env=env)
    assert r.exit_code == 2 and "cannot be used under srun: Slurm has placed the tasks" in r.stderr
    r = invoke(["run", "--max-restarts", "2", "--dry-run", "train.py"], env=env)
    assert r.exit_code == 2 and "sbatch --requeue" in r.stderr


@pytest.mark.parametrize("flag", ["--hang-timeout", "--heartbeat-timeout", "--grace-period"])
def test_supervision_options_typed_under_srun_are_refused_not_ignored(in_tmp, flag):
    env = {**task_env(0, 0, 0), "MASTER_ADDR": "h"}
    r = invoke(["run", flag, "5", "--dry-run", "train.py"], env=env)
    assert r.exit_code == 2, r.stdout + r.stderr  # taken and ignored before: nothing supervises a task
    assert r.stderr.startswith(f"error: {flag} cannot be used under srun: each task is one rank"), r.stderr
    assert invoke(["run", "--dry-run", "train.py"], env=env).exit_code == 0  # their defaults are no request
    trained = invoke(["train", "--dry-run"], env=env)  # its --hang-timeout defaults to 600: not typed
    assert "cannot be used under srun" not in trained.stderr, trained.stderr


def test_in_an_allocation_but_outside_srun_runs_here_and_says_so(in_tmp):
    r = invoke(["run", "-n", "2", "--dry-run", "train.py"], env={"SLURM_JOB_ID": "9", "SLURM_PROCID": "0"})
    assert r.exit_code == 0, r.stderr
    assert "inside Slurm job 9 but not in an srun step" in r.stderr and "world size 2" in r.stdout
