"""The launcher side never needs torch: with torch unimportable, every torch-free package imports, a dry-run
plans a 3D training job, a per-node dry-run plans its node's part, and two nodes meet at the per-node
rendezvous (the engine is the only part that may import torch)."""

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
    "distlaunch.launcher.elastic.rendezvous",
    "distlaunch.launcher.running.node",
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
        node = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"]
        code = main(["run", *node, "-n", "2", "--dry-run", "--json", "train.py"])
        assert code == 0, code
        from distlaunch.contract.endpoint import free_port
        from distlaunch.launcher.elastic.rendezvous import NodeStore
        port = free_port()
        with NodeStore.open("127.0.0.1", port, 2, 30.0, first=True) as node0:
            with NodeStore.open("127.0.0.1", port, 2, 30.0, first=False) as node1:
                assert (node0.arrive(0), node1.arrive(1)) == (0, 1)
                node1.wait_all()
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
    assert '"world_size": 8' in run.stdout and '"world_size": 4' in run.stdout
