"""The warm start (``--preload``): one process per host imports the ranks' heavy modules (torch, the engine) once,
and each rank is forked from it (distlaunch/rankboot.py ``serve``) instead of starting a fresh interpreter.

A host of 8 ranks then reads and initialises torch once, not 8 times at once from one filesystem; the ranks
share those pages until they write them. The forked rank is this agent's own child (the agent is a child
subreaper, and rankboot forks twice), so everything else about it is a cold-started rank's: its pipes, its
session, its exit status, its group's signals. Where a warm start cannot be had (no subreaper, an import that
fails, a variable read at import time that differs between the node's ranks), ranks start cold, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time

from distlaunch.agent.ranks import RANKBOOT, die_with_parent
from distlaunch.startcheck import is_python, program_index

_PR_SET_CHILD_SUBREAPER = 36
# Variables a process reads when its libraries load, not when it runs: OpenMP's and the BLAS libraries' thread
# counts, the dynamic loader's, the interpreter's own. A rank whose value differs from the one the preloaded
# process started with would not get its own: it starts cold.
IMPORT_TIME_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_", "PYTHON", "MALLOC_", "TORCH_", "CUDA_")
# How long the imports may take before the ranks start cold instead (a first import from a cold shared filesystem
# can take minutes; the ranks would pay it anyway)
READY_TIMEOUT_S = 600.0
ROOM_VAR = "DISTLAUNCH_WARM_ROOM"  # padding in the preloaded process's environment (rankboot.py _show_as)
REPLY_TIMEOUT_S = 30.0  # a fork and a reply: milliseconds, unless the host is swapping


class WarmProc:
    """A forked rank, with the part of ``subprocess.Popen`` the agent uses: pid, the pipes, poll()."""

    def __init__(self, pid: int, stdout, stderr):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once it has ended (``-N``: killed by signal N), as Popen.poll gives it; reaps it."""
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class Preloaded:
    """The host's preloaded process for the ranks of one node plan: started at once, so that its imports overlap
    the agent's checks and the wait for the launcher's go; then forks each rank (``spawn``); closed when all have."""

    def __init__(self, python: list[str], modules: list[str], program: list[str], env: dict, workdir: str | None):
        self.env = env
        self.ready: bool | None = None  # None: still importing; False: failed (``error`` says why)
        self.error = ""
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.fileno()
        argv = [*python, RANKBOOT, "--serve", str(fd), ",".join(modules), "--", *program]
        try:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # what would fail here fails again, visibly, in the cold-started ranks
                pass_fds=(fd,),
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except OSError as exc:
            self.proc, self.ready, self.error = None, False, exc.strerror or str(exc)
        theirs.close()

    @classmethod
    def for_node(cls, node: dict, envs: list[dict], workdir: str | None) -> Preloaded | None:
        """The preloaded process for ``node``'s ranks (``envs``: each one's environment), or None when its plan
        preloads nothing, its ranks do not run one Python program, or this host cannot adopt forked ranks."""
        modules = node.get("preload") or []
        argvs = {tuple(spec["argv"]) for spec in node["ranks"]}
        if not modules or len(argvs) != 1 or not envs:
            return None
        argv = list(argvs.pop())
        if not is_python(argv) or not _adopts_orphans():
            return None
        at, _ = program_index(argv)
        env = shared_env(envs)
        # room for each rank's own environment where /proc shows it (rankboot.py _show_as)
        room = max(len(_environ_bytes(e)) for e in envs) - len(_environ_bytes(env))
        return cls(argv[:at], modules, argv[at:], {**env, ROOM_VAR: "." * max(room, 0)}, workdir)

    def wait_ready(self, timeout: float) -> bool | None:
        """Whether the imports are done (None: not yet, after waiting ``timeout`` seconds at most)."""
        if self.ready is None:
            if select.select([self.channel], [], [], timeout)[0]:
                try:
                    reply = self._reply(0)
                except (OSError, ValueError) as exc:
                    reply = {"error": str(exc)}
                self.ready = bool(reply.get("ready"))
                self.error = reply.get("error", "")
            elif self.proc.poll() is not None:
                self.ready, self.error = False, f"it ended with code {self.proc.returncode}"
        return self.ready

    def fits(self, env: dict) -> bool:
        """Whether a rank with environment ``env`` gets what it would at a cold start from this process's imports."""
        return all(
            env.get(name) == self.env.get(name)
            for name in set(env) | set(self.env)
            if name.startswith(IMPORT_TIME_PREFIXES)
        )

    def spawn(self, argv: list[str], env: dict, workdir: str | None, cpus: list[int] | None) -> WarmProc:
        """Fork one rank running ``argv`` (the program and its arguments) with ``env``, in ``workdir``, on ``cpus``;
        an OSError when it cannot be (the caller then starts it cold)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        request = {"argv": argv, "env": env, "cwd": workdir, "cpus": cpus, "agent": os.getpid()}
        try:
            socket.send_fds(self.channel, [json.dumps(request).encode()], [out_w, err_w])
            reply = self._reply(REPLY_TIMEOUT_S)
        except OSError:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        if "pid" not in reply:
            for fd in (out_r, err_r):
                os.close(fd)
            raise OSError(reply.get("error") or "the preloaded process did not fork the rank")
        return WarmProc(reply["pid"], os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))  # as Popen's pipes are

    def close(self) -> None:
        """End the preloaded process: every rank has its own copy of what it imported."""
        with contextlib.suppress(OSError):
            self.channel.close()
        if self.proc is None:
            return
        try:
            # done importing, it exits once its end of the socket reads EOF; still importing (a stop came first),
            # it would read nothing for seconds
            self.proc.wait(2.0 if self.ready else 0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while not select.select([self.channel], [], [], max(0.0, deadline - time.monotonic()))[0]:
            if time.monotonic() >= deadline:
                raise OSError("the preloaded process did not answer")
        data = self.channel.recv(1 << 16)
        if not data:
            raise OSError("the preloaded process ended")
        return json.loads(data)


def shared_env(envs: list[dict]) -> dict:
    """The variables every one of ``envs`` has, with one value: what the preloaded process imports under."""
    first, *rest = envs
    return {k: v for k, v in first.items() if all(e.get(k) == v for e in rest)}


def _environ_bytes(env: dict) -> bytes:
    return "".join(f"{k}={v}\0" for k, v in env.items()).encode("utf-8", "surrogateescape")


def _adopts_orphans() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux 3.4+), which a forked rank must become."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        return False
