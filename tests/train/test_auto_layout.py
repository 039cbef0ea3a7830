"""``distlaunch train --parallel auto`` and the layout advice of a dry run, through the real CLI."""

from __future__ import annotations

import json

import pytest

from distlaunch.contract.layout import layout_spec, spelling
from tests.helpers import invoke


def _one_line(result, *words: str) -> None:
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_auto_prints_the_five_fastest_and_plans_the_first():
    result = invoke(["train", "-n", "2", "--parallel", "auto", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "--parallel auto: the 5 fastest layouts that fit" in out
    for i in range(1, 6):
        assert f"  {i}. dp=" in out
    assert "of the step: " in out and "predicted step: " in out
    assert "(default for a CPU rank)" in out and "(default for gloo)" in out  # defaults say they are


def test_auto_json_carries_the_candidates_and_the_plan_is_the_first_of_them():
    plan = json.loads(invoke(["train", "-n", "2", "--parallel", "auto", "--dry-run", "--json"]).stdout)
    advice = plan["layouts"]
    assert advice["auto"] is True and len(advice["best"]) == 5 and advice["considered"] >= 5
    first = advice["best"][0]
    assert {"step_s", "tokens_per_s", "dominant", "terms"} <= set(first["cost"]) and first["peak_bytes"] > 0
    assert spelling(layout_spec(first["parallel"]), pipeline=False) == spelling(
        layout_spec(",".join(f"{k}={v}" for k, v in plan["parallel"].items())), pipeline=False
    )
    assert advice["layout"]["parallel"] == first["parallel"]
    assert set(advice["sources"]) == {"compute", "intra", "inter"}


def test_a_given_layout_gets_its_breakdown_and_the_faster_one_named():
    result = invoke(["train", "-n", "4", "--parallel", "pp=4,microbatches=4", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    assert "predicted step: " in result.stdout and "pipeline bubble" in result.stdout
    assert "faster: --parallel dp=" in result.stdout and "x as fast" in result.stdout


@pytest.mark.parametrize(
    "args,words",
    [
        (["--link", "inter=10furlongs"], ["--link inter='10furlongs'", "Gbit"]),
        (["--link", "wan=10Gbit"], ["unknown entry 'wan=10Gbit'"]),
        (["--compute", "abacus"], ["--compute 'abacus'", "A100"]),
        (["--set", "parallel.zero=1"], ["--parallel auto chooses every parallel key", "parallel.zero=1"]),
        (["--backend", "nccl", "--gpu-memory", "1MiB"], ["no layout fits 0.00 GiB per rank", "needs", "GiB more"]),
    ],
)
def test_auto_refusals_are_one_line_and_exit_2(args, words):
    _one_line(invoke(["train", "-n", "2", "--parallel", "auto", "--dry-run", *args]), *words)


def test_run_refuses_auto_in_one_line():
    _one_line(invoke(["run", "--parallel", "auto", "--dry-run", "x.py"]), "only distlaunch train chooses")


def test_auto_trains_the_layout_it_chose(tmp_path):
    """The one real run: the ranks' own summary names the layout the plan chose."""
    plan = json.loads(invoke(["train", "-n", "2", "--parallel", "auto", "--dry-run", "--json"]).stdout)
    metrics = tmp_path / "metrics.jsonl"
    args = ["train", "-n", "2", "--parallel", "auto", "--set", "train.steps=2", "--set", "train.eval_every=0"]
    result = invoke([*args, "--metrics-file", str(metrics)])
    assert result.exit_code == 0, result.stderr[-3000:]
    summary = [json.loads(line) for line in metrics.read_text().splitlines() if '"summary"' in line][-1]
    chosen = layout_spec(plan["layouts"]["best"][0]["parallel"])
    assert summary["layout"] == spelling(chosen, pipeline=False)


def test_a_resumed_auto_job_keeps_its_checkpoints_degrees(tmp_path, monkeypatch):
    from distlaunch.training.checkpoint.manifest import CheckpointMeta, Layout

    step = tmp_path / "ckpt" / "step_000001"
    step.mkdir(parents=True)
    meta = CheckpointMeta(
        step=1, preset="tiny", layout=Layout(dp=1, tp=2, pp=1, zero=0, world_size=2), components={},
        files_bytes=0, extras=[], job="dl-0123456789ab", saved_at="2024-01-01T00:00:00+00:00",
        torch_version="2.4", save_seconds=0,
    )  # fmt: skip
    (step / "meta.json").write_text(meta.model_dump_json())
    monkeypatch.chdir(tmp_path)
    args = ["train", "-n", "2", "--parallel", "auto", "--dry-run", "--json", "--set", "checkpoint.dir=ckpt"]
    plan = json.loads(invoke(args).stdout)
    assert (plan["parallel"]["dp"], plan["parallel"]["tp"], plan["parallel"]["zero"]) == (1, 2, 0)
    assert "resuming step_000001: keeping its dp=1,tp=2,pp=1,zero=0" in plan["layouts"]["kept"]
    fresh = json.loads(invoke([*args[:-2], "--set", "checkpoint.dir=elsewhere"]).stdout)
    assert fresh["parallel"]["tp"] == 1  # a fresh job: the planner's choice (tp only costs here)
