"""One process that imports torch and the engine once, then forks a test job's ranks from itself.

A rank of the engine tests spends more CPU importing torch, DTensor and the engine (1.2 to 2.5 CPU-seconds) than
training the tiny GPT for a few steps; a job of 8 ranks paid that 8 times. Forked from here, each rank is still a
process of its own, in a session of its own, with the torchrun environment, real gloo collectives and its own
output files; only the imports are shared (copy-on-write pages). Tests that measure a rank's resident memory
start their ranks as fresh interpreters instead (``tests/engine/harness.py``): a forked one starts with its
parent's pages.

    python -m tests.engine.zygote SPEC_FILE

SPEC_FILE: ``{"argv": [python, script, ...], "ranks": [{"env": {...}, "out": path, "err": path}, ...]}``. The
zygote prints the ranks' pids as one JSON line, then ``pid exit-code`` as each one ends (exit codes as
``subprocess`` gives them: ``-N`` for a signal), and exits once every rank has.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import json
import os
import runpy
import sys
import traceback
from pathlib import Path

from distlaunch.training.argv import ENGINE_PRELOAD  # what the product's warm start preloads too

PRELOAD = ("torch", "torch.distributed", "torch.distributed.tensor", *ENGINE_PRELOAD)


def main(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    for module in PRELOAD:
        __import__(module)
    gc.freeze()  # the imports out of the collector's sight: the ranks' collections leave their pages shared
    pids = []
    for rank in spec["ranks"]:
        pid = os.fork()
        if pid == 0:
            _become(spec["argv"], rank)
        pids.append(pid)
    print(json.dumps(pids), flush=True)
    for _ in pids:
        pid, status = os.wait()
        print(pid, os.waitstatus_to_exitcode(status), flush=True)


def _become(argv: list[str], rank: dict) -> None:
    """In the child: the rank's session, environment and output, then its program as ``__main__``; never returns."""
    code = 1
    try:
        os.setsid()
        from distlaunch.agent import die_with_parent

        die_with_parent()
        os.environ.clear()
        os.environ.update(rank["env"])
        for fd, path in ((1, rank["out"]), (2, rank["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        faulthandler.enable()  # SIGABRT at a timeout prints the rank's stacks, as PYTHONFAULTHANDLER does
        sys.argv = argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(argv[1]))  # as ``python script.py`` has it
        runpy.run_path(argv[1], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1])
