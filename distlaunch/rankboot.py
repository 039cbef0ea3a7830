"""``python /path/to/distlaunch/rankboot.py SCRIPT [ARGS]`` (or ``-m MODULE [ARGS]``): how the agent starts
every Python rank. It arms :mod:`faulthandler` to write every thread's stack to DISTLAUNCH_STACKS_FILE on
signal DISTLAUNCH_STACKS_SIGNAL (hang detection, ``distlaunch stacks``), then runs the program as ``python``
would. Standard library only and started by path, so it runs under any interpreter from the agent's floor on
(``protocol.PYTHON_FLOOR``; an older one is refused in one line), with or without distlaunch installed.

``python rankboot.py --serve FD MODULES -- SCRIPT [ARGS]``: the warm start (``--preload``). One process per host
imports MODULES (comma-separated: torch, the engine) once, then forks each rank from itself on the agent's
request over the Unix socket FD, so a host of 8 ranks imports torch once instead of 8 times, and none of its
ranks waits on the others' reads of a shared filesystem. Each rank is forked twice, so that it becomes the
agent's own child (the agent is a child subreaper): the agent waits for it, signals its group and sees it exit
exactly as it does a rank it started itself. Everything a rank inherits is what a cold start of the same
command would have: the interpreter, its options, the imports' environment (the variables the node's ranks
share, which the agent starts this process with: OpenMP reads OMP_NUM_THREADS when torch loads it), the
program's sys.path. The rank then sets its own environment, session, CPUs, output and working directory, and
runs the program through ``main`` as a cold start does.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import json
import os
import runpy
import signal
import socket
import sys
import time


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
    sys.path[0] = _program_path(args)
    if args[:1] == ["-m"]:
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        if not os.path.exists(args[0]):  # as python SCRIPT says it (and exits 2), not as runpy's traceback
            print(
                f"{sys.executable}: can't open file {os.path.abspath(args[0])!r}: [Errno 2] No such file or directory",
                file=sys.stderr,
            )
            sys.exit(2)
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")


def _program_path(args: list[str]) -> str:
    """sys.path[0] as ``python`` gives it to the program: the working directory for ``-m``, else the script's folder."""
    return os.getcwd() if args[:1] == ["-m"] else os.path.dirname(os.path.abspath(args[0]))


# -- the warm start ------------------------------------------------------------------------------------------------
REQUEST_MAX_BYTES = 1 << 20  # one rank's request, its argv and environment (a Unix socket's record is smaller)


def serve(fd: int, modules: list[str], program: list[str]) -> None:
    """Import ``modules`` as ``program`` would (its sys.path), say so on the socket, then fork one rank per request
    until the agent closes its end. In a forked rank this returns: the caller then runs the rank's program."""
    refusal = _python_refusal()
    channel = socket.socket(fileno=fd)
    if refusal:
        _send(channel, {"error": refusal})
        sys.exit(1)
    sys.path[0] = _program_path(program)
    try:
        for module in modules:
            __import__(module)
    except BaseException as exc:  # what the program's own import would meet: the agent starts its ranks cold
        _send(channel, {"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    # The imported objects move out of the collector's sight: a collection in a rank would otherwise write to
    # (and so copy) every page they live on, which the ranks could share with this process.
    gc.freeze()
    _send(channel, {"ready": True})
    while True:
        message, fds, _, _ = socket.recv_fds(channel, REQUEST_MAX_BYTES, 2)
        if not message:  # the agent has started every rank (or is gone)
            sys.exit(0)
        request = json.loads(message)
        if _fork_rank(channel, request, fds):
            return  # in the rank


def _fork_rank(channel: socket.socket, request: dict, fds: list[int]) -> bool:
    """Fork the rank of ``request`` (its stdout and stderr: ``fds``) as a grandchild that the agent adopts; True in
    the rank, once it is ready to run its program; in this process, False once the agent has its pid."""
    read_pid, write_pid = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: fork the rank, tell its pid, exit, so the agent adopts the rank
        rank = os.fork()
        if rank == 0:
            os.close(read_pid)
            os.close(write_pid)
            channel.close()
            _become(request, fds)
            return True
        os.write(write_pid, str(rank).encode())
        os._exit(0)
    os.close(write_pid)
    pid = os.read(read_pid, 32).decode()
    os.close(read_pid)
    os.waitpid(middle, 0)  # the rank is the agent's child from here on
    for fd in fds:
        os.close(fd)
    _send(channel, {"pid": int(pid)} if pid else {"error": "the rank could not be forked"})
    return False


def _become(request: dict, fds: list[int]) -> None:
    """In the forked rank: its own session, its parent's death as its own, its CPUs, output, directory, environment
    and signals, and the program's command line, as a cold start of it has them."""
    os.setsid()
    agent = request["agent"]
    deadline = time.monotonic() + 10.0
    while os.getppid() != agent:  # the middle process is exiting: we are the agent's once it has
        if os.getppid() == 1 or time.monotonic() > deadline:
            os._exit(137)  # the agent is gone already (or is not our reaper)
        os.sched_yield()
    _die_with_agent(agent)
    if request.get("cpus") is not None:
        os.sched_setaffinity(0, request["cpus"])
    null = os.open(os.devnull, os.O_RDONLY)
    for target, fd in ((0, null), (1, fds[0]), (2, fds[1])):
        os.dup2(fd, target)
        os.close(fd)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _show_as([*sys.orig_argv[: sys.orig_argv.index("--serve")], *request["argv"]], request["env"])
    for signum in range(1, signal.NSIG):
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):  # one this Python does not manage
                signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    sys.argv = [__file__, *request["argv"]]


def _show_as(argv: list[str], env: dict) -> None:
    """Make /proc/PID/cmdline and /proc/PID/environ read as a cold start's would (what ps, pgrep, py-spy and a
    search of /proc/*/environ for RANK see): both are the memory the kernel put them in at exec, which nothing
    reads once the interpreter has copied them, and which the agent started this process with room in (its
    environment has DISTLAUNCH_WARM_ROOM, as long as the longest rank's extra variables). The kernel's own
    bounds of each area are in /proc/self/stat."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        arg_start, arg_end, env_start, env_end = (int(x) for x in fields[45:49])  # fields 48-51 of stat(5)
    except (OSError, ValueError):
        return
    for start, end, text in (
        (arg_start, arg_end, "".join(f"{a}\0" for a in argv)),
        (env_start, env_end, "".join(f"{k}={v}\0" for k, v in env.items())),
    ):
        data = text.encode("utf-8", "surrogateescape")
        if len(data) <= end - start:  # else it stays as it was: nothing is written past the area
            ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def _die_with_agent(agent: int) -> None:
    """SIGKILL when the agent dies, as a rank it started itself gets it (agent/ranks.py die_with_parent)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != agent:  # it died between the wait and prctl
        os._exit(137)


def _send(channel: socket.socket, message: dict) -> None:
    channel.sendall(json.dumps(message).encode() + b"\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        at = sys.argv.index("--")
        serve(int(sys.argv[2]), [m for m in sys.argv[3].split(",") if m], sys.argv[at + 1 :])
    main()
