"""Goodput under faults: what each fault costs a `distlaunch train` job with a spare, and torchrun beside it.

    python bench/goodput.py [--steps 40]        # root: the dead-host fault adds an iptables rule

Starts a private sshd on 127.0.0.11-13 (tests/fixtures/sshd.py): node1 and node2 run the job (one rank each,
dp=2, the tiny model, a checkpoint every 5 steps) and node3 is the spare (`--nnodes 2:2`). One job per fault,
each injected into rank 1 / node2 around step 12:

- crash: the rank exits (fault.kind=crash); the same hosts restart;
- dead host: every process of node2 is killed (its sshd session, agent and rank) and its SSH port is rejected
  by iptables; node3 takes its place;
- frozen host: every process of node2 is stopped (SIGSTOP); the heartbeats miss, node3 takes its place;
- hang: the rank stops at a step (fault.kind=hang); --hang-timeout stops the job, the same hosts restart;
- slow rank: the rank computes 3x slower from step 5 (fault.kind=slow); --on-straggler replace.

For each: the detection time, the recovery time (detection to the first step after recovery), the steps lost
(recomputed since the last checkpoint) and the job's ETTR, from the job's own report (--json). Then the same
crash, and a rank killed by SIGKILL, on one machine with 2 processes of a miniature loop (bench/scripts/steps.py:
gloo all-reduces, a checkpoint every 5 steps), under `distlaunch run --max-restarts 1` and `torchrun
--max-restarts 1`: the wall time each fault added to a clean run, measured for each tool in this run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the test fixtures (a real sshd) import as in the suite: from the repository root and from tests/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixtures.sshd import SSHD, start_sshd

from distlaunch.contract.endpoint import free_port
from tests.helpers import descendants

NODE2 = "127.0.0.12"
FAULT_STEP = 12
RECOVERY_GOAL_S = 30.0
SLOW_STEPS = 90
STEPS_SCRIPT = Path(__file__).resolve().parent / "scripts" / "steps.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "PYTHONWARNINGS": "ignore"}


def engine_sets(steps: int, ckpt: Path, *extra: str) -> list[str]:
    sets = [
        "model.preset='tiny'",
        f"train.steps={steps}",
        "train.global_batch_size=4",
        "train.seq_len=32",
        f"checkpoint.dir='{ckpt}'",
        "checkpoint.every=5",
        *extra,
    ]
    return [arg for s in sets for arg in ("--set", s)]


def last_step(metrics: Path) -> int:
    steps = [json.loads(line).get("step", 0) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return max(steps, default=0)


def sshd_sessions(cluster, address: str) -> list[int]:
    """The test sshd's per-connection processes serving ``address`` (by the sockets they hold), and everything
    they started there: all of that host's processes."""
    want = "".join(f"{int(o):02X}" for o in reversed(address.split("."))) + f":{cluster.port:04X}"
    inodes = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:] if line.split()[1] == want}
    found = []
    for pid in descendants(cluster.pid):
        with contextlib.suppress(OSError):
            if os.path.realpath(f"/proc/{pid}/exe") != SSHD:
                continue
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            if any(f"socket:[{inode}]" in links for inode in inodes):
                found.append(pid)
    return [*found, *(p for pid in found for p in descendants(pid))]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_host(cluster) -> list[int]:
    """node2 dies: its SSH port rejects connections, and every process it runs is killed."""
    rule = ["INPUT", "-d", NODE2, "-p", "tcp", "--dport", str(cluster.port), "-j", "REJECT"]
    subprocess.run(["iptables", "-I", *rule], check=True)
    signal_all(sshd_sessions(cluster, NODE2), signal.SIGKILL)
    return rule


def freeze_host(cluster) -> list[int]:
    """node2 freezes: every process it runs is stopped."""
    pids = sshd_sessions(cluster, NODE2)
    signal_all(pids, signal.SIGSTOP)
    return pids


def train_job(cluster, tmp: Path, name: str, steps: int, faults: list[str], flags: list[str], act) -> dict:
    """One `distlaunch train` job on node1+node2 with node3 spare; ``act(cluster)`` runs once the job passed
    step FAULT_STEP (or never, when None). The job's --json report."""
    folder = tmp / name
    folder.mkdir()
    hostfile = cluster.write_hostfile(folder / "hosts", 3, slots=1)
    metrics = folder / "metrics.jsonl"
    cmd = [
        *["distlaunch", "train", "-H", str(hostfile), "--nnodes", "2:2", "--ssh-config", str(cluster.ssh_config)],
        *[
            "--json",
            "--grace-period",
            "2",
            "--heartbeat-timeout",
            "6",
            "--max-restarts",
            "2",
            "--env",
            "OMP_NUM_THREADS",
        ],
        *["--metrics-file", str(metrics), *flags, *engine_sets(steps, folder / "ckpt", *faults)],
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=folder)
    undo = None
    try:
        if act is not None:
            while last_step(metrics) < FAULT_STEP and proc.poll() is None:
                time.sleep(0.2)
            undo = act(cluster)
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        if act is kill_host and undo:
            subprocess.run(["iptables", "-D", *undo], check=False)
        if act is freeze_host and undo:
            signal_all(undo, signal.SIGKILL)  # the frozen host's processes: ours (under our sshd), never resumed
    if not out.strip():
        raise SystemExit(f"{name}: no report\n{err[-3000:]}")
    report = json.loads(out)
    report["_stderr"] = err
    return report


def local_wall(tool: str, tmp: Path, name: str, steps: int, crash: bool, kill: bool) -> float | None:
    """Wall seconds of a 2-process loop on this machine (bench/scripts/steps.py: gloo all-reduces, a checkpoint
    every 5 steps) under ``tool``, distlaunch or torchrun, each with --max-restarts 1."""
    folder = tmp / f"{tool}-{name}"
    folder.mkdir()
    script = [str(STEPS_SCRIPT), str(folder), str(steps), *(["crash"] if crash else [])]
    if tool == "torchrun":
        # torchrun's static rendezvous on a free port: its c10d one (--standalone) re-forms gloo's mesh on a
        # restart with the dead attempt's addresses here now and then (torch 2.13: "Connection refused")
        port = str(free_port("127.0.0.1"))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--master-port", port, "--nproc-per-node", "2"]
        cmd += ["--max-restarts", "1", *script]
    else:
        cmd = ["distlaunch", "run", "-n", "2", "--max-restarts", "1", "--grace-period", "2", *script]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=folder)
    if kill:
        done = folder / "steps"
        while (not done.exists() or len(done.read_text().split()) < FAULT_STEP) and proc.poll() is None:
            time.sleep(0.05)
        rank1 = [p for p in descendants(proc.pid) if _env_of(p).get("RANK") == "1"]
        signal_all(rank1, signal.SIGKILL)
    code = proc.wait(timeout=900)
    if code != 0:
        print(f"  {tool} {name}: did not recover (exit {code})", flush=True)
        return None
    return time.monotonic() - began


def _env_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the dead-host fault rejects node2's SSH port with iptables")
    crash = ["fault.kind='crash'", "fault.rank=1", f"fault.step={FAULT_STEP}"]
    hang = ["fault.kind='hang'", "fault.rank=1", f"fault.step={FAULT_STEP}"]
    # a straggler is named after 20 slow steps held for 20 more: its job runs longer
    slow = ["fault.kind='slow'", "fault.rank=1", "fault.step=2", "fault.factor=3", f"train.steps={SLOW_STEPS}"]
    cases = [
        ("rank crash", crash, [], None),
        ("dead host", [], [], kill_host),
        ("frozen host", [], [], freeze_host),
        ("hang", hang, ["--hang-timeout", "10"], None),
        ("slow rank", slow, ["--on-straggler", "replace"], None),
    ]
    wall, productive = 0.0, 0.0
    print(f"Goodput: distlaunch train, tiny model, {args.steps} steps, 2 SSH hosts + 1 spare, checkpoint every 5")
    print(
        f"{'fault':<12} {'recovered':>9} {'detection':>10} {'recovery':>9} {'steps lost':>10} {'ETTR':>6}  what happened"
    )
    with tempfile.TemporaryDirectory(prefix="distlaunch-goodput-") as tmp:
        cluster = start_sshd(Path(tmp) / "sshd", nhosts=3)
        try:
            for name, faults, flags, act in cases:
                report = train_job(cluster, Path(tmp), name.replace(" ", "-"), args.steps, faults, flags, act)
                print_row(name, report)
                goodput = report.get("goodput") or {}
                wall += goodput.get("wall_s") or 0.0
                productive += goodput.get("productive_s") or 0.0
        finally:
            cluster.stop()
        print(
            f"all five jobs: ETTR {_pct(productive / wall if wall else None)} ({productive:.1f}s of {wall:.1f}s kept)"
        )
        print("\nOne machine, 2 processes, --max-restarts 1: wall time the fault added to a clean run")
        local = {}
        for tool in ("distlaunch", "torchrun"):
            clean = local_wall(tool, Path(tmp), "clean", args.steps, crash=False, kill=False)
            faulted = [
                local_wall(tool, Path(tmp), "crash", args.steps, crash=True, kill=False),
                local_wall(tool, Path(tmp), "killed", args.steps, crash=False, kill=True),
            ]
            local[tool] = [None if clean is None or t is None else t - clean for t in faulted]
    for index, fault in enumerate(("rank crash", "rank SIGKILL")):
        ours, theirs = local["distlaunch"][index], local["torchrun"][index]
        ratio = f"{ours / theirs:.2f}" if ours is not None and theirs else "-"
        print(f"  {fault:<13} distlaunch {_s(ours):>6}   torchrun {_s(theirs):>6}   ratio {ratio}")


def print_row(name: str, report: dict) -> None:
    """One fault's line: was it recovered, how fast, what it cost."""
    faults = (report.get("goodput") or {}).get("faults") or []
    fault = faults[0] if faults else {}
    recovered = report["exit_code"] == 0 and len(report["attempts"]) > 1
    recovery = sum(fault.get(k) or 0.0 for k in ("stopping_s", "restart_s", "startup_s"))
    ettr = (report.get("goodput") or {}).get("ettr")
    change = report["attempts"][-1]["dropped"] if recovered else {}
    what = fault.get("fault", f"exit {report['exit_code']}") + (f"; replaced {', '.join(change)}" if change else "")
    print(
        f"{name:<12} {'yes' if recovered else 'NO':>9} {_s(fault.get('detection_s')):>10} {_s(recovery):>9} "
        f"{fault.get('recomputed_steps', '-')!s:>10} {_pct(ettr):>6}  {what}",
        flush=True,
    )
    if recovery > RECOVERY_GOAL_S:
        print(f"  recovery {recovery:.1f}s is over the goal of {RECOVERY_GOAL_S:g}s", flush=True)


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


if __name__ == "__main__":
    main()
