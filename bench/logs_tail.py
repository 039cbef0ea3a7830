"""Memory of ``distlaunch logs JOB --tail N`` on a large output, against ``distlaunch jobs`` in the same run.

    python bench/logs_tail.py [--mib 200] [--tail 2]

A detached job of 2 ranks writes about ``--mib`` MiB of 100-byte lines; then ``logs --tail`` and ``logs
--tail --rank 1`` read it, and ``distlaunch jobs`` (which reads no output) gives the reference peak. Each
command's peak RSS comes from the kernel (``ru_maxrss`` of that child, from ``wait4``). Goal: ``logs --tail`` peaks
near the reference whatever the output's size (it streams the file and keeps the last N lines).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITER = "import sys\nline = 'x' * 90\nfor i in range(int(sys.argv[1])):\n    print(f'{i:>9} {line}')\n"


def cli(*args: str, env: dict) -> tuple[str, float]:
    """Run the real CLI: its stdout, and its own peak RSS in MiB (``wait4`` reports that one child's)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-m", "distlaunch", *args], stdout=out, stderr=out, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    if proc.returncode != 0:
        raise SystemExit(f"distlaunch {' '.join(args)} exited {proc.returncode}: {text[-500:]}")
    return text, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=200, help="output to write, in MiB (default 200)")
    parser.add_argument("--tail", type=int, default=2, help="lines to ask for (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="distlaunch-bench-logs-") as tmp:
        env = {**os.environ, "DISTLAUNCH_STATE_DIR": str(Path(tmp) / "state"), "NO_COLOR": "1"}
        script = Path(tmp) / "writer.py"
        script.write_text(WRITER)
        lines = args.mib * 2**20 // 2 // 110  # per rank: its prefix and line make about 110 bytes
        started, _ = cli("run", "-n", "2", "--detach", "--json", str(script), str(lines), env=env)
        job = json.loads(started)["job_id"]
        while json.loads(cli("status", job, "--json", env=env)[0])["state"] in ("starting", "running"):
            time.sleep(0.5)
        size = sum(f.stat().st_size for f in (Path(tmp) / "state" / "jobs" / job).glob("*.log")) / 2**20
        _, reference = cli("jobs", env=env)
        rows = []
        for extra in ((), ("--rank", "1")):
            shown, peak = cli("logs", job, "--tail", str(args.tail), *extra, env=env)
            assert len(shown.splitlines()) == args.tail, shown[-500:]
            rows.append((" ".join(("logs --tail", str(args.tail), *extra)), peak))
    print(f"output: {size:.0f} MiB in the job's folder; reference (distlaunch jobs): {reference:.0f} MiB peak RSS")
    for name, peak in rows:
        print(
            f"{name:<24} {peak:6.0f} MiB peak RSS   {peak / reference:5.2f}x the reference   {peak / size:5.2f}x the output"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
