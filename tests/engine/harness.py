"""Start real multi-process jobs for the engine tests (gloo on CPU, the torchrun environment)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from distlaunch.agent import die_with_parent
from distlaunch.contract.endpoint import free_port

WORKER = Path(__file__).with_name("_worker.py")
REPO = Path(__file__).resolve().parents[2]


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment of one rank: torchrun's contract, one thread, quiet warnings."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "DISTLAUNCH_PARALLEL")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    if world_size > 0:
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    return env


class RankResult(subprocess.CompletedProcess):
    """A finished rank; ``stopped``: the harness ended it (a peer failed first, or time ran out)."""

    stopped: bool = False


def spawn(
    argv: list[str], world_size: int, timeout: float, extra_env: dict | None = None, forked: bool = False
) -> list[RankResult]:
    """Run ``argv`` as ``world_size`` ranks (0: one process without the launch environment).

    Like the launcher, the job stops as soon as one rank fails: its peers would otherwise wait in a
    collective (or for a store that never came up) until the timeout. At the timeout every rank left
    prints its Python stacks (faulthandler, on SIGABRT) before it ends, so a hang says where it was.
    Output goes to files, not pipes: a rank never blocks on a full pipe while the harness waits.
    ``forked``: ``argv`` is ``[python, script, ...]``, and its ranks are forked from one process that imported
    torch and the engine once (``tests/engine/zygote.py``), for tests that do not measure a rank's memory.
    """
    port = free_port()
    envs = [
        rank_env(rank, world_size, port) | {"PYTHONFAULTHANDLER": "1"} | (extra_env or {})
        for rank in range(max(world_size, 1))
    ]
    with tempfile.TemporaryDirectory(prefix="ranks-") as folder:
        outputs = [(Path(folder) / f"{rank}.out", Path(folder) / f"{rank}.err") for rank in range(len(envs))]
        with contextlib.ExitStack() as stack:
            procs = _fork(argv, envs, outputs, Path(folder), stack) if forked else _start(argv, envs, outputs)
            stopped = _wait(procs, time.monotonic() + timeout)
        results = []
        for rank, (proc, streams) in enumerate(zip(procs, outputs, strict=True)):
            result = RankResult(argv, proc.returncode, *(p.read_text(errors="replace") for p in streams))
            result.stopped = rank in stopped
            results.append(result)
    return results


def _start(argv: list[str], envs: list[dict], outputs: list[tuple[Path, Path]]) -> list[subprocess.Popen]:
    procs = []
    for env, (out, err) in zip(envs, outputs, strict=True):
        with open(out, "w") as out_file, open(err, "w") as err_file:
            procs.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    cwd=REPO,
                    stdout=out_file,
                    stderr=err_file,
                    start_new_session=True,
                    # a pytest killed from outside (a CI timeout) takes its ranks with it
                    preexec_fn=die_with_parent,
                )
            )
    return procs


class _ForkedRank:
    """A rank forked by the zygote: what ``_wait`` and ``_end`` ask of a ``Popen``, by pid (our own processes)."""

    def __init__(self, pid: int, codes: dict[int, int], ended: threading.Condition):
        self.pid, self._codes, self._ended = pid, codes, ended

    @property
    def returncode(self) -> int | None:
        return self._codes.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        with self._ended:
            if not self._ended.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
        return self.returncode


def _fork(
    argv: list[str], envs: list[dict], outputs: list[tuple[Path, Path]], folder: Path, stack: contextlib.ExitStack
) -> list[_ForkedRank]:
    spec = folder / "zygote.json"
    ranks = [{"env": env, "out": str(out), "err": str(err)} for env, (out, err) in zip(envs, outputs, strict=True)]
    spec.write_text(json.dumps({"argv": argv, "ranks": ranks}))
    zygote = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.zygote", str(spec)],
        env=envs[0],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=stack.enter_context((folder / "zygote.err").open("w")),
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    stack.callback(zygote.wait)
    line = zygote.stdout.readline()
    if not line:
        zygote.wait()
        raise AssertionError(f"the zygote exited {zygote.returncode}: {(folder / 'zygote.err').read_text()[-3000:]}")
    codes: dict[int, int] = {}
    ended = threading.Condition()

    def read_ends() -> None:
        for end in zygote.stdout:
            pid, code = map(int, end.split())
            with ended:
                codes[pid] = code
                ended.notify_all()

    threading.Thread(target=read_ends, daemon=True).start()
    return [_ForkedRank(pid, codes, ended) for pid in json.loads(line)]


def _wait(procs: list[subprocess.Popen], deadline: float) -> set[int]:
    """Wait until every rank has exited, one has failed, or the deadline; end the rest. Returns the
    ranks the harness ended."""
    try:
        while None in (codes := [proc.poll() for proc in procs]):  # a list: every rank polled
            if any(code not in (None, 0) for code in codes):
                return _end(procs)
            if time.monotonic() > deadline:
                ended = {rank for rank, proc in enumerate(procs) if proc.poll() is None}
                for rank in ended:
                    procs[rank].send_signal(signal.SIGABRT)  # faulthandler prints the stacks
                with contextlib.suppress(subprocess.TimeoutExpired):
                    for rank in ended:
                        procs[rank].wait(timeout=10)
                return ended | _end(procs)
            time.sleep(0.1)
        return set()
    finally:
        _end(procs)  # also on an interrupt or the test's own timeout: no rank is left behind


def _end(procs: list[subprocess.Popen]) -> set[int]:
    """Kill the ranks still running (only our own children, by pid); returns them."""
    running = {rank for rank, proc in enumerate(procs) if proc.poll() is None}
    for rank in running:
        procs[rank].kill()
        procs[rank].wait()
    return running


def spawn_ok(
    argv: list[str], world_size: int, timeout: float, extra_env: dict | None = None, forked: bool = False
) -> list[RankResult]:
    """``spawn``, failing the test with the stderr of the rank that failed first (every rank's when
    the job timed out: their stacks) unless every rank exits 0."""
    results = spawn(argv, world_size, timeout, extra_env, forked)
    failed = [(rank, r) for rank, r in enumerate(results) if r.returncode != 0]
    if not failed:
        return results
    first = [(rank, r) for rank, r in failed if not r.stopped]
    if first:
        rank, result = first[0]
        raise AssertionError(
            f"{world_size}-rank job failed: rank {rank} exited {result.returncode}:\n{result.stderr[-3000:]}"
        )
    stacks = "\n".join(f"--- rank {rank}:\n{r.stderr[-3000:]}" for rank, r in failed)
    raise AssertionError(f"{world_size}-rank job timed out after {timeout:.0f}s; where each rank was:\n{stacks}")


def run_layouts(
    out_dir: Path,
    world_size: int,
    base: list[str],
    layouts: dict[str, list[str]],
    timeout: float = 270,
    count_comms: bool = False,
) -> dict[str, list[dict]]:
    """Train every layout in one job of ``world_size`` ranks; results per layout, per rank
    (``count_comms``: step 2 runs under CommDebugMode, see ``_worker.reduction_stats``)."""
    spec = json.dumps({"base": base, "layouts": layouts, "count_comms": count_comms})
    spawn_ok([sys.executable, str(WORKER), str(out_dir), spec], world_size, timeout, forked=True)
    return {name: [torch.load(out_dir / f"{name}.rank{r}.pt") for r in range(max(world_size, 1))] for name in layouts}
