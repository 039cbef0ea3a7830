"""``python -m distlaunch.engine``: exit codes, one-line errors, metrics.jsonl, the env contract."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.harness import spawn, spawn_ok
from tests.helpers import run_cli

ENGINE = [sys.executable, "-m", "distlaunch.engine"]
SMALL_RUN = ["--set", "train.steps=3", "--set", "train.global_batch_size=4", "--set", "train.seq_len=32"]
STEP_KEYS = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_bytes"}


@pytest.mark.parametrize(
    "args,env,words",
    [
        (["--set", "train.stepz=3"], {}, ["train.stepz"]),
        (["--set", "parallel.tp=2"], {}, ["tp(2)", "world size 1"]),
        (["--set", "parallel.zero=3"], {"DISTLAUNCH_PARALLEL": "dp=1,zero=1"}, ["conflicts"]),
        (["--set", "data.path=/nonexistent/corpus.txt"], {}, ["data.path not found"]),
        (["/nonexistent/run.toml"], {}, ["config file not found"]),
    ],
)
def test_user_errors_print_one_line_and_exit_2(args, env, words):
    (result,) = spawn(ENGINE + args, world_size=0, timeout=120, extra_env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "(hint: " in lines[0], result.stderr
    for word in words:
        assert word in lines[0]


def test_a_config_mistake_is_named_before_torch_is_imported(tmp_path):
    """The configuration is read torch-free, first: its mistake is one line at once, not after seconds of imports
    on every rank (a torch that cannot be imported shows whether it was)."""
    (tmp_path / "torch.py").write_text("raise ImportError('torch was imported')\n")
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    done = subprocess.run(
        [*ENGINE, "--set", "train.stepz=3"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: unknown config key 'train.stepz'") and "torch was imported" not in done.stderr


def test_single_process_run_writes_metrics_file(tmp_path):
    metrics = tmp_path / "m.jsonl"
    (result,) = spawn(ENGINE + SMALL_RUN + ["--metrics-file", str(metrics)], world_size=0, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "step 3/3" in result.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert records[0]["event"] == "start" and records[-1]["event"] == "summary"
    steps = [r for r in records if "step" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(set(r) >= STEP_KEYS for r in steps)
    assert records[-1]["mem_bytes_per_rank"][0]["params"] == 4 * records[-1]["n_params"]  # fp32


def test_launched_ranks_read_the_env_contract_and_parallel_spec(tmp_path):
    """2 ranks started like the launcher does: RANK/WORLD_SIZE/... and DISTLAUNCH_PARALLEL."""
    env = {"DISTLAUNCH_PARALLEL": "dp=1,tp=2,pp=1,zero=0", "DISTLAUNCH_LOG_DIR": str(tmp_path)}
    results = spawn_ok(ENGINE + SMALL_RUN, world_size=2, timeout=180, extra_env=env)
    assert "step 3/3" in results[0].stdout and results[1].stdout == ""  # rank 0 reports
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    summary = records[-1]
    assert summary["layout"] == "dp=1,tp=2,pp=1,zero=0" and summary["world_size"] == 2
    per_rank = summary["mem_bytes_per_rank"]
    # tp=2: each rank holds about half the parameters (norms and position embedding replicated)
    assert all(0.5 * 4 * summary["n_params"] < r["params"] < 0.7 * 4 * summary["n_params"] for r in per_rank)


def test_engine_never_imports_cli_code():
    code = (
        "import sys, distlaunch.engine.__main__, distlaunch.engine.loop; "
        "bad = [m for m in ('typer', 'rich', 'paramiko', 'distlaunch.cli') if m in sys.modules]; "
        "sys.exit(f'engine imported {bad}' if bad else 0)"
    )
    (result,) = spawn([sys.executable, "-c", code], world_size=0, timeout=120)
    assert result.returncode == 0, result.stderr


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_the_loss_curve_is_a_png_beside_the_metrics_with_matplotlib_and_absent_without(tmp_path):
    with_plot, without = tmp_path / "with" / "m.jsonl", tmp_path / "without" / "m.jsonl"
    # the suite draws no curve (tests/conftest.py): this test asks for one, as every run does by default
    asked = {"DISTLAUNCH_LOSS_CURVE": "1"}
    (result,) = spawn(
        ENGINE + SMALL_RUN + ["--metrics-file", str(with_plot)], world_size=0, timeout=120, extra_env=asked
    )
    assert result.returncode == 0, result.stderr
    curve = with_plot.with_name("loss_curve.png")
    assert curve.read_bytes().startswith(PNG_SIGNATURE) and sorted(p.name for p in curve.parent.iterdir()) == [
        "loss_curve.png",
        "m.jsonl",
    ]  # and no partial file left
    assert json.loads(with_plot.read_text().splitlines()[-1])["loss_curve"] == str(curve)
    assert f"\nloss curve: {curve}\n" in result.stdout  # whole, however long the path
    # a Python without matplotlib (the optional 'plot' extra): no curve, the run is no worse for it
    code = "import runpy, sys; sys.modules['matplotlib'] = None; runpy.run_module('distlaunch.engine', run_name='__main__')"
    args = [*SMALL_RUN, "--metrics-file", str(without)]
    (bare,) = spawn([sys.executable, "-c", code, *args], world_size=0, timeout=120, extra_env=asked)
    assert bare.returncode == 0, bare.stderr
    assert json.loads(without.read_text().splitlines()[-1])["loss_curve"] is None
    assert not without.with_name("loss_curve.png").exists()


def test_with_the_curve_turned_off_matplotlib_is_never_imported(tmp_path):
    """DISTLAUNCH_LOSS_CURVE=0: no loss_curve.png, and none of matplotlib's second of imports."""
    metrics = tmp_path / "m.jsonl"
    argv = [sys.executable, "-X", "importtime", "-m", "distlaunch.engine", *SMALL_RUN, "--metrics-file", str(metrics)]
    (result,) = spawn(argv, world_size=0, timeout=120, extra_env={"DISTLAUNCH_LOSS_CURVE": "0"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| torch\n" in result.stderr  # the import times are there: the engine ran under -X importtime
    assert not re.search(r"\|\s+matplotlib$", result.stderr, re.M)  # the package itself (sympy has a module so named)
    assert json.loads(metrics.read_text().splitlines()[-1])["loss_curve"] is None
    assert not metrics.with_name("loss_curve.png").exists()


def test_a_rank_past_the_last_gpu_gets_one_clear_line():
    """-n 4 on a host that shows 2 GPUs: ranks 2 and 3 say so, instead of CUDA's invalid device ordinal."""
    from distlaunch.engine.parallel.mesh import gpu_of
    from distlaunch.errors import UsageError

    assert [gpu_of(rank, 2, None) for rank in (0, 1)] == [0, 1]
    with pytest.raises(UsageError) as error:
        gpu_of(2, 2, "4,5")
    assert str(error.value) == (
        "LOCAL_RANK 2 has no GPU: this host shows 2 GPUs (CUDA_VISIBLE_DEVICES=4,5), one per rank "
        "(hint: start at most 2 ranks per host (-n 2, or the hostfile's slots), make more GPUs visible, "
        "or launch with --backend gloo to train on the CPU)"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the nccl case needs a host without a CUDA GPU")
def test_the_launchers_backend_decides_the_device(tmp_path):
    """The plan's backend is what the ranks use: gloo trains on the CPU (also where GPUs exist);
    nccl on a host where torch sees no GPU is one line per rank, not NCCL's own failure."""
    from distlaunch.engine.parallel.mesh import pick_device, read_env

    assert read_env({"DISTLAUNCH_BACKEND": "gloo"}).backend == "gloo"
    assert read_env({}).backend is None  # torchrun or a plain process: the device decides
    assert pick_device(0, "gloo").type == "cpu"
    args = ["train", "--parallel", "dp=2", "--backend", "nccl", "--set", "train.steps=2"]
    run = run_cli(*args, "--metrics-file", str(tmp_path / "m.jsonl"))
    assert run.returncode == 2, run.stdout + run.stderr
    line = "the job's backend is nccl, but torch " + torch.__version__ + " sees no CUDA GPU on this host"
    assert line in run.stdout + run.stderr and "Traceback" not in run.stdout + run.stderr
    assert not (tmp_path / "m.jsonl").exists()
