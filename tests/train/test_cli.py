"""``distlaunch train`` before anything starts: config errors, templates, the plan and the memory planner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distlaunch.engine.config import load_config
from distlaunch.engine.parallel.dims import resolve_parallel_dims
from distlaunch.engine.planner import plan_memory
from distlaunch.engine.presets import PRESETS
from distlaunch.launcher.train import EMBEDDED_CONFIG, parse_size
from tests.helpers import invoke

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = {  # template -> the world size it is written for
    "train-tiny-cpu.toml": 4,
    "train-125m-8gpu.toml": 8,
    "train-1.3b-3d.toml": 16,
}


def _one_line_error(result, *words: str) -> None:
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "(hint: " in lines[0], result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "args,words",
    [
        (["--set", "train.stepz=3"], ["unknown config key 'train.stepz'", "train.steps"]),
        (["--set", "train.precision=fp8"], ["train.precision", "'fp32', 'bf16' or 'fp16'"]),
        (["--set", "train.lr_schedule=linear"], ["train.lr_schedule", "'cosine' or 'constant'"]),
        (["--set", "data.format=parquet"], ["data.format", "'auto', 'text' or 'tokens'"]),
        (["--parallel", "tp=2"], ["conflicts", "parallel.tp=1"]),
        (["--parallel", "tp=two"], ["--parallel", "not an integer"]),
        (["-n", "3"], ["dp(2)*tp(1)*pp(2) = 4 != world size 3"]),
        (["--set", "parallel.tp=3", "--set", "parallel.pp=1", "--set", "parallel.dp=1"], ["tp=3 does not divide"]),
        (["--set", "train.grad_accum_steps=3"], ["grad_accum_steps=3"]),
        (["nope.toml"], ["config file not found"]),
        (["--gpu-memory", "lots"], ["--gpu-memory 'lots' is not a size"]),
    ],
)
def test_config_mistakes_are_one_line_and_exit_2_before_any_process(args, words):
    _one_line_error(invoke(["train", "--dry-run", *args]), *words)


@pytest.mark.parametrize("name,world_size", TEMPLATES.items())
def test_templates_validate_and_ship_with_the_package(name, world_size):
    top, packaged = ROOT / "templates" / name, ROOT / "distlaunch" / "templates" / name
    assert top.samefile(packaged)  # one source of truth, as for sbatch.sh
    cfg = load_config(packaged)
    dims = resolve_parallel_dims(cfg, PRESETS[cfg.model.preset], world_size)
    assert dims.world_size == world_size


def test_embedded_default_exercises_more_than_data_parallelism():
    cfg = load_config(EMBEDDED_CONFIG)
    assert cfg.model.preset == "tiny" and cfg.parallel.dp == 2 and cfg.parallel.tp * cfg.parallel.pp == 2


def test_dry_run_json_has_a_memory_estimate_per_rank():
    result = invoke(["train", "--dry-run", "--json", "--set", "parallel.zero=2"])
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["world_size"] == 4 and plan["parallel"] == {"dp": 2, "tp": 1, "pp": 2, "zero": 2}
    argv = plan["nodes"][0]["ranks"][0]["argv"]
    assert argv[1:4] == ["-m", "distlaunch.engine", str(EMBEDDED_CONFIG)] and argv[4:] == ["--set", "parallel.zero=2"]
    memory = plan["memory"]
    assert memory["device"] == "no GPU: host memory" and [r["rank"] for r in memory["ranks"]] == [0, 1, 2, 3]
    for r in memory["ranks"]:
        assert r["total"] == r["params"] + r["grads"] + r["optimizer"] + r["activations"] and r["fits"] is True


def test_dry_run_table_says_whether_it_fits_the_gpu():
    config = str(ROOT / "templates" / "train-1.3b-3d.toml")
    small = invoke(["train", config, "-n", "16", "--backend", "nccl", "--dry-run", "--gpu-memory", "2GiB"])
    assert small.exit_code == 0, small.stderr
    assert "memory per rank (bf16, zero=1" in small.stdout and "does not fit" in small.stdout
    assert "0-7" in small.stdout and "8-15" in small.stdout  # ranks with equal estimates share a row
    big = invoke(["train", config, "-n", "16", "--backend", "nccl", "--dry-run", "--json", "--gpu-memory", "80GiB"])
    memory = json.loads(big.stdout)["memory"]
    assert (
        memory["fits"] is True
        and memory["capacity_bytes"] == 80 * 2**30
        and memory["capacity_source"] == "--gpu-memory"
    )


def test_planner_state_per_zero_stage():
    """Adam state per rank for Ψ parameters on N ranks. The engine keeps fp32 weights as the master
    copy (autocast, no 16-bit copy), so: 16Ψ -> 8Ψ+8Ψ/N -> 4Ψ+12Ψ/N -> 16Ψ/N; the paper's
    16-bit-weight variant reaches the same 16Ψ and 16Ψ/N at the ends."""
    model, n = PRESETS["1.3b"], 8
    totals = {}
    for zero in range(4):
        cfg = load_config(None, [f"parallel.zero={zero}", "train.global_batch_size=8", "train.seq_len=2048"])
        dims = resolve_parallel_dims(cfg, model, n)
        rank = plan_memory(model, dims, 2048, "bf16", False, "gpu", None, "unknown").ranks[0]
        totals[zero] = (rank.params, rank.grads, rank.optimizer)
    psi = totals[0][0] / 4
    state = {z: sum(parts) / psi for z, parts in totals.items()}
    assert abs(state[0] - 16) < 1e-3
    assert abs(state[1] - (8 + 8 / n)) < 1e-2  # fp32 weights + full fp32 gradient, sharded moments
    assert abs(state[2] - (4 + 12 / n)) < 1e-2
    assert abs(state[3] - 16 / n) < 1e-2


def test_sizes():
    assert parse_size("80GiB") == 80 * 2**30 and parse_size("40GB") == 40 * 10**9
    assert parse_size("24576MiB") == 24 * 2**30 and parse_size("1024") == 1024


def test_help_and_dry_run_never_import_torch():
    code = (
        "import sys; from distlaunch.cli.app import main; "
        "main(['train', '--help']); main(['train', '--dry-run', '--json']); print('TORCH', 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "TORCH False" in out.stdout and '"memory"' in out.stdout
