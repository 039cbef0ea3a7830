"""The engine's AdamW against torch's fused AdamW, and a rank's start without torch._dynamo.

``distlaunch.engine.optim.AdamW`` runs the kernel ``torch.optim.AdamW(fused=True)`` runs, without
the ``torch.optim.Optimizer`` wrapper whose first call imports torch._dynamo; it must stay the
same update bit for bit, with the same state, and the default layout's ranks must start without
that import (it costs about 2 s of CPU on each)."""

from __future__ import annotations

import json

import pytest
import torch

from distlaunch.engine.optim import AdamW, build_scheduler, make_optimizer_factory
from distlaunch.training.config import TrainSection
from tests.helpers import run_cli


def _params(seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((16, 8), (8,), (3, 5, 2))]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_the_update_and_state_are_torchs_fused_adamw_bit_for_bit(weight_decay):
    ours, theirs = _params(0), _params(0)
    decays = [p.ndim >= 2 for p in ours]
    optimizer = make_optimizer_factory(3e-3, weight_decay, (0.8, 0.95))(list(zip(ours, decays, strict=True)))
    groups = [
        {"params": [p for p, d in zip(theirs, decays, strict=True) if d == decay], "weight_decay": wd}
        for decay, wd in ((True, weight_decay), (False, 0.0))
    ]
    reference = torch.optim.AdamW(groups, lr=3e-3, betas=(0.8, 0.95), fused=True)
    gen = torch.Generator().manual_seed(1)
    for step in range(5):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        if step == 2:  # a parameter without a gradient is left alone, as torch leaves it
            ours[1].grad = theirs[1].grad = None
        optimizer.step()
        reference.step()
        for group, ref_group in zip(optimizer.param_groups, reference.param_groups, strict=True):
            group["lr"] = ref_group["lr"] = ref_group["lr"] * 0.5
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[a][key], reference.state[b][key]), key
    optimizer.zero_grad()
    assert all(p.grad is None for p in ours)


def test_the_schedule_sets_every_groups_rate_and_resumes_from_its_step():
    train = TrainSection(steps=10, warmup_steps=2, lr=1e-2)
    optimizer = AdamW([{"params": _params(0)[:1]}, {"params": _params(1)[:1]}], lr=train.lr, betas=(0.9, 0.999))
    schedule = build_scheduler(optimizer, train)
    assert [g["lr"] for g in optimizer.param_groups] == [train.lr / 2] * 2  # step 1 of a 2-step warmup
    for _ in range(4):
        schedule.step()
    rates = [g["lr"] for g in optimizer.param_groups]
    again = build_scheduler(AdamW([{"params": _params(2)[:1]}], lr=train.lr, betas=(0.9, 0.999)), train)
    again.last_epoch = schedule.last_epoch  # what ScheduleStep restores
    again.set_rates()
    assert again.optimizer.param_groups[0]["lr"] == rates[0] == rates[1]


# ends as `python -m distlaunch.engine` does (end_process, not sys.exit): a rank that goes through the
# interpreter's shutdown after training can abort in torch's C++ teardown ("terminate called without an
# active exception", SIGABRT; once in a full suite run), which the engine's own exit never meets
PROBE = """
import json, os, sys
from distlaunch.engine.__main__ import end_process, main

code = main(sys.argv[1:])
heavy = {m: m in sys.modules for m in ("torch._dynamo", "torch.distributed.pipelining")}
with open(f"imported.{os.environ['RANK']}.json", "w") as f:
    json.dump(heavy, f)
end_process(code)
"""


def test_a_default_layouts_ranks_train_and_save_without_importing_torch_dynamo(tmp_path):
    """Two ranks of the default layout (dp, ZeRO-0), through the launcher, train two steps and save a
    checkpoint; neither imports torch._dynamo, nor torch's pipelining (which imports it)."""
    (tmp_path / "probe.py").write_text(PROBE)
    sets = ["model.preset='tiny'", "train.steps=2", f"checkpoint.dir='{tmp_path / 'ckpt'}'", "checkpoint.every=2"]
    done = run_cli("run", "-n", "2", "probe.py", *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "ckpt" / "step_000002").is_dir(), done.stdout[-2000:]
    for rank in (0, 1):
        imported = json.loads((tmp_path / f"imported.{rank}.json").read_text())
        assert imported == {"torch._dynamo": False, "torch.distributed.pipelining": False}, rank
