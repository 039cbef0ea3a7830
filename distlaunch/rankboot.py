"""``python /path/to/distlaunch/rankboot.py SCRIPT [ARGS]`` (or ``-m MODULE [ARGS]``): how the agent starts
every Python rank. It arms :mod:`faulthandler` to write every thread's stack to DISTLAUNCH_STACKS_FILE on
signal DISTLAUNCH_STACKS_SIGNAL (hang detection, ``distlaunch stacks``), then runs the program as ``python``
would. Standard library only and started by path, so it runs under any interpreter from the agent's floor on
(``protocol.PYTHON_FLOOR``; an older one is refused in one line), with or without distlaunch installed."""

from __future__ import annotations

import faulthandler
import os
import runpy
import sys


def _is_boot_frame(filename: str) -> bool:
    return filename == __file__ or os.path.basename(filename) in ("runpy.py", "<frozen runpy>")


def _user_excepthook(kind, value, tb) -> None:
    """Print an uncaught exception as ``python SCRIPT`` would: from the user's first frame, without this
    file's and runpy's frames above it (noise in every rank's traceback and in the root-cause table)."""
    # none left: the program never ran (a syntax error, no such module), which python reports frameless too
    while tb is not None and _is_boot_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    sys.__excepthook__(kind, value.with_traceback(tb), tb)  # printed from the exception's own traceback


def _python_refusal() -> str | None:
    """protocol.python_refusal, from the file beside this one: rankboot runs without distlaunch on sys.path,
    and loaded by path the protocol stays out of the rank's sys.modules."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py")
    spec = importlib.util.spec_from_file_location("distlaunch_rankboot_protocol", path)
    protocol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(protocol)
    return protocol.python_refusal("rankboot")


def main() -> None:
    refusal = _python_refusal()
    if refusal:
        sys.exit(refusal)  # one line on the rank's stderr, exit 1, before the program runs
    sys.excepthook = _user_excepthook  # a program that sets its own hook replaces this one
    path = os.environ.pop("DISTLAUNCH_STACKS_FILE", "")
    signum = int(os.environ.pop("DISTLAUNCH_STACKS_SIGNAL", "0") or 0)
    if path and signum:
        # O_APPEND: the agent empties the file before each request, and the next dump starts at its top.
        stacks = open(path, "a")  # noqa: SIM115 - open for the life of the process
        faulthandler.register(signum, file=stacks, all_threads=True)
    args = sys.argv[1:]
    if args[:1] == ["-m"]:
        sys.argv = args[1:]
        sys.path[0] = os.getcwd()  # as python -m: the working directory, not this file's folder
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        if not os.path.exists(args[0]):  # as python SCRIPT says it (and exits 2), not as runpy's traceback
            print(
                f"{sys.executable}: can't open file {os.path.abspath(args[0])!r}: [Errno 2] No such file or directory",
                file=sys.stderr,
            )
            sys.exit(2)
        sys.argv = args
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
