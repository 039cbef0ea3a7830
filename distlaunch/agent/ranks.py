"""One rank process: how it starts (its argv, its environment, why it could not) and how its end reads (the
exit descriptor, the error file its ``@record`` wrote)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess

from distlaunch.agent.rankenv import in_scratch
from distlaunch.hostprobe import format_cpulist
from distlaunch.placement import rank_cpus, rank_gpu
from distlaunch.startcheck import is_python, program_index

_PR_SET_PDEATHSIG = 1
# what a remote rank keeps of its agent's login environment (docs/multinode.md): the rest is the plan's
LOGIN_VARS = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH")
RANKBOOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rankboot.py")


class Rank:
    """One rank process and the bookkeeping for its pipes."""

    def __init__(self, spec: dict, proc: subprocess.Popen):
        self.rank = spec["rank"]
        self.error_file = spec["env"].get("TORCHELASTIC_ERROR_FILE")
        self.proc = proc
        self.pipes = {1: proc.stdout, 2: proc.stderr}  # the ones still open
        self.buffers = {1: b"", 2: b""}
        self.returncode: int | None = None
        self.exited_at = 0.0
        # Wall-clock time the agent saw it end, and whether that came after a stop: the launcher takes the
        # rank that ended first on its own as the root cause, whichever host's report reaches it first.
        self.exit_time = 0.0
        self.stopped = False
        self.exit_fd = _exit_fd(proc.pid)
        self.reported = False


def spawn(argv: list[str], env: dict, workdir: str | None, cpus: list[int] | None = None) -> subprocess.Popen:
    """Start one rank in its own session (its process group is what the agent signals), output on pipes, bound
    to ``cpus`` (None: the CPUs the agent has) from its first instruction on."""

    def prepare() -> None:
        die_with_parent()
        if cpus is not None and hasattr(os, "sched_setaffinity"):  # Linux's: elsewhere ranks stay unbound
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(
        argv,
        env=env,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=prepare,
    )


def binding(node: dict, spec: dict, host: dict) -> list[int] | None:
    """The CPUs rank ``spec`` of the node plan ``node`` is bound to on this host (``host``: its inventory), by the
    plan's ``--cpu-bind`` (placement.py; a plan without one binds nothing); a bad list is a UsageError."""
    policy = node.get("cpu_bind") or "none"
    if policy == "none":  # nothing to read of the rank's place on the host
        return None
    env = spec["env"]
    local_ranks = int(env.get("LOCAL_WORLD_SIZE") or len(node["ranks"]))
    gpu = rank_gpu(env, spec["local_rank"], host)
    return rank_cpus(policy, host, spec["local_rank"], local_ranks, gpu)


def cpus_of(pid: int) -> str | None:
    """The CPUs process ``pid`` may run on, in the kernel's CPU list syntax; None once it is gone."""
    try:
        return format_cpulist(os.sched_getaffinity(pid))
    except (OSError, AttributeError):  # gone, or no affinity to read on this system
        return None


def rank_argv(argv: list[str]) -> list[str]:
    """A Python rank starts through rankboot (arms its stack dumps), after the interpreter's own options:
    ``python -u train.py`` runs as ``python -u /…/distlaunch/rankboot.py train.py``. By file path, not
    ``-m``: rankboot is standard library only, so a rank interpreter without distlaunch (--python) works."""
    argv = list(argv)
    if not is_python(argv):
        return argv
    at, _ = program_index(argv)
    return [*argv[:at], RANKBOOT, *argv[at:]]


def base_env(node: dict, spec: dict, scratch: str) -> dict:
    """A rank's environment before the agent adds its files (rankenv.py): the agent's own (or a minimal one), the
    plan's (its scratch folder named as this agent's), and the restart count."""
    env = dict(os.environ) if node.get("inherit_env", True) else _minimal_env()
    env.update(in_scratch(spec["env"], scratch))
    env["DISTLAUNCH_RESTART_COUNT"] = env["TORCHELASTIC_RESTART_COUNT"] = str(node.get("restart_count", 0))
    env.setdefault("PYTHONUNBUFFERED", "1")  # live logs: ranks' prints reach the launcher as they happen
    return env


def die_with_parent() -> None:
    """In the child: get SIGKILL if the agent dies (a second safety net behind the stdin watch)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the agent already died between fork and prctl
        os._exit(137)


def start_error(program: str, exc: OSError, workdir: str | None = None) -> str:
    """Why a rank's program could not start, with the likely fix for a file named without a path (which
    exec looks for on PATH, not in the working directory). A missing working directory fails the same
    exec with the same errno: it is named instead of the program."""
    if workdir and not os.path.isdir(workdir):
        return f"distlaunch: cannot start {program!r}: the working directory {workdir!r} does not exist on this host"
    line = f"distlaunch: cannot start {program!r}: {exc.strerror}"
    if "/" not in program and os.path.isfile(program):
        line += f" (on PATH; the file of that name here is ./{program})"
    return line


def start_exit_code(exc: OSError) -> int:
    """A shell's exit code for a program it could not run: 126 found but not runnable (no execute
    permission, not a format the kernel runs), 127 not found (or anything else that kept it from starting)."""
    return 126 if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ETXTBSY) else 127


def read_error_file(path: str | None) -> dict | None:
    """The exception a rank's ``@record`` wrote (torch's JSON format): type, message and the traceback's last frame."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
        os.unlink(path)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        text, stack = message, ""
    elif isinstance(message, dict):
        text, stack = str(message.get("message", "")), str((message.get("extraInfo") or {}).get("py_callstack", ""))
    else:
        return None
    kind, sep, rest = text.partition(": ")
    lines = stack.rstrip().splitlines()
    files = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    frame = ""
    if files:
        frame = lines[files[-1]].strip()
        code = lines[files[-1] + 1] if files[-1] + 1 < len(lines) else ""
        if code.startswith("    ") and code.strip().strip("^~ "):
            frame += ": " + code.strip()
    return {"type": kind if sep else "", "message": rest if sep else text, "frame": frame[:500]}


def _exit_fd(pid: int) -> int | None:
    """A descriptor that turns readable when process ``pid`` ends (Linux 5.3+, Python 3.9+), else None.

    The agent's select wakes on it at the exit itself, not at its next poll: when a crash makes a peer rank
    fail a few milliseconds later, the stamps must still put the crash first."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return pidfd_open(pid)
    except OSError:
        return None


def _minimal_env() -> dict:
    """What a remote rank inherits from the agent's own login environment when env is not inherited."""
    return {k: os.environ[k] for k in LOGIN_VARS if k in os.environ}
