"""``distlaunch`` itself, which on its way out writes what its own process used to $DISTLAUNCH_PROBE_OUT (JSON):
its CPU seconds, its reaped children's (the OpenSSH clients it started), its peak RSS, its threads at the end
and its CPU per kind of thread (the main thread, paramiko's transport threads, its handshake threads, the
per-host readers, the one pipe reader).

    DISTLAUNCH_PROBE_OUT=/tmp/probe.json python bench/_probe_launcher.py run -H hosts ...
    DISTLAUNCH_PROBE_PROFILE=/tmp/main.prof ...     # also cProfile the main thread (pstats file)

The benches run the launcher through it, so that the launcher's own CPU is told apart from everything else
the machine does for the simulated hosts (sshd, agents, ranks).
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


_by_kind: dict[str, float] = {}  # kind of thread -> CPU seconds of its threads that ended
_live: dict[threading.Thread, str] = {}  # threads still running -> their kind


def _thread_cpu(thread: threading.Thread) -> float:
    """A thread's CPU seconds so far, from its own clock (precise, unlike /proc's ticks)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, TypeError):  # ended meanwhile
        return 0.0


def _kind(thread: threading.Thread) -> str | None:
    """What a thread is for, from its class or name (None: the probe's own)."""
    if thread.name == "probe":
        return None
    if type(thread).__module__.startswith("paramiko"):
        return "paramiko transport"
    name = thread.name
    for prefix, kind in (
        ("ssh-connect", "ssh handshakes"),
        ("agent-", "per-host readers"),
        ("ssh-pipes", "pipe reader"),
    ):
        if name.startswith(prefix):
            return kind
    return "other threads"


def _account() -> None:
    """Every thread's CPU is read as it ends (and at exit for those still running). ``_bootstrap_inner``, not
    ``run``: paramiko's Transport overrides ``run``."""
    bootstrap = threading.Thread._bootstrap_inner

    def counted(self) -> None:
        kind = _kind(self)
        if kind is None:
            return bootstrap(self)
        _live[self] = kind
        try:
            bootstrap(self)
        finally:
            _by_kind[kind] = _by_kind.get(kind, 0.0) + time.thread_time()
            _live.pop(self, None)

    threading.Thread._bootstrap_inner = counted


def _cpu_by_kind() -> dict[str, float]:
    by_kind = dict(_by_kind)
    for thread, kind in list(_live.items()):
        by_kind[kind] = by_kind.get(kind, 0.0) + _thread_cpu(thread)
    by_kind["main thread"] = _thread_cpu(threading.main_thread())
    return by_kind


def _watch(every_s: float) -> None:
    """Write the CPU per kind of thread to $DISTLAUNCH_PROBE_OUT.live every ``every_s`` (a steady state's share)."""
    live = Path(os.environ["DISTLAUNCH_PROBE_OUT"] + ".live")
    while True:
        live.write_text(json.dumps(_cpu_by_kind()), encoding="utf-8")
        time.sleep(every_s)


def _write() -> None:
    by_kind = _cpu_by_kind()
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    report = {
        "cpu_s": me.ru_utime + me.ru_stime,
        "children_cpu_s": children.ru_utime + children.ru_stime,
        "hwm_kib": _status("VmHWM"),
        "threads_at_exit": threading.active_count(),
        "cpu_by_thread_s": by_kind,
    }
    Path(os.environ["DISTLAUNCH_PROBE_OUT"]).write_text(json.dumps(report), encoding="utf-8")


def _profiled(path: str) -> None:
    """cProfile the main thread until exit (the other threads are accounted by CPU only)."""
    import cProfile

    profile = cProfile.Profile(time.thread_time)  # CPU, not wall: what the launcher spends, not what it waits
    profile.enable()
    atexit.register(lambda: (profile.disable(), profile.dump_stats(path)))


if __name__ == "__main__":
    _account()
    atexit.register(_write)
    if os.environ.get("DISTLAUNCH_PROBE_EVERY_S"):  # its own thread: not a kind the launcher has
        every_s = float(os.environ["DISTLAUNCH_PROBE_EVERY_S"])
        threading.Thread(target=_watch, args=(every_s,), name="probe", daemon=True).start()
    if os.environ.get("DISTLAUNCH_PROBE_PROFILE"):
        _profiled(os.environ["DISTLAUNCH_PROBE_PROFILE"])
    from distlaunch.__main__ import entry

    sys.argv[0] = "distlaunch"
    entry()
