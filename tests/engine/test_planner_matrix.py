"""The memory planner against the measured step peak on every rank of every layout of the parity matrix.

The layouts are test_parity.py's (ZeRO-3 with pipeline parallelism, GPipe, 1F1B and interleaved
schedules, tp and pp with checkpointing, 3D at 8 ranks) with its tiny GPT and batch, each trained
for 3 steps with 2 accumulation rounds (each rank then runs several backwards a step, the case
the planner's carried gradients and buffers are for). Each rank measures the live tensor bytes
inside steps 2 and 3 (the CPU allocator's own count, tests/live_memory.py) through the real
``Engine.train_step``; the plan must be within 10% of one of the two (``nearest_peak``). The layouts of one
world size run one after the other in one job, as in test_parity.py.

    python -m pytest -q -s tests/engine/test_planner_matrix.py     # prints planned against measured
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from distlaunch.training.config import load_config
from distlaunch.training.dims import resolve_parallel_dims
from distlaunch.training.planner import rank_memory
from distlaunch.training.presets import model_config
from tests.engine.harness import spawn_ok
from tests.engine.test_parity import BASE, LAYOUTS
from tests.live_memory import nearest_peak
from tests.train import _worker

PEAK_RTOL = 0.10  # the planner's bar (tests/train/test_training.py holds it to the same)
STEPS = ["train.steps=3", "train.grad_accum_steps=2"]
# torch.compile's layouts run inductor for ~30 s each on a CPU, and the planner counts an
# eager step's tensors (what inductor saves instead is its own choice): the parity tests cover them
MATRIX = {world: {n: o for n, o in layouts.items() if "compiled" not in n} for world, layouts in LAYOUTS.items()}
CASES = [pytest.param(world, name, id=name) for world, layouts in MATRIX.items() for name in layouts]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """world size -> layout -> per-rank results of tests/train/_worker.py; one job per world size."""
    cache: dict[int, dict] = {}

    def get(world_size: int) -> dict:
        if world_size not in cache:
            out = tmp_path_factory.mktemp(f"world{world_size}")
            spec = json.dumps({"base": BASE + STEPS, "configs": MATRIX[world_size]})
            spawn_ok([sys.executable, _worker.__file__, str(out), spec], world_size, timeout=400, forked=True)
            cache[world_size] = {
                name: [torch.load(out / f"{name}.rank{r}.pt") for r in range(world_size)] for name in MATRIX[world_size]
            }
        return cache[world_size]

    return get


def planned(result: dict, world_size: int):
    cfg = load_config(None, result["overrides"])
    model = model_config(cfg.model.preset, cfg.data.path)
    return rank_memory(model, resolve_parallel_dims(cfg, model, world_size), result["rank"], cfg.train, "gloo", None)


@pytest.mark.parametrize("world_size,name", CASES)
def test_planned_step_peak_is_within_10_percent_of_the_measured_one(world_size, name, measured):
    failures = []
    for result in measured(world_size)[name]:
        plan = planned(result, world_size)
        got = nearest_peak(plan.peak, result["step_peaks"])
        error = (plan.peak - got) / got
        print(
            f"{name} rank {result['rank']}: planned {plan.peak / 2**20:.2f} MiB ({plan.peak_at}), "
            f"measured {got / 2**20:.2f} MiB, {error:+.1%}"
        )
        if abs(error) > PEAK_RTOL:
            failures.append((result["rank"], plan.peak_at, plan.peak, result["step_peaks"]))
    assert not failures, (name, failures)
