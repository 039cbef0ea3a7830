"""Train the bundled GPT: ``python -m distlaunch.engine [CONFIG.toml] [--set KEY=VALUE]...``

Single process (no RANK/WORLD_SIZE in the environment)::

    python -m distlaunch.engine --set train.steps=50

Eight CPU processes in 3D (the launcher sets the torchrun environment and DISTLAUNCH_PARALLEL)::

    distlaunch run -n 8 --parallel dp=2,tp=2,pp=2,zero=1 -m distlaunch.engine --set train.steps=20

or with torchrun: ``torchrun --nproc-per-node 8 -m distlaunch.engine --set parallel.tp=2
--set parallel.pp=2 --set parallel.zero=1``. A configuration mistake prints one line,
``error: ... (hint: ...)``, and exits 2.
"""

from __future__ import annotations

import os
import sys

from distlaunch.errors import DistlaunchError
from distlaunch.training.argv import parse_args


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = parse_args(argv)
    try:
        import distlaunch
        from distlaunch.training.config import load_config

        # the configuration first, torch-free: a mistake in it is one line at once, not after seconds of imports
        cfg = load_config(args.config, args.set, os.environ.get("DISTLAUNCH_PARALLEL"))
        distlaunch.progress(status="importing torch")  # seconds on a cold disk: the launcher's status line says so
        # imported here so that --help answers without loading torch
        import torch

        from distlaunch.engine.torch_floor import check_torch

        check_torch(torch.__version__)
        from distlaunch.engine.loop import run
        from distlaunch.engine.parallel.mesh import read_env
        from distlaunch.training.places import metrics_path

        env = read_env()
        run(cfg, env, metrics_path(args.metrics_file))
    except DistlaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    return 0


def end_process(code: int) -> None:
    """Leave at once, once the output is out. A collective still in flight (a peer failed mid-way, or
    DTensor left one unawaited) completes on a gloo worker thread, which then releases a Python tensor;
    during interpreter shutdown that thread cannot take the GIL and the process aborts (SIGABRT, exit
    134 instead of the rank's own code). Everything the run writes is closed by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        status = main()
    except KeyboardInterrupt:
        status = 130
    except BaseException:  # a bug: its traceback, as Python prints it, and Python's exit code
        sys.excepthook(*sys.exc_info())
        status = 1
    end_process(status)
