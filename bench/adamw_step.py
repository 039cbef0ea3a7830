"""Time of one AdamW step: the engine's optimizer against torch's other implementations, same run.

    python bench/adamw_step.py [--presets tiny,small] [--repeats 15] [--threads 1]

For each preset the whole GPT's parameters get random gradients; then, alternating, each
optimizer takes steps: the engine's (``engine/optim.make_optimizer_factory``: fused, weight decay
on matrices only), ``foreach=True`` and torch's default (on a CPU the per-tensor loop). The script
prints the median step time of each and the ratios against the engine. One thread by default, as
each rank of a CPU job runs (``OMP_NUM_THREADS=1`` with several ranks per host).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from distlaunch.engine.model import GPT, PRESETS, init_weights
from distlaunch.engine.optim import make_optimizer_factory

LR, WEIGHT_DECAY = 3e-4, 0.1


def optimizers(model: torch.nn.Module) -> dict[str, torch.optim.Optimizer]:
    """One optimizer per implementation, each over its own copy of the weights and gradients."""
    out = {}
    for name in ("engine", "foreach", "default"):
        params = []
        for p in model.parameters():
            copy = torch.nn.Parameter(p.detach().clone())
            copy.grad = torch.randn_like(copy, generator=torch.Generator().manual_seed(p.numel()))
            params.append(copy)
        if name == "engine":
            out[name] = make_optimizer_factory(LR, WEIGHT_DECAY)([(p, p.ndim >= 2) for p in params])
        else:
            kwargs = {"foreach": True} if name == "foreach" else {}
            out[name] = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, **kwargs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for preset in args.presets.split(","):
        model = GPT(PRESETS[preset])
        init_weights(model, seed=0)
        opts = optimizers(model)
        times: dict[str, list[float]] = {name: [] for name in opts}
        for _ in range(3):  # the first steps create the moments
            for opt in opts.values():
                opt.step()
        for _ in range(args.repeats):
            for name, opt in opts.items():  # alternating: machine drift hits all alike
                start = time.perf_counter()
                opt.step()
                times[name].append(time.perf_counter() - start)
        median = {name: statistics.median(t) for name, t in times.items()}
        line = "  ".join(f"{name} {1e3 * t:8.2f} ms" for name, t in median.items())
        ratios = "  ".join(f"{name}/engine {median[name] / median['engine']:5.2f}" for name in ("foreach", "default"))
        print(f"{preset:>6}: {line}   {ratios}")


if __name__ == "__main__":
    main()
