"""Every rank refuses a torch older than the engine's floor in one line, before it builds anything."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from distlaunch.engine.__main__ import main
from distlaunch.engine.torch_floor import TORCH_FLOOR, check_torch, floor_text
from distlaunch.errors import UsageError
from distlaunch.training.config import tomllib


def test_pyproject_declares_the_floor_the_ranks_check():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    (torch_requirement,) = [d for d in project["dependencies"] if re.match(r"torch\b", d)]
    assert torch_requirement == f"torch>={floor_text()}"


@pytest.mark.parametrize("version", [f"{TORCH_FLOOR[0]}.{TORCH_FLOOR[1] - 1}.9+cu126", "2.6.0", "1.13.1"])
def test_older_releases_are_refused_with_the_version_and_the_floor(version):
    with pytest.raises(UsageError) as error:
        check_torch(version)
    assert f"torch {version} on " in str(error.value)
    assert f"older than {floor_text()}," in str(error.value)


@pytest.mark.parametrize("version", ["{}.{}.0", "{}.{}.0a0+git1234", "{}.{}.3+cu130", "3.0.0"])
def test_the_floor_its_prereleases_and_newer_releases_pass(version):
    check_torch(version.format(*TORCH_FLOOR))


def test_the_engine_exits_2_with_one_line_on_an_old_torch(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch, "__version__", "2.7.1+cu126")
    metrics = tmp_path / "metrics.jsonl"
    assert main(["--set", "train.steps=1", "--metrics-file", str(metrics)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: torch 2.7.1+cu126 on ") and "(hint: install torch>=" in line
    assert not metrics.exists()  # refused before anything ran
