"""The launcher side never needs torch: with torch unimportable, every torch-free package imports and a
dry-run plans a 3D training job (the engine is the only part that may import torch)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


TORCH_FREE = [
    "distlaunch.contract.layout",
    "distlaunch.contract.env",
    "distlaunch.contract.endpoint",
    "distlaunch.contract.options",
    "distlaunch.launcher.running.launch",
    "distlaunch.launcher.elastic.pernode",
    "distlaunch.launcher.planning.train",
    "distlaunch.remote.session",
    "distlaunch.slurm.task",
    "distlaunch.slurm.job",
    "distlaunch.doctor.runner",
    "distlaunch.backends.registry",
    "distlaunch.backends.recorded",
    "distlaunch.k8s.manifest",
    "distlaunch.cli.app",
    "distlaunch.training.config",
    "distlaunch.training.planner",
    "distlaunch.training.precision",
    "distlaunch.training.bucketing",
    "distlaunch.training.checkpoint.folder",
    "distlaunch.training.checkpoint.manifest",
    "distlaunch.extras",  # the install hints of every extra: the engine's too
]


def test_launcher_side_imports_and_plans_with_torch_unimportable(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any 'import torch' now raises ImportError
        import importlib
        for name in {TORCH_FREE!r}:
            importlib.import_module(name)
        from distlaunch.cli.app import main
        code = main(["train", "-n", "8", "--parallel", "dp=2,tp=2,pp=2", "--dry-run", "--json"])
        assert code == 0, code
        assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules if sys.modules[m] is not None)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert '"world_size": 8' in run.stdout
